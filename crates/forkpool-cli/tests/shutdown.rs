//! Stopping: graceful on TERM and INT, immediate on a second INT or QUIT.

mod common;

use std::time::{Duration, Instant};

use common::{concurrent_gets, DemoPool};

fn graceful_stop_finishes_in_flight_requests(signal: i32) {
    let mut pool = DemoPool::start(&["--min-children", "3"]);
    let addr = pool.addr;
    let load = std::thread::spawn(move || concurrent_gets(addr, "/?work_ms=800", 3));
    assert!(pool
        .stderr
        .wait_for_count("connection handed off", 3, Duration::from_secs(5)));
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
    assert!(pool
        .stdout
        .wait_for("forkpool: totals", Duration::from_secs(2)));
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
        .stderr
        .wait_for("connection handed off", Duration::from_secs(5)));
    let started = Instant::now();
    pool.signal(2);
    assert!(pool
        .stderr
        .wait_for("shutting down", Duration::from_secs(5)));
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
}

#[test]
fn shutdown_timeout_kills_stragglers() {
    let mut pool = DemoPool::start(&["--min-children", "1", "--shutdown-timeout", "300ms"]);
    let addr = pool.addr;
    let load = std::thread::spawn(move || concurrent_gets(addr, "/?work_ms=5000", 1));
    assert!(pool
        .stderr
        .wait_for("connection handed off", Duration::from_secs(5)));
    pool.signal(15);
    let status = pool
        .wait_exit(Duration::from_secs(5))
        .expect("exits after the timeout");
    assert!(status.success());
    assert!(
        pool.stderr
            .wait_for("did not exit within", Duration::from_secs(2)),
        "{}",
        pool.stderr.dump()
    );
    assert!(load.join().unwrap()[0].is_err());
}
