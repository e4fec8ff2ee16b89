//! The C worker (`clients/c`) in `--dispatch kernel` (issue 26): it maps
//! the scoreboard, says `K` and serves its own socket, with the real
//! supervisor and real sockets (the cases: `common/kernel_helper_cases.rs`).

#[path = "common/c_worker_build.rs"]
mod c_worker_build;
mod common;
#[path = "common/kernel_helper_cases.rs"]
mod kernel_helper_cases;
#[path = "common/psgi_support.rs"]
mod psgi_support;

use c_worker_build::BuiltWorker;
use kernel_helper_cases::{assert_reconnects_stayed, kernel_pool, SupervisorStopped};
use psgi_support::reconnecting_at_once;

/// Runs `case` on the C worker, compiled for it.
fn with_worker(case: fn(&[&str])) {
    if let Some(worker) = BuiltWorker::new() {
        case(&[worker.command()]);
    }
}

kernel_helper_cases::every_helper_case!(with_worker);

/// A client that reconnects the moment it has the answer, without waiting
/// for the close, lands on the same worker every time: the C worker goes
/// idle just before its answer goes out (`ending_connection`,
/// docs/protocol.md step 7), not after the close. Going idle after the
/// close, the reconnect races the worker's finish and lands on slot 1 (or
/// the overflow). The supervisor stopped.
#[test]
fn a_client_reconnecting_at_once_finds_its_worker_idle() {
    let Some(worker) = BuiltWorker::new() else {
        return;
    };
    let Some(pool) = kernel_pool(2, &[], &[worker.command()]) else {
        return;
    };
    let answers = {
        let _stopped = SupervisorStopped::new(&pool);
        reconnecting_at_once(&pool, 100, b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    };
    assert_reconnects_stayed(&pool, "the C worker", &answers);
}

/// The finish in `kernel_dispatch.c` against a mapped board, without a
/// supervisor (`clients/c/tests/kernel_dispatch_test.c`): a worker at or
/// beyond the dispatch bound (word 5) leaves the overflow alone, one out
/// of descriptors leaves, one that finishes early goes idle before its
/// answer only when nothing waits for it on the overflow, and one past its
/// memory or lifetime limit stays busy, says `X` and waits to be let go;
/// and when it reads `smaps_rollup` (every small case of the rule,
/// modelled runs of connections, a preloaded worker every 100 ms at most).
#[test]
fn the_finish_keeps_to_the_dispatch_width() {
    let Some(cc) = common::require_program("cc", "run bash .ci/deps/system-tools.sh (gcc)") else {
        return;
    };
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../clients/c/tests/kernel_dispatch_test.c");
    let dir = common::temp_path("c-finish");
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("kernel_dispatch_test");
    let built = std::process::Command::new(cc)
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(&source)
        .status()
        .expect("run the C compiler");
    assert!(built.success(), "cc failed on {}", source.display());
    let out = std::process::Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
