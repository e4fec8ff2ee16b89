//! The CPU hold (`--hold-when-cpu-bound`, on by default) tells busy
//! workers that sleep from busy workers that compute: a `--preload` Python
//! pool on one CPU (`taskset`), under a burst of requests that sleep and
//! under clients whose requests compute. Asserted on the pool's totals,
//! not on timings: the time a burst takes is in docs/benchmarks.md.

mod common;

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::{concurrent_gets, require_program, total, DemoPool};

/// Takes this file's turn: its two pools share one CPU, and each would
/// measure the other's load.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// `taskset -c 0 forkpool run --preload ... -- python3 -m forkpool_wsgi
/// sleep_or_compute_app` with the default pool size, or `None` when
/// `taskset` is missing.
fn python_pool_on_one_cpu() -> Option<DemoPool> {
    require_program("taskset", "apt-get install util-linux")?;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut command = std::process::Command::new("taskset");
    command
        .args(["-c", "0"])
        .arg(common::forkpool_bin())
        .arg("run")
        .env("PYTHONPATH", root.join("../../clients/python"));
    let apps = root.join("tests/apps");
    let args = [
        "--preload",
        "--ping-timeout",
        "20s",
        "--retire-grace",
        "60s",
    ];
    let cmd = [
        "python3",
        "-m",
        "forkpool_wsgi",
        "--no-access-log",
        "--chdir",
        apps.to_str().unwrap(),
        "sleep_or_compute_app",
    ];
    let pool = DemoPool::launch(command, &args, &cmd, true);
    assert!(
        pool.wait_idle(2, Duration::from_secs(30)),
        "{}",
        pool.status()
    );
    Some(pool)
}

/// 32 requests at once that each sleep 2 s: the workers busy with them
/// use next to no CPU, whatever they waited for one behind the workers
/// the pool is starting, so the pool is not held for the CPUs: each
/// request gets a worker of its own, and the only holds are the first
/// measurement's (before the busy workers were seen asleep). Before the
/// hold told sleeping workers apart, each worker started made the pool
/// hold for a fresh measurement: three or four holds per worker, over 100
/// for this burst.
#[test]
fn a_burst_of_sleeping_requests_is_not_held_for_the_cpus() {
    let _turn = one_at_a_time();
    let Some(pool) = python_pool_on_one_cpu() else {
        return;
    };
    let before = pool.status();
    let results = concurrent_gets(pool.addr, "/?sleep_ms=2000", 32);
    for r in &results {
        let r = r.as_ref().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.status, 200);
    }
    let status = pool.status();
    let spawned = total(&status, "spawned") - total(&before, "spawned");
    let held = total(&status, "cpu_bound") - total(&before, "cpu_bound");
    assert!(
        spawned >= 30,
        "{spawned} workers started for 32 sleeping requests: {status}"
    );
    assert!(
        held < spawned / 2,
        "held {held} times for the CPUs while {spawned} workers started for \
         requests that sleep: {status}\n{}",
        pool.stderr.dump()
    );
    assert_eq!(total(&status, "died"), 0, "{status}");
}

/// Eight clients whose requests each compute 5 ms, back to back for two
/// seconds, on one CPU: the busy workers take turns on it, and the pool
/// holds rather than start a worker per client (the hold kept). Short
/// requests, so that connections end every few milliseconds: with 20 ms
/// ones on a CPU shared with builds, the pool sometimes grew to 10
/// workers (as it did before sleeping workers were told apart), most
/// likely as for long requests, none having ended for 50 ms
/// (`HOLD_TURNOVER`).
#[test]
fn clients_whose_requests_compute_still_hold_the_pool() {
    let _turn = one_at_a_time();
    let Some(pool) = python_pool_on_one_cpu() else {
        return;
    };
    let started = Instant::now();
    let mut most_live = 0;
    std::thread::scope(|scope| {
        let clients: Vec<_> = (0..8)
            .map(|_| {
                scope.spawn(|| {
                    while started.elapsed() < Duration::from_secs(2) {
                        let r = pool.get("/?cpu_ms=5").unwrap_or_else(|e| panic!("{e}"));
                        assert_eq!(r.status, 200);
                    }
                })
            })
            .collect();
        while !clients.iter().all(|c| c.is_finished()) {
            most_live = most_live.max(pool.children().len());
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    let status = pool.status();
    assert!(
        total(&status, "cpu_bound") > 0,
        "never held: {status}\n{}",
        pool.stderr.dump()
    );
    // The template is a child of the supervisor too.
    assert!(
        most_live <= 6,
        "{most_live} processes for 8 clients that compute on one CPU: {status}"
    );
    assert_eq!(total(&status, "died"), 0, "{status}");
}
