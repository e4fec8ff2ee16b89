//! `--merge-pages`: every child the supervisor starts is marked for the
//! kernel's same-page merging, as the kernel reports it
//! (`/proc/PID/ksm_stat`: `ksm_merge_any: yes`): forked children (the
//! demo), exec'd workers (`forkpool run`) and a `--preload` template's
//! workers. Without it none is, and a reload that turns it on marks the
//! children started after it.

#[path = "common/bench_bins.rs"]
mod bench_bins;
mod common;
#[path = "common/example_workers.rs"]
mod example_workers;

use std::time::{Duration, Instant};

use common::{temp_path, total, DemoPool};
use example_workers::PYTHON_WORKER;

/// How long workers may take to start on a loaded machine.
const START: Duration = Duration::from_secs(30);

/// Whether the kernel merges `pid`'s pages: its `ksm_stat` says so.
fn marked(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/ksm_stat"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/ksm_stat: {e} (a kernel with CONFIG_KSM)"));
    stat.lines().any(|l| l.trim() == "ksm_merge_any: yes")
}

/// The pids of the pool's idle children, once `n` are idle (and none is
/// starting), within [`START`].
fn idle_children(pool: &DemoPool, n: usize) -> Vec<i32> {
    let deadline = Instant::now() + START;
    loop {
        let status = pool.status();
        let pids: Vec<i32> = status["slots"]
            .as_array()
            .expect("status has slots")
            .iter()
            .filter(|s| s["state"] == "idle")
            .map(|s| s["pid"].as_i64().unwrap() as i32)
            .collect();
        if pids.len() >= n && status["starting"] == 0 {
            return pids;
        }
        assert!(
            Instant::now() < deadline,
            "{n} idle children did not come: {status}\n{}",
            pool.stderr.dump()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The pool's supervisor pid, from its status.
fn supervisor(pool: &DemoPool) -> i32 {
    pool.status()["pid"].as_i64().expect("status has the pid") as i32
}

#[test]
fn forked_children_are_marked_with_merge_pages_and_not_without() {
    let pool = DemoPool::start(&["--merge-pages", "--min-children", "2"]);
    let children = idle_children(&pool, 2);
    assert!(marked(supervisor(&pool)));
    for pid in children {
        assert!(marked(pid), "child {pid} not marked");
    }
    drop(pool);
    let plain = DemoPool::start(&["--min-children", "2"]);
    for pid in idle_children(&plain, 2) {
        assert!(!marked(pid), "child {pid} marked without --merge-pages");
    }
    assert!(!marked(supervisor(&plain)));
}

#[test]
fn exec_d_and_preloaded_workers_are_marked() {
    let args = [
        "--merge-pages",
        "--min-children",
        "2",
        "--ping-timeout",
        "20s",
    ];
    let pool = DemoPool::start_run(&args, &["python3", PYTHON_WORKER]);
    for pid in idle_children(&pool, 2) {
        assert!(marked(pid), "exec'd worker {pid} not marked");
    }
    drop(pool);
    let preloaded = [&args[..], &["--preload"]].concat();
    let pool = DemoPool::start_run(&preloaded, &["python3", PYTHON_WORKER]);
    let status = pool.status();
    let template = status["templates"][0]["pid"].as_i64();
    let template = template.unwrap_or_else(|| panic!("a template: {status}")) as i32;
    assert!(marked(template), "template {template} not marked");
    for pid in idle_children(&pool, 2) {
        assert!(marked(pid), "preloaded worker {pid} not marked");
    }
}

#[test]
fn a_reload_that_turns_it_on_marks_the_children_started_after_it() {
    let file = temp_path("merge.toml");
    std::fs::write(&file, "[pool]\nmin_children = 2\n").unwrap();
    let pool = DemoPool::start(&["--config", file.to_str().unwrap()]);
    let before = idle_children(&pool, 2);
    assert!(before.iter().all(|pid| !marked(*pid)));
    std::fs::write(&file, "[pool]\nmin_children = 2\nmerge_pages = true\n").unwrap();
    pool.signal(1);
    let reloaded = pool.wait_status(START, |s| total(s, "reloads") == 1 && s["generation"] == 2);
    assert!(reloaded.is_some(), "{}", pool.stderr.dump());
    let deadline = Instant::now() + START;
    let after = loop {
        let now = idle_children(&pool, 2);
        if now.iter().all(|pid| !before.contains(pid)) {
            break now;
        }
        assert!(Instant::now() < deadline, "the old children stayed");
        std::thread::sleep(Duration::from_millis(20));
    };
    for pid in after {
        assert!(
            marked(pid),
            "child {pid} started after the reload not marked"
        );
    }
    let _ = std::fs::remove_file(&file);
}
