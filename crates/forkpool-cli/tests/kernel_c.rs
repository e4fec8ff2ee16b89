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

#[test]
fn sequential_requests_all_go_to_slot_zero() {
    with_worker(kernel_helper_cases::sequential_requests_all_go_to_slot_zero);
}

#[test]
fn a_burst_lands_one_request_per_idle_worker() {
    with_worker(kernel_helper_cases::a_burst_lands_one_request_per_idle_worker);
}

#[test]
fn a_killed_worker_loses_nothing_queued_on_its_socket() {
    with_worker(kernel_helper_cases::a_killed_worker_loses_nothing_queued_on_its_socket);
}

#[test]
fn workers_leave_after_their_share_and_nothing_is_lost() {
    with_worker(kernel_helper_cases::workers_leave_after_their_share_and_nothing_is_lost);
}

#[test]
fn quit_serves_what_was_queued_on_the_own_socket() {
    with_worker(kernel_helper_cases::quit_serves_what_was_queued_on_the_own_socket);
}

#[test]
fn idle_workers_answer_pings() {
    with_worker(kernel_helper_cases::idle_workers_answer_pings);
}
