//! Stopping: graceful on TERM and INT, immediate on a second INT or QUIT.

mod common;

use std::time::{Duration, Instant};

use common::{concurrent_gets, final_totals, killed_by, total, DemoPool};

fn graceful_stop_finishes_in_flight_requests(signal: i32) {
    let mut pool = DemoPool::start(&["--min-children", "3"]);
    let addr = pool.addr;
    let load = std::thread::spawn(move || concurrent_gets(addr, "/?work_ms=800", 3));
    assert!(pool
        .wait_status(Duration::from_secs(5), |s| s["busy"] == 3)
        .is_some());
    let children = pool.children();
    pool.signal(signal);
    let results = load.join().unwrap();
    for r in &results {
        assert_eq!(r.as_ref().expect("in-flight request completes").status, 200);
    }
    let status = pool
        .wait_exit(Duration::from_secs(10))
        .expect("supervisor exits");
    assert!(status.success(), "{status:?}");
    // Every child was told to quit and left on its own.
    let totals = final_totals(&pool);
    assert_eq!(
        total(&totals, "retired"),
        total(&totals, "spawned"),
        "{totals}"
    );
    assert_eq!(total(&totals, "killed"), 0, "{totals}");
    assert_eq!(total(&totals, "died"), 0, "{totals}");
    for pid in children {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "child {pid} left behind"
        );
    }
}

#[test]
fn sigterm_is_graceful() {
    graceful_stop_finishes_in_flight_requests(15);
}

#[test]
fn sigint_is_graceful() {
    graceful_stop_finishes_in_flight_requests(2);
}

#[test]
fn second_sigint_stops_at_once() {
    let mut pool = DemoPool::start(&["--min-children", "2"]);
    let addr = pool.addr;
    let load = std::thread::spawn(move || concurrent_gets(addr, "/?work_ms=5000", 1));
    assert!(pool
        .wait_status(Duration::from_secs(5), |s| s["busy"] == 1)
        .is_some());
    let started = Instant::now();
    pool.signal(2);
    // The first INT took: the busy child has been told to quit, and the
    // idle ones, told the same, are gone (on a loaded machine they may
    // take a moment: only the busy one is to be cut by the second INT).
    assert!(pool
        .wait_status(Duration::from_secs(5), |s| s["busy"] == 0
            && s["idle"] == 0
            && s["starting"] == 0
            && s["leaving"] == 1)
        .is_some());
    pool.signal(2);
    let status = pool
        .wait_exit(Duration::from_secs(5))
        .expect("exits quickly");
    assert!(status.success());
    assert!(started.elapsed() < Duration::from_secs(4));
    assert!(
        load.join().unwrap()[0].is_err(),
        "the in-flight request was cut"
    );
    let totals = final_totals(&pool);
    assert_eq!(killed_by(&totals, "immediate_stop"), 1, "{totals}");
}

#[test]
fn shutdown_timeout_kills_stragglers() {
    let mut pool = DemoPool::start(&["--min-children", "1", "--shutdown-timeout", "300ms"]);
    let addr = pool.addr;
    let load = std::thread::spawn(move || concurrent_gets(addr, "/?work_ms=5000", 1));
    assert!(pool
        .wait_status(Duration::from_secs(5), |s| s["busy"] == 1)
        .is_some());
    pool.signal(15);
    let status = pool
        .wait_exit(Duration::from_secs(5))
        .expect("exits after the timeout");
    assert!(status.success());
    let totals = final_totals(&pool);
    assert_eq!(killed_by(&totals, "stop_timeout"), 1, "{totals}");
    assert!(load.join().unwrap()[0].is_err());
}
