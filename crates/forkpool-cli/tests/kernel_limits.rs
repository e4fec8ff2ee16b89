//! Issue 44: per-connection limits hold under `--dispatch kernel`. There
//! the kernel hands a child its next connection the moment it goes idle on
//! the scoreboard, without the supervisor, so a child past
//! `--max-child-memory` or `--max-child-lifetime` must see so itself after
//! each connection and leave before it goes idle (docs/protocol.md,
//! "Recycling: the parent counts"). The cases (`common/kernel_helper_cases.rs`)
//! stop the supervisor while they send, so nothing else can keep the child
//! from its next connection; here they run on Rust children forked by the
//! supervisor (`forkpool-bench demo --chaos`, `?chaos=grow30`) and on the
//! exec'd example Rust worker. Every helper runs them too (kernel_python.rs,
//! kernel_perl.rs, kernel_ruby.rs, kernel_c.rs).

#[path = "common/bench_bins.rs"]
mod bench_bins;
mod common;
#[path = "common/example_workers.rs"]
mod example_workers;
#[path = "common/kernel_helper_cases.rs"]
mod kernel_helper_cases;

use common::{require_kernel_dispatch, DemoPool};
use example_workers::rust_worker;
use kernel_helper_cases::{lifetime_limit_holds, memory_limit_holds, PATIENCE};

/// `forkpool-bench demo --chaos` in kernel dispatch with `children`
/// children and `extra` options, once all are idle; None (under CI: a
/// failure) where the kernel refuses the eBPF program.
fn demo_pool(children: u64, extra: &[&str]) -> Option<DemoPool> {
    let n = children.to_string();
    let mut args = vec![
        "--chaos",
        "--dispatch",
        "kernel",
        "--min-children",
        &n,
        "--max-children",
        &n,
        "--min-spare",
        "0",
        "--max-spare",
        &n,
        "--ping-timeout",
        "20s",
    ];
    args.extend_from_slice(extra);
    let pool = DemoPool::start_from(&bench_bins::forkpool_bench(), &args, &[]);
    if !require_kernel_dispatch(&pool) {
        return None;
    }
    assert!(
        pool.wait_status(PATIENCE, |s| s["idle"] == children && s["starting"] == 0)
            .is_some(),
        "the children never became idle: {}\n{}",
        pool.status(),
        pool.stderr.dump()
    );
    Some(pool)
}

/// A forked Rust child that grows 30 MiB a request leaves, under a 64 MiB
/// limit, before it could serve a 4th request back to back.
#[test]
fn a_growing_forked_child_leaves_before_another_connection() {
    let grow = format!("/?chaos=grow{}", kernel_helper_cases::GROWTH_MIB);
    memory_limit_holds(demo_pool, &grow);
}

/// A forked Rust child past its lifetime serves at most one more
/// connection.
#[test]
fn an_old_forked_child_leaves_before_another_connection() {
    lifetime_limit_holds(demo_pool);
}

/// The exec'd example Rust worker (`ExecWorker`): it reads its limits
/// from `FORKPOOL_MAX_CHILD_MEMORY`.
#[test]
fn a_growing_exec_worker_leaves_before_another_connection() {
    kernel_helper_cases::a_growing_worker_leaves_before_another_connection(&[rust_worker()]);
}

/// The exec'd example Rust worker: `FORKPOOL_MAX_CHILD_LIFETIME_MS`.
#[test]
fn an_old_exec_worker_leaves_before_another_connection() {
    kernel_helper_cases::an_old_worker_leaves_before_another_connection(&[rust_worker()]);
}

/// Workers forked by the example Rust worker as a template (`--preload`)
/// inherit the limit with its environment.
#[test]
fn a_growing_preloaded_exec_worker_leaves_before_another_connection() {
    kernel_helper_cases::a_growing_preloaded_worker_leaves_before_another_connection(&[
        rust_worker(),
    ]);
}

/// The supervisor does not take a leaving child's word for why it left:
/// Python workers in kernel dispatch that leave after every connection
/// (`worker.leave()`, `X`), far under `--max-child-memory` and young, are
/// counted retired, never as memory or lifetime recycles: the supervisor
/// reads the leaving child's memory and age itself.
#[test]
fn a_worker_that_leaves_under_its_limits_is_not_counted_recycled() {
    let program = common::leaving_python_worker();
    let program_path = program.display().to_string();
    let limits = ["--max-child-memory", "64MiB", "--max-child-lifetime", "60s"];
    let pool = kernel_helper_cases::kernel_pool(1, &limits, &["python3", &program_path]);
    let Some(pool) = pool else {
        return;
    };
    const LEAVES: u64 = 4;
    for i in 0..LEAVES {
        let response = pool.get("/").unwrap_or_else(|e| panic!("request {i}: {e}"));
        assert_eq!(response.status, 200, "request {i}");
    }
    let status = pool
        .wait_status(PATIENCE, |s| {
            common::total(s, "retired") >= LEAVES && s["idle"] == 1
        })
        .unwrap_or_else(|| panic!("{LEAVES} workers did not leave: {}", pool.status()));
    assert_eq!(common::total(&status, "recycled_memory"), 0, "{status}");
    assert_eq!(common::total(&status, "recycled_lifetime"), 0, "{status}");
    kernel_helper_cases::assert_clean(&status);
    let _ = std::fs::remove_file(program);
}
