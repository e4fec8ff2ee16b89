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
