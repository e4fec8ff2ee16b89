//! The pool's size follows the load.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{concurrent_gets, total, DemoPool};

#[test]
fn starts_with_min_children() {
    let pool = DemoPool::start(&[
        "--min-children",
        "3",
        "--min-spare",
        "1",
        "--max-spare",
        "8",
    ]);
    assert!(pool.wait_idle(3, Duration::from_secs(5)));
    assert_eq!(pool.children().len(), 3);
    assert_eq!(
        total(&pool.status(), "spawned"),
        3,
        "{}",
        pool.stderr.dump()
    );
}

/// A pool of 2 to 16 children with one or two spare.
const TWO_TO_SIXTEEN: [&str; 8] = [
    "--min-children",
    "2",
    "--max-children",
    "16",
    "--min-spare",
    "1",
    "--max-spare",
    "2",
];

#[test]
fn grows_under_load_then_shrinks_back() {
    let mut args = TWO_TO_SIXTEEN.to_vec();
    args.extend(["--retire-grace", "200ms"]);
    let pool = DemoPool::start(&args);
    assert!(pool.wait_children(Duration::from_secs(5), |n| n == 2));
    let started = Instant::now();
    let results = concurrent_gets(pool.addr, "/?work_ms=1500", 12);
    let elapsed = started.elapsed();
    let mut slots = BTreeSet::new();
    for r in &results {
        let r = r.as_ref().expect("every request succeeds");
        assert_eq!(r.status, 200);
        slots.insert(r.slot.unwrap());
    }
    // Twelve 1.5 s requests finishing in well under two rounds means they ran
    // side by side, one child each.
    assert_eq!(slots.len(), 12, "slots used: {slots:?}");
    assert!(elapsed < Duration::from_millis(2900), "took {elapsed:?}");
    // After the load: idle surplus retired down to max_spare (2) idle.
    assert!(
        pool.wait_children(Duration::from_secs(10), |n| n <= 2),
        "pool did not shrink: {} children\n{}",
        pool.children().len(),
        pool.stderr.dump()
    );
    let status = pool
        .wait_status(Duration::from_secs(5), |s| total(s, "retired") >= 10)
        .unwrap_or_else(|| panic!("{}", pool.status()));
    assert_eq!(total(&status, "killed"), 0, "{status}");
}

#[test]
fn at_max_children_connections_queue_and_one_warning_is_logged() {
    let pool = DemoPool::start(&[
        "--min-children",
        "1",
        "--max-children",
        "2",
        "--min-spare",
        "1",
        "--max-spare",
        "2",
    ]);
    let started = Instant::now();
    let results = concurrent_gets(pool.addr, "/?work_ms=400", 6);
    let elapsed = started.elapsed();
    assert!(results
        .iter()
        .all(|r| r.as_ref().is_ok_and(|r| r.status == 200)));
    let pids: BTreeSet<i32> = results
        .iter()
        .map(|r| r.as_ref().unwrap().pid.unwrap())
        .collect();
    assert!(pids.len() <= 2, "never more than two children: {pids:?}");
    // Six 400 ms requests through two children take three rounds.
    assert!(elapsed >= Duration::from_millis(1150), "took {elapsed:?}");
    assert!(total(&pool.status(), "saturated") >= 1);
    // One warning, not one per connection: the log line is the feature.
    assert_eq!(
        pool.stderr.count("reached max-children=2"),
        1,
        "{}",
        pool.stderr.dump()
    );
}

/// Workers that take 0.3 s of CPU to start (`tests/apps/slow_start_app.py`
/// under `forkpool_wsgi`), on two CPUs (`taskset`), under 32 clients that
/// ask without pause from the moment the pool is up: no more workers start
/// at once than there are CPUs. Forking the 14 the backlog asks for at
/// once would only make each ready later, while they take the CPUs from
/// the busy ones.
#[test]
fn no_more_workers_start_at_once_than_there_are_cpus() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut command = std::process::Command::new("taskset");
    command
        .args(["-c", "0,1"])
        .arg(common::forkpool_bin())
        .arg("run")
        .env("PYTHONPATH", root.join("../../clients/python"));
    let apps = root.join("tests/apps");
    let mut args = TWO_TO_SIXTEEN.to_vec();
    args.extend(["--ping-timeout", "20s"]);
    let cmd = [
        "python3",
        "-m",
        "forkpool_wsgi",
        "--no-access-log",
        "--chdir",
        apps.to_str().unwrap(),
        "slow_start_app",
    ];
    let pool = DemoPool::launch(command, &args, &cmd, true);
    let cpus = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(2);
    let run_for = Duration::from_secs(3);
    let started = Instant::now();
    let (mut most_starting, mut most_live) = (0, 0);
    std::thread::scope(|scope| {
        let clients: Vec<_> = (0..32)
            .map(|_| {
                scope.spawn(|| {
                    while started.elapsed() < run_for {
                        let r = pool.get("/").unwrap_or_else(|e| panic!("{e}"));
                        assert_eq!(r.status, 200);
                    }
                })
            })
            .collect();
        while !clients.iter().all(|c| c.is_finished()) {
            let status = pool.status();
            most_starting = most_starting.max(status["starting"].as_u64().unwrap_or(0));
            most_live = most_live.max(pool.children().len());
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    let status = pool.status();
    assert!(
        most_starting <= cpus as u64,
        "{most_starting} workers started at once on {cpus} CPUs: {status}"
    );
    assert!(most_live > 2, "the pool never grew: {status}");
    assert_eq!(total(&status, "died"), 0, "{status}");
}
