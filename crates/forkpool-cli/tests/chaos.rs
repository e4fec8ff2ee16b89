//! A kill storm under load: SIGKILL on a worker every 200 ms while 12
//! clients make 20 ms requests. A worker that had said `Ready` has
//! started, so its death is replaced at once (within the replacement rate
//! limit) and never feeds the start-up back-off: the pool stays up, serves
//! nearly its undisturbed rate, fails no more requests than children were
//! killed, and is back within its bounds at once when the kills stop.
//!
//! `chaos_run_keeps_the_pool_serving` is the short run CI can afford, and
//! `chaos_run_keeps_a_preloaded_pool_serving` the same with every worker
//! forked from a template (`--preload`, the example Rust worker, which
//! `cargo build -p forkpool-bench` builds). The full 30 s run of issue 24
//! is `chaos_run_of_30_seconds` (ignored: run it with `--ignored
//! --nocapture` to read its figures).

#[path = "common/bench_bins.rs"]
mod bench_bins;
mod common;
#[path = "common/example_workers.rs"]
mod example_workers;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{get, DemoPool};

/// The pool of the chaos run.
const POOL: [&str; 8] = [
    "--min-children",
    "4",
    "--min-spare",
    "4",
    "--max-spare",
    "8",
    "--max-children",
    "32",
];
const MIN_CHILDREN: u64 = 4;
const CLIENTS: usize = 12;
const REQUEST: &str = "/?work_ms=20";
const KILL_EVERY: Duration = Duration::from_millis(200);
/// How often the pool's size is sampled between kills.
const SAMPLE_EVERY: Duration = Duration::from_millis(40);
/// How long the pool may take to be back within bounds after the kills.
const RECOVERY: Duration = Duration::from_secs(5);

/// Takes this file's turn: two of its tests at once would measure each
/// other's load.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// What one chaos run measured.
#[derive(Debug)]
struct Figures {
    /// Requests answered 200 with no kills, in the same duration.
    undisturbed: u64,
    /// Requests answered 200 during the kills.
    served: u64,
    /// Requests that failed during the kills.
    failed: u64,
    /// Workers SIGKILLed.
    killed: u64,
    /// The fewest live (starting, idle or busy) children a sample saw.
    min_live: u64,
    /// Status samples taken during the kills.
    samples: u64,
    /// From the last kill until `min_children` were ready again; `None`
    /// if that took longer than [`RECOVERY`].
    back_within_bounds: Option<Duration>,
}

impl Figures {
    fn served_share(&self) -> f64 {
        self.served as f64 / self.undisturbed.max(1) as f64
    }
}

/// `CLIENTS` threads making requests back to back until `stop`, counting
/// answers (200) and failures (anything else, or no answer).
struct Load {
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Load {
    fn start(pool: &DemoPool) -> Load {
        let ok = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let addr = pool.addr;
        let threads = (0..CLIENTS)
            .map(|_| {
                let (ok, failed, stop) = (ok.clone(), failed.clone(), stop.clone());
                std::thread::spawn(move || {
                    // A bound of its own, whatever happens to `stop`.
                    let deadline = Instant::now() + Duration::from_secs(120);
                    while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                        match get(addr, REQUEST) {
                            Ok(r) if r.status == 200 => ok.fetch_add(1, Ordering::SeqCst),
                            _ => failed.fetch_add(1, Ordering::SeqCst),
                        };
                    }
                })
            })
            .collect();
        Load {
            ok,
            failed,
            stop,
            threads,
        }
    }

    /// Tells the clients to make no new request.
    fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Stops the clients and waits for them: (served, failed).
    fn finish(self) -> (u64, u64) {
        self.stop();
        for t in self.threads {
            t.join().unwrap();
        }
        (
            self.ok.load(Ordering::SeqCst),
            self.failed.load(Ordering::SeqCst),
        )
    }
}

/// Live children in a status snapshot: starting, idle or busy.
fn live(status: &serde_json::Value) -> u64 {
    ["starting", "idle", "busy"]
        .iter()
        .map(|k| status[k].as_u64().unwrap_or(0))
        .sum()
}

/// Ready children in a status snapshot: idle or busy.
fn ready(status: &serde_json::Value) -> u64 {
    ["idle", "busy"]
        .iter()
        .map(|k| status[k].as_u64().unwrap_or(0))
        .sum()
}

/// The workers of a snapshot that may be killed: live slots with a pid.
fn workers(status: &serde_json::Value) -> Vec<i32> {
    status["slots"]
        .as_array()
        .map(|slots| {
            slots
                .iter()
                .filter(|s| matches!(s["state"].as_str(), Some("starting" | "idle" | "busy")))
                .filter_map(|s| s["pid"].as_i64())
                .filter(|pid| *pid > 0)
                .map(|pid| pid as i32)
                .collect()
        })
        .unwrap_or_default()
}

/// A small deterministic generator (xorshift), so a run needs no crate.
fn next_random(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// SIGKILLs `pid`; whether the signal was delivered.
fn sigkill(pid: i32) -> bool {
    Command::new("kill")
        .args(["-9", &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Which pool the run starts.
#[derive(Debug, Clone, Copy)]
enum Pool {
    /// `forkpool demo`.
    Demo,
    /// `forkpool run --preload` of the example Rust worker: every worker
    /// is forked from a template.
    Preloaded,
}

/// How the storm picks its victims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Victims {
    /// A random worker each time, as in the run.
    Random,
    /// A random worker and the youngest, in turn: a short run then
    /// surely hits workers in their first second, as a random pick does
    /// only now and then.
    RandomAndYoungest,
}

/// A fresh pool of the chaos run, with `min_children` ready.
fn fresh_pool(kind: Pool) -> DemoPool {
    let pool = match kind {
        Pool::Demo => DemoPool::start(&POOL),
        Pool::Preloaded => {
            let mut args = vec!["--preload"];
            args.extend(POOL);
            DemoPool::start_run(&args, &[example_workers::rust_worker()])
        }
    };
    assert!(
        pool.wait_status(Duration::from_secs(10), |s| ready(s) >= MIN_CHILDREN)
            .is_some(),
        "{}",
        pool.stderr.dump()
    );
    pool
}

/// Runs the chaos scenario for `duration`: the undisturbed rate first,
/// then the same load with a worker killed every [`KILL_EVERY`]. Each
/// part has a fresh pool, so both start from `min_children` and grow
/// with the load the same way.
fn chaos(kind: Pool, victims: Victims, duration: Duration) -> Figures {
    let _turn = one_at_a_time();
    let undisturbed_pool = fresh_pool(kind);
    let load = Load::start(&undisturbed_pool);
    std::thread::sleep(duration);
    let (undisturbed, undisturbed_failed) = load.finish();
    assert_eq!(undisturbed_failed, 0, "requests failed with no kills");
    drop(undisturbed_pool);

    let pool = fresh_pool(kind);
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    // When each worker pid was first seen, to find the youngest.
    let mut first_seen: HashMap<i32, Instant> = HashMap::new();
    let load = Load::start(&pool);
    let started = Instant::now();
    let mut next_kill = started + KILL_EVERY;
    let (mut killed, mut samples, mut min_live) = (0u64, 0u64, u64::MAX);
    while started.elapsed() < duration {
        // A status that fails to answer is a sample lost, not a pass.
        let status = pool.status();
        samples += 1;
        min_live = min_live.min(live(&status));
        let now = Instant::now();
        for pid in workers(&status) {
            first_seen.entry(pid).or_insert(now);
        }
        // The kills that are due, up to two a sample, so a machine slow
        // to answer the status (a sample every 300 ms under load) still
        // gets the storm's rate, a kill every KILL_EVERY, without a
        // stall's worth of kills at once.
        let mut due = 0;
        while now >= next_kill {
            next_kill += KILL_EVERY;
            due += 1;
        }
        // Only the supervisor's own children, never the supervisor.
        let mut candidates: Vec<i32> = if due > 0 {
            let children = pool.children();
            workers(&status)
                .into_iter()
                .filter(|pid| *pid != pool.pid && children.contains(pid))
                .collect()
        } else {
            Vec::new()
        };
        for _ in 0..due.min(2) {
            let victim = if victims == Victims::RandomAndYoungest && killed % 2 == 1 {
                candidates.iter().copied().max_by_key(|pid| first_seen[pid])
            } else if candidates.is_empty() {
                None
            } else {
                let i = next_random(&mut seed) % candidates.len() as u64;
                Some(candidates[i as usize])
            };
            if let Some(victim) = victim {
                killed += u64::from(sigkill(victim));
                candidates.retain(|pid| *pid != victim);
            }
        }
        std::thread::sleep(SAMPLE_EVERY);
    }
    let kills_ended = Instant::now();
    load.stop();
    let back = pool
        .wait_status(RECOVERY, |s| ready(s) >= MIN_CHILDREN)
        .map(|_| kills_ended.elapsed());
    let (served, failed) = load.finish();
    let figures = Figures {
        undisturbed,
        served,
        failed,
        killed,
        min_live,
        samples,
        back_within_bounds: back,
    };
    eprintln!(
        "chaos {kind:?} {victims:?} {duration:?}: served {} of {} undisturbed ({:.0}%), failed {} with {} killed, \
         fewest live children {} in {} samples, back within bounds after {:?}",
        figures.served,
        figures.undisturbed,
        figures.served_share() * 100.0,
        figures.failed,
        figures.killed,
        figures.min_live,
        figures.samples,
        figures.back_within_bounds,
    );
    figures
}

fn check(f: &Figures) {
    assert!(f.killed >= 10, "too few kills to be a storm: {f:?}");
    assert!(f.min_live > 0, "the pool was at 0 live children: {f:?}");
    assert!(
        f.failed <= f.killed,
        "more requests failed than children were killed: {f:?}"
    );
    assert!(
        f.served_share() >= 0.8,
        "served under 80% of the undisturbed rate: {f:?}"
    );
    assert!(
        f.back_within_bounds.is_some(),
        "not back to min_children ready within {RECOVERY:?} of the last kill: {f:?}"
    );
}

#[test]
fn chaos_run_keeps_the_pool_serving() {
    check(&chaos(
        Pool::Demo,
        Victims::RandomAndYoungest,
        Duration::from_secs(7),
    ));
}

/// The same rule for workers forked from a template (`--preload`).
#[test]
fn chaos_run_keeps_a_preloaded_pool_serving() {
    check(&chaos(
        Pool::Preloaded,
        Victims::RandomAndYoungest,
        Duration::from_secs(7),
    ));
}

/// The default `max_spawn_rate`: replacements of workers that had started
/// a second, beyond a burst as large.
const MAX_SPAWN_RATE: u64 = 32;

/// A worker that says `Ready` and then dies on every request is no
/// start-up failure, so only the replacement rate bounds its forks: over
/// `L` seconds, at most `max_spawn_rate × (L + 1)` beyond the
/// `max_children` the pool may hold (see `policy::backoff`).
#[test]
fn a_worker_that_dies_on_every_request_is_replaced_within_the_rate() {
    const MAX_CHILDREN: u64 = 8;
    const SPAN: Duration = Duration::from_secs(3);
    let _turn = one_at_a_time();
    let max = MAX_CHILDREN.to_string();
    let pool = DemoPool::start_from(
        &bench_bins::forkpool_bench(),
        &["--chaos", "--min-children", "2", "--max-children", &max],
        &[],
    );
    let before = common::total(&pool.status(), "spawned");
    let from = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let addr = pool.addr;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(60);
                let mut crashed = 0u64;
                while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                    // Each answer is a dead worker (or a refused connection).
                    crashed += u64::from(get(addr, "/?chaos=exit").is_err());
                }
                crashed
            })
        })
        .collect();
    std::thread::sleep(SPAN);
    let during = common::total(&pool.status(), "spawned") - before;
    // Both status reads count: the span is a little over SPAN.
    let span = from.elapsed();
    stop.store(true, Ordering::SeqCst);
    let crashed: u64 = clients.into_iter().map(|c| c.join().unwrap()).sum();
    let bound = (MAX_SPAWN_RATE as f64 * (span.as_secs_f64() + 1.0)).ceil() as u64 + MAX_CHILDREN;
    eprintln!("crash loop: {during} forks in {span:?} (bound {bound}), {crashed} requests died");
    assert!(
        during <= bound,
        "{during} forks in {span:?}, above the bound of {bound}"
    );
    // It is replaced all the same, and the pool is whole once the
    // crashing requests stop.
    assert!(during >= 2 * MAX_SPAWN_RATE, "{during} forks: not replaced");
    assert!(
        pool.wait_status(RECOVERY, |s| ready(s) >= 2).is_some(),
        "{}",
        pool.stderr.dump()
    );
}

/// The full run of issue 24 (a random worker each time), too long for CI.
#[test]
#[ignore]
fn chaos_run_of_30_seconds() {
    check(&chaos(Pool::Demo, Victims::Random, Duration::from_secs(30)));
}
