//! Two forkpool pools behind a real HAProxy (Debian's, started by the test
//! on loopback; `bash .ci/deps/haproxy.sh` installs it): both get traffic,
//! and losing one costs no more than what was in flight on it.

mod common;
#[path = "common/haproxy_support.rs"]
mod haproxy_support;

use std::time::Duration;

use common::{kill9, DemoPool};
use haproxy_support::{haproxy_or_skip, Haproxy, Load, Server};

const POOL_ARGS: &[&str] = &["--min-children", "2", "--max-children", "4"];

fn server(name: &str, pool: &DemoPool) -> Server {
    Server {
        name: name.to_string(),
        addr: pool.addr,
    }
}

#[test]
fn sigkill_of_one_supervisor_marks_it_down_and_fails_only_what_was_in_flight() {
    let Some(program) = haproxy_or_skip("sigkill_of_one_supervisor") else {
        return;
    };
    let a = DemoPool::start(POOL_ARGS);
    let b = DemoPool::start(POOL_ARGS);
    let haproxy = Haproxy::start(&program, &[server("pool_a", &a), server("pool_b", &b)], "/");
    let load = Load::start(haproxy.addr, 4, "/?work_ms=20", Duration::from_secs(60));

    // Both pools take their share before anything goes wrong.
    let shared = haproxy.wait_for(Duration::from_secs(20), |s| {
        s.len() == 2 && s.iter().all(|s| s.total >= 30)
    });
    assert!(shared.is_some(), "{:?}", haproxy.servers());

    let _ = a.children(); // remembered, so Drop kills the orphans
    let killed_at = load.elapsed();
    kill9(a.pid);
    let down = haproxy.wait_for(Duration::from_secs(5), |s| {
        s.iter().any(|s| s.name == "pool_a" && s.is_down())
    });
    assert!(
        down.is_some(),
        "HAProxy never marked the killed pool down: {:?}",
        haproxy.servers()
    );
    let down_at = load.elapsed();
    assert!(
        load.wait_more(200, Duration::from_secs(30)),
        "the load stalled after the kill"
    );
    let outcomes = load.finish();
    let failures = outcomes.failures();
    let in_flight = outcomes.in_flight_at(killed_at);
    let in_flight_on_a = in_flight
        .iter()
        .filter(|o| o.server.as_deref() != Some("pool_b"))
        .count();
    println!(
        "sigkill: sent {}, failed {}, pool_a {}, pool_b {}, in flight at the kill {} \
         (not answered by pool_b: {}), marked down after {:?}\n{}",
        outcomes.sent(),
        failures.len(),
        outcomes.served_by("pool_a"),
        outcomes.served_by("pool_b"),
        in_flight.len(),
        in_flight_on_a,
        down_at - killed_at,
        outcomes.timeline(&["pool_a", "pool_b"], Duration::from_millis(250))
    );
    assert!(outcomes.served_by("pool_a") > 0 && outcomes.served_by("pool_b") > 0);
    // A failure is a request that was already in flight on the killed pool:
    // everything sent after the kill was retried or sent elsewhere.
    for f in &failures {
        assert!(
            f.sent <= killed_at,
            "a request sent {:?} after the kill failed: {f:?}",
            f.sent - killed_at
        );
    }
    assert!(
        failures.len() <= in_flight_on_a,
        "{} failed, but only {in_flight_on_a} were in flight on the killed pool",
        failures.len()
    );
    // Once HAProxy marked it down, the other pool answers everything.
    assert_eq!(
        outcomes.served_by_between("pool_a", down_at, Duration::MAX),
        0,
        "requests still reached the dead pool after it was marked down"
    );
}
