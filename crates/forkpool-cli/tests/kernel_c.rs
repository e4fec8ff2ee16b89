//! The C worker (`clients/c`) in `--dispatch kernel` (issue 26): it maps
//! the scoreboard, says `K` and serves its own socket, with the real
//! supervisor and real sockets (the cases: `common/kernel_helper_cases.rs`).

#[path = "common/c_worker_build.rs"]
mod c_worker_build;
mod common;
#[path = "common/kernel_helper_cases.rs"]
mod kernel_helper_cases;

use c_worker_build::BuiltWorker;

/// Runs `case` on the C worker, compiled for it.
fn with_worker(case: fn(&[&str])) {
    if let Some(worker) = BuiltWorker::new() {
        case(&[worker.command()]);
    }
}

kernel_helper_cases::every_helper_case!(with_worker);

/// The finish in `kernel_dispatch.c` against a mapped board, without a
/// supervisor (`clients/c/tests/kernel_dispatch_test.c`): a worker at or
/// beyond the dispatch bound (word 5) leaves the overflow alone.
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
