//! The C worker (`clients/c`) in `--dispatch kernel` (issue 26): it maps
//! the scoreboard, says `K` and serves its own socket, with the real
//! supervisor and real sockets (the cases: `common/kernel_helper_cases.rs`).

#[path = "common/c_worker_build.rs"]
mod c_worker_build;
mod common;
#[path = "common/kernel_helper_cases.rs"]
mod kernel_helper_cases;

use c_worker_build::BuiltWorker;

#[test]
fn sequential_requests_all_go_to_slot_zero() {
    let Some(worker) = BuiltWorker::new() else {
        return;
    };
    kernel_helper_cases::sequential_requests_all_go_to_slot_zero(&[worker.command()]);
}

#[test]
fn a_burst_lands_one_request_per_idle_worker() {
    let Some(worker) = BuiltWorker::new() else {
        return;
    };
    kernel_helper_cases::a_burst_lands_one_request_per_idle_worker(&[worker.command()]);
}

#[test]
fn a_killed_worker_loses_nothing_queued_on_its_socket() {
    let Some(worker) = BuiltWorker::new() else {
        return;
    };
    kernel_helper_cases::a_killed_worker_loses_nothing_queued_on_its_socket(&[worker.command()]);
}

#[test]
fn workers_leave_after_their_share_and_nothing_is_lost() {
    let Some(worker) = BuiltWorker::new() else {
        return;
    };
    kernel_helper_cases::workers_leave_after_their_share_and_nothing_is_lost(&[worker.command()]);
}

#[test]
fn quit_serves_what_was_queued_on_the_own_socket() {
    let Some(worker) = BuiltWorker::new() else {
        return;
    };
    kernel_helper_cases::quit_serves_what_was_queued_on_the_own_socket(&[worker.command()]);
}
