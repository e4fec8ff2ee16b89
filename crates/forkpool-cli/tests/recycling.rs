//! Recycling end to end: `--max-requests-jitter` spreads the retirements of
//! children started together, and `--max-child-lifetime` replaces children
//! after their lifetime without failing a request; a worker that says it
//! is leaving is let go without a word.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{concurrent_gets, total, DemoPool};

/// Children in the fixed pool of the jitter test.
const POOL: usize = 4;

/// The pids in the status snapshot's slots, with their states.
fn slots(status: &serde_json::Value) -> Vec<(i32, String)> {
    status["slots"]
        .as_array()
        .expect("status has slots")
        .iter()
        .map(|s| {
            (
                s["pid"].as_i64().unwrap() as i32,
                s["state"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// Polls status until all `POOL` slots hold an idle child, for at most 10 s.
fn all_idle(pool: &DemoPool) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = slots(&pool.status());
        if s.len() == POOL && s.iter().all(|(_, state)| state == "idle") {
            return s.into_iter().map(|(pid, _)| pid).collect();
        }
        assert!(
            Instant::now() < deadline,
            "the pool did not come back to {POOL} idle children: {s:?}\n{}",
            pool.stderr.dump()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs a fixed pool of `POOL` children, each retired after 2 connections
/// plus a jitter of 0..=`jitter`, under a paced load: rounds at least
/// 1.2 s apart, each round waiting for every child to be idle and then
/// sending one slow request per child (they overlap, so each child takes
/// exactly one). Returns, for each first-generation child, the time of
/// its last response (it retires right after it) since the first round.
fn retirement_times(jitter: u64) -> Vec<Duration> {
    let jitter_arg = jitter.to_string();
    let pool = DemoPool::start_with(
        &[
            "--min-children",
            "4",
            "--max-children",
            "4",
            "--max-requests-per-child",
            "2",
            "--max-requests-jitter",
            &jitter_arg,
        ],
        // Seed 2 draws the jitters 1, 3, 6 and 8 for the first four children.
        &[("FORKPOOL_JITTER_SEED", "2")],
    );
    let first = all_idle(&pool);
    let start = Instant::now();
    let mut last_seen: HashMap<i32, Duration> = HashMap::new();
    let deadline = start + Duration::from_secs(40);
    let mut round = 0u32;
    loop {
        let current = all_idle(&pool);
        if first.iter().all(|p| !current.contains(p)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "first-generation children {first:?} not all retired in 40 s; now {current:?}"
        );
        let pace = start + Duration::from_millis(1200) * round;
        if let Some(wait) = pace.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        round += 1;
        let answers = concurrent_gets(pool.addr, "/?work_ms=400", POOL);
        let mut pids = Vec::new();
        for a in answers {
            let r = a.expect("a request failed");
            assert_eq!(r.status, 200, "{}", r.body);
            let pid = r.pid.expect("the demo names its pid");
            pids.push(pid);
            last_seen.insert(pid, start.elapsed());
        }
        pids.sort_unstable();
        pids.dedup();
        assert_eq!(pids.len(), POOL, "a round was not spread over the pool");
    }
    drop(pool);
    let mut times: Vec<Duration> = first.iter().map(|p| last_seen[p]).collect();
    times.sort_unstable();
    times
}

/// With a fixed seed and a steady load, no two children retire within the
/// same second; without jitter the same load retires them all together.
#[test]
fn jitter_spreads_retirements_over_seconds() {
    let spread = retirement_times(8);
    eprintln!("retirements with jitter 8: {spread:?}");
    for pair in spread.windows(2) {
        assert!(
            pair[1] - pair[0] >= Duration::from_secs(1),
            "two children retired within a second: {spread:?}"
        );
    }
    let together = retirement_times(0);
    eprintln!("retirements without jitter: {together:?}");
    assert!(
        together[POOL - 1] - together[0] < Duration::from_secs(1),
        "without jitter the children should retire together: {together:?}"
    );
}

/// `--max-child-lifetime 2s`: each child is replaced after about 2 s (plus
/// up to a tenth at random, plus the once-a-second check), with no failed
/// request under a light load.
#[test]
fn lifetime_replaces_children_without_failing_requests() {
    let pool = DemoPool::start(&[
        "--min-children",
        "2",
        "--max-children",
        "2",
        "--max-child-lifetime",
        "2s",
    ]);
    let started = Instant::now();
    let first: Vec<i32> = slots(&pool.status()).into_iter().map(|s| s.0).collect();
    assert_eq!(first.len(), 2);
    let mut gone: HashMap<i32, Duration> = HashMap::new();
    let mut failures = Vec::new();
    let mut ok = 0u32;
    let deadline = started + Duration::from_secs(15);
    while gone.len() < first.len() && Instant::now() < deadline {
        match pool.get("/?work_ms=5") {
            Ok(r) if r.status == 200 => ok += 1,
            Ok(r) => failures.push(format!("status {}", r.status)),
            Err(e) => failures.push(e),
        }
        let live = pool.children();
        for p in &first {
            if !live.contains(p) {
                gone.entry(*p).or_insert_with(|| started.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let totals = pool.status()["totals"].clone();
    drop(pool);
    eprintln!("first children gone after {gone:?}; {ok} requests served");
    assert!(failures.is_empty(), "failed requests: {failures:?}");
    assert_eq!(
        gone.len(),
        first.len(),
        "children {first:?} not replaced within 15 s (gone: {gone:?})"
    );
    for (pid, at) in &gone {
        // The pool was ready before `started`, so a child is at least this
        // old when it goes; 2 s + 0.2 s jitter + a 1 s check + slack above.
        assert!(
            *at >= Duration::from_millis(1000) && *at <= Duration::from_secs(6),
            "child {pid} replaced after {at:?}, not about 2 s"
        );
    }
    assert!(
        totals["recycled_lifetime"].as_u64().unwrap_or(0) >= 2,
        "totals: {totals}"
    );
}

/// A worker that asks to leave after each connection (`X`), as the Python
/// helper's `worker.leave()` does, exits at once: the supervisor must send
/// it nothing more. A `Q` sent after its `X` found the channel closed and
/// got it killed as `channel_failed` (9 of 12 recycles before the fix).
#[test]
fn a_worker_that_says_it_is_leaving_is_sent_nothing_more() {
    let program = common::leaving_python_worker();
    let program_path = program.display().to_string();
    let pool = DemoPool::start_run(&common::ONE_CHILD, &["python3", &program_path]);
    const RECYCLES: u64 = 12;
    for i in 0..RECYCLES {
        let response = pool.get("/").unwrap_or_else(|e| panic!("request {i}: {e}"));
        assert_eq!(response.status, 200, "request {i}");
    }
    let status = pool
        .wait_status(Duration::from_secs(20), |s| {
            total(s, "retired") >= RECYCLES && s["idle"] == 1
        })
        .unwrap_or_else(|| panic!("{RECYCLES} workers did not leave: {}", pool.status()));
    assert_eq!(
        total(&status, "killed"),
        0,
        "a leaving worker was killed: {status}"
    );
    assert_eq!(total(&status, "died"), 0, "{status}");
    let _ = std::fs::remove_file(program);
}
