//! A graceful stop serves the connections already queued in the listen
//! backlog before the listeners close (`serve_backlog_on_stop`).

mod common;

use std::io::Read;
use std::time::{Duration, Instant};

use common::{send, DemoPool};

/// Two children busy on slow requests (`work_ms` each), six more queued
/// behind them in the backlog, then TERM: answers for all eight, or the
/// failures.
fn burst_then_term(extra: &[&str], work_ms: u32) -> Vec<String> {
    let mut args = vec![
        "--min-children",
        "2",
        "--max-children",
        "2",
        "--min-spare",
        "0",
        "--shutdown-timeout",
        "30s",
    ];
    args.extend_from_slice(extra);
    let mut pool = DemoPool::start(&args);
    let slow = format!("/?work_ms={work_ms}");
    let mut conns: Vec<_> = (0..2).map(|_| send(pool.addr, &slow)).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while pool.status()["busy"].as_u64() != Some(2) {
        assert!(Instant::now() < deadline, "the two children never got busy");
        std::thread::sleep(Duration::from_millis(20));
    }
    // `connect` returns once a connection is in the backlog.
    conns.extend((0..6).map(|_| send(pool.addr, "/")));
    pool.signal(15);
    let failures = conns
        .into_iter()
        .filter_map(|mut c| {
            let mut raw = String::new();
            match c.read_to_string(&mut raw) {
                Ok(_) if raw.starts_with("HTTP/1.1 200") => None,
                Ok(_) => Some(format!("answer {raw:?}")),
                Err(e) => Some(format!("read: {e}")),
            }
        })
        .collect();
    assert!(
        pool.wait_exit(Duration::from_secs(40)).is_some(),
        "the pool stops once the backlog is served"
    );
    failures
}

#[test]
fn a_burst_queued_behind_a_saturated_pool_is_answered_on_term() {
    let failures = burst_then_term(&[], 1500);
    assert!(failures.is_empty(), "lost on TERM: {failures:?}");
}

#[test]
fn turned_off_the_backlog_is_left_unanswered() {
    // The children must still be busy when the supervisor acts on the TERM
    // (else, finishing, they may take the queued ones themselves): on a
    // loaded machine that can take a while, so they are held longer.
    let failures = burst_then_term(&["--no-serve-backlog-on-stop"], 5000);
    assert!(
        !failures.is_empty(),
        "without serve_backlog_on_stop the queued connections are reset"
    );
}
