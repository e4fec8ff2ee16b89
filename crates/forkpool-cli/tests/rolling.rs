//! Reloads that roll: a deploy of broken worker code leaves the serving
//! generation in place, and start-up failures back off.

mod common;
#[path = "common/worker_files.rs"]
mod worker_files;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{continuous_load, DemoPool};
use worker_files::{good_app, wait_status, Scratch};

/// The same file after a bad deploy: it does not even compile.
fn broken_app() -> String {
    format!("{}\ndef broken(:\n", good_app())
}

/// `forkpool run` of the Python file `app` with exactly three children.
fn three_children(app: &str) -> DemoPool {
    let args = [
        "--dispatch",
        "handoff",
        "--min-children",
        "3",
        "--max-children",
        "3",
        "--ping-timeout",
        "20s",
    ];
    DemoPool::start_run(&args, &["python3", app])
}

/// Waits (bounded) until the load has had `n` more successful requests.
fn wait_served(ok: &AtomicUsize, n: usize, what: &str) {
    let before = ok.load(Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(30);
    while ok.load(Ordering::SeqCst) < before + n {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn slot_generations(status: &serde_json::Value) -> Vec<u64> {
    status["slots"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["state"] != "retiring" && s["state"] != "killed")
        .map(|s| s["generation"].as_u64().unwrap())
        .collect()
}

#[test]
fn a_reload_to_broken_code_keeps_the_old_generation_serving_then_fixed_code_rolls() {
    let dir = Scratch::new("rolling-app");
    dir.deploy("app.py", &good_app());
    let app = dir.path("app.py");
    // A fixed size: no child of generation 1 is started after the bad
    // file is in place (it would read it too).
    let pool = three_children(&app);
    assert!(pool.wait_children(Duration::from_secs(30), |n| n >= 3));
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, handles) = continuous_load(pool.addr, 2, Arc::clone(&stop));
    // The load runs until the end; stop it on the way out, even on panic.
    struct StopLoad(Arc<AtomicBool>);
    impl Drop for StopLoad {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let _stop_load = StopLoad(Arc::clone(&stop));

    dir.deploy("app.py", &broken_app());
    pool.signal(libc::SIGHUP);
    let failed = wait_status(&pool, Duration::from_secs(30), |s| {
        s["totals"]["reload_failures"] == 1
    });
    assert_eq!(failed["generation"], 1, "{failed}");
    assert_eq!(failed["serving_generation"], 1, "{failed}");
    // The failed generation is cleaned up and generation 1 is whole.
    let whole = wait_status(&pool, Duration::from_secs(30), |s| {
        let gens = slot_generations(s);
        gens.len() >= 3 && gens.iter().all(|g| *g == 1)
    });
    wait_served(&ok, 50, "generation 1 stopped serving");
    let later = pool.status();
    assert_eq!(later["serving_generation"], 1, "{later}");
    assert!(slot_generations(&later).iter().all(|g| *g == 1), "{later}");
    // One canary was tried and died; nothing kept starting the bad code.
    assert_eq!(
        later["totals"]["died"],
        1,
        "{later}\n{}",
        pool.stderr.dump()
    );
    assert_eq!(whole["totals"]["died"], 1, "{whole}");
    // Telling the operator which generation serves is the feature: checked
    // after the state.
    assert!(
        pool.stderr.count("generation 1 keeps serving") >= 1,
        "{}",
        pool.stderr.dump()
    );

    dir.deploy("app.py", &good_app());
    pool.signal(libc::SIGHUP);
    let rolled = wait_status(&pool, Duration::from_secs(30), |s| {
        let gens = slot_generations(s);
        s["serving_generation"] == 3 && !gens.is_empty() && gens.iter().all(|g| *g == 3)
    });
    assert_eq!(rolled["totals"]["reload_failures"], 1, "{rolled}");
    wait_served(&ok, 50, "generation 3 does not serve");
    stop.store(true, Ordering::SeqCst);
    let failures: Vec<String> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    assert_eq!(
        failures,
        Vec::<String>::new(),
        "failed requests across the reloads"
    );
}

/// The example worker, except that it exits at once while the file
/// `fail` exists beside it.
fn app_failing_while(flag: &str) -> String {
    format!(
        "import os, sys\nif os.path.exists({flag:?}):\n    \
         sys.stderr.write('refusing to start\\n')\n    sys.exit(3)\n{}",
        good_app()
    )
}

#[test]
fn start_up_failures_back_off_while_healthy_siblings_serve() {
    let dir = Scratch::new("backoff-app");
    let flag = dir.path("fail");
    dir.deploy("app.py", &app_failing_while(&flag));
    let app = dir.path("app.py");
    let pool = three_children(&app);
    assert!(pool.wait_children(Duration::from_secs(30), |n| n == 3));
    let victim = pool.children()[0];
    // The siblings prove their start (ready and a second old) first.
    std::thread::sleep(Duration::from_millis(1200));
    dir.deploy("fail", "");
    common::kill9(victim);
    let start = wait_status(&pool, Duration::from_secs(10), |s| {
        s["totals"]["died"].as_u64() >= Some(2)
    });
    // Count the start attempts in a fixed window. Without a back-off
    // that grows, each replacement follows the last death by ~100 ms plus
    // Python's start-up: some 25-40 in 6 s. Doubling from 100 ms allows 7.
    let window = Duration::from_secs(6);
    let t0 = Instant::now();
    let mut served = 0;
    while t0.elapsed() < window {
        if pool.get("/").is_ok_and(|r| r.status == 200) {
            served += 1;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let end = pool.status();
    let spawned = |s: &serde_json::Value| s["totals"]["spawned"].as_u64().unwrap();
    let attempts = spawned(&end) - spawned(&start);
    assert!(
        attempts <= 9,
        "{attempts} start attempts in {window:?}: no back-off\n{end}"
    );
    assert!(attempts >= 2, "the failing slot was not retried: {end}");
    assert!(
        served > 20,
        "the healthy siblings stopped serving ({served})"
    );
    let live = slot_generations(&end).len();
    assert!(live >= 2, "{end}");
}
