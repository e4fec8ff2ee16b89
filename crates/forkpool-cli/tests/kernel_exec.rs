//! `forkpool run --dispatch kernel`: exec'd workers get their slot's own
//! socket, the overflow and the scoreboard (docs/protocol.md, "kernel
//! dispatch"), and a worker that does not keep the board (it says `R`)
//! is still served, as in `handoff`. Real supervisor, real workers.

#[path = "common/bench_bins.rs"]
mod bench_bins;
mod common;
#[path = "common/example_workers.rs"]
mod example_workers;
#[path = "common/kernel_helper_cases.rs"]
mod kernel_helper_cases;

use std::time::Duration;

use common::{scrape_metrics, total, DemoPool};
use example_workers::rust_worker;
use kernel_helper_cases::kernel_pool;

/// `clients/tests/handoff_only_worker.py`: says `R`, knows no board.
const HANDOFF_ONLY_WORKER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../clients/tests/handoff_only_worker.py"
);

/// A `forkpool run` pool in kernel dispatch of `children` workers running
/// `cmd`, with metrics (`common/kernel_helper_cases.rs`'s start-up).
fn kernel_run(children: u64, extra: &[&str], cmd: &[&str]) -> Option<DemoPool> {
    let mut args = vec!["--metrics", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    kernel_pool(children, &args, cmd)
}

/// The slots' accept counts on the board reach the totals: every
/// connection taken by the workers themselves, none handed.
#[test]
fn an_exec_worker_keeps_the_board_and_slot_zero_stays_hot() {
    let Some(pool) = kernel_run(3, &[], &[rust_worker()]) else {
        return;
    };
    let mut slots = Vec::new();
    for _ in 0..30 {
        let r = pool.get("/").expect("request");
        assert_eq!(r.status, 200);
        slots.push(r.slot.expect("slot header"));
    }
    assert_eq!(slots, vec![0; 30], "{}", pool.stderr.dump());
    let status = pool
        .wait_status(Duration::from_secs(5), |s| s["slots"][0]["served"] == 30)
        .unwrap_or_else(|| panic!("slot 0 never showed 30 served: {}", pool.status()));
    assert_eq!(total(&status, "accepted"), 30, "{status}");
    assert!(status.get("dispatch_fallback").is_none(), "{status}");
    // Status says which path each child is on.
    for slot in status["slots"].as_array().unwrap() {
        assert_eq!(slot["path"], "board", "{status}");
    }
    // Each connection came from the kernel, none through the supervisor.
    let metrics = scrape_metrics(&pool);
    assert!(
        metrics.contains("forkpool_dispatch_latency_seconds_count 0"),
        "{metrics}"
    );
}

/// A worker that says `R` in kernel dispatch never touches the board; the
/// supervisor takes every connection from the overflow and hands it over.
#[test]
fn a_worker_that_does_not_keep_the_board_is_served_as_in_handoff() {
    let python = "python3";
    let Some(pool) = kernel_run(2, &[], &[python, HANDOFF_ONLY_WORKER]) else {
        return;
    };
    let mut slots = Vec::new();
    for _ in 0..10 {
        let r = pool.get("/").expect("request");
        assert_eq!((r.status, r.body.as_str()), (200, "hello\n"));
        slots.push(r.slot.expect("slot header"));
    }
    assert_eq!(slots, vec![0; 10], "{}", pool.stderr.dump());
    let status = pool
        .wait_status(Duration::from_secs(5), |s| s["slots"][0]["served"] == 10)
        .unwrap_or_else(|| panic!("slot 0 never showed 10 served: {}", pool.status()));
    assert_eq!(total(&status, "killed"), 0, "{status}");
    assert_eq!(total(&status, "died"), 0, "{status}");
    // The fallback is visible, per child.
    for slot in status["slots"].as_array().unwrap() {
        assert_eq!(slot["path"], "handoff", "{status}");
    }
    // Each one handed by the supervisor, from the overflow.
    let metrics = scrape_metrics(&pool);
    assert!(
        metrics.contains("forkpool_dispatch_latency_seconds_count 10"),
        "{metrics}"
    );
}

/// An exec'd worker is not told `max_requests_per_child`: the supervisor
/// reads what it served on the board and sends `Q`; nothing is refused.
#[test]
fn an_exec_worker_is_recycled_by_the_count_on_the_board() {
    let Some(pool) = kernel_run(1, &["--max-requests-per-child", "5"], &[rust_worker()]) else {
        return;
    };
    let mut pids = Vec::new();
    for _ in 0..20 {
        let r = pool.get("/").expect("request");
        assert_eq!(r.status, 200);
        pids.push(r.pid.unwrap());
    }
    pids.dedup();
    assert!(pids.len() >= 3, "20 requests, 5 a worker: {pids:?}");
    let status = pool.status();
    assert_eq!(total(&status, "died"), 0, "{status}");
    assert_eq!(total(&status, "killed"), 0, "{status}");
}

/// `--preload`: a worker forked by the template says `K` and is sent its
/// slot's socket and the board (`S`, docs/protocol.md); then it is a
/// kernel dispatch worker like any other, recycled by its share.
#[test]
fn a_worker_forked_by_a_template_is_sent_its_socket_and_the_board() {
    let Some(pool) = kernel_run(
        3,
        &["--preload", "--max-requests-per-child", "10"],
        &[rust_worker()],
    ) else {
        return;
    };
    let mut slots = Vec::new();
    let mut pids = Vec::new();
    for _ in 0..30 {
        let r = pool.get("/").expect("request");
        assert_eq!(r.status, 200);
        slots.push(r.slot.expect("slot header"));
        pids.push(r.pid.unwrap());
    }
    // Slot 0 until its worker has served its share; its replacement is
    // still being forked when the next connection comes.
    assert_eq!(slots[..10], [0; 10], "{slots:?}\n{}", pool.stderr.dump());
    // No worker serves past its share (without it, slot 0's would serve
    // all 30 until the supervisor's reading caught up).
    let mut per_pid = std::collections::BTreeMap::new();
    for pid in &pids {
        *per_pid.entry(pid).or_insert(0) += 1;
    }
    assert!(per_pid.values().all(|&n| n <= 10), "{per_pid:?}");
    assert!(per_pid.len() >= 3, "{per_pid:?}");
    // The workers took their connections themselves. A connection the
    // kernel queued on a worker's own socket as that worker left is handed
    // on by the supervisor (docs/protocol.md): at most one per departure.
    let metrics = scrape_metrics(&pool);
    let handed: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("forkpool_dispatch_latency_seconds_count "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no dispatch latency count: {metrics}"));
    let status = pool.status();
    let left = total(&status, "retired");
    assert!(
        handed <= left,
        "{handed} handed for {left} departures: {metrics}"
    );
    assert_eq!(total(&status, "died"), 0, "{status}");
    assert_eq!(total(&status, "killed"), 0, "{status}");
}

/// The Rust helper (`run_child_speaking`, under the example worker) leaves
/// before a leaking handler fills its descriptor table, in kernel dispatch
/// and in handoff (`common/kernel_helper_cases.rs`).
#[test]
fn a_leaking_rust_worker_leaves_before_its_table_fills() {
    kernel_helper_cases::a_leaking_worker_leaves_before_its_table_fills(&[rust_worker()]);
}

#[test]
fn a_leaking_rust_worker_leaves_before_its_table_fills_in_handoff() {
    kernel_helper_cases::a_leaking_worker_leaves_before_its_table_fills_in_handoff(
        &[rust_worker()],
    );
}
