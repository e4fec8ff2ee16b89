//! Kernel dispatch's messages path (`G`): a worker that cannot keep its
//! record on the scoreboard says busy and idle in messages, the supervisor
//! moves its record, and the kernel still queues each connection on the
//! lowest idle worker's own socket. With every worker busy, the program
//! spreads connections over their sockets, since the supervisor could hand
//! such workers nothing. The Rust demo worker takes this path when
//! `FORKPOOL_BY_MESSAGES=1` (docs/protocol.md, "The messages path").

mod common;

use std::collections::BTreeMap;
use std::thread;
use std::time::Duration;

use common::{get, total, DemoPool};

const BY_MESSAGES: (&str, &str) = ("FORKPOOL_BY_MESSAGES", "1");

fn pool(children: &str) -> DemoPool {
    DemoPool::start_with(
        &[
            "--dispatch",
            "kernel",
            "--min-children",
            children,
            "--max-children",
            children,
            "--ping-interval",
            "200ms",
            "--ping-timeout",
            "2s",
        ],
        &[BY_MESSAGES],
    )
}

/// Slot → pid of each ready child, and each child's path, from status.
fn slots(pool: &DemoPool) -> BTreeMap<u64, (i64, String)> {
    pool.status()["slots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["slot"].as_u64().unwrap(),
                (
                    s["pid"].as_i64().unwrap(),
                    s["path"].as_str().unwrap_or("").to_string(),
                ),
            )
        })
        .collect()
}

#[test]
fn workers_by_messages_are_shown_so_and_the_lowest_idle_one_serves_each_connection() {
    let pool = pool("3");
    assert!(
        pool.wait_idle(3, Duration::from_secs(10)),
        "{}",
        pool.stderr.dump()
    );
    let seats = slots(&pool);
    assert!(
        seats.values().all(|(_, path)| path == "messages"),
        "{seats:?}"
    );
    let first = seats[&0].0 as i32;
    // One at a time: once the supervisor has read the worker's `I` (its
    // status says so), the worker's record is idle and the kernel gives the
    // next connection to the same, lowest, worker. (A client faster than
    // the supervisor's wake-up may find it still busy: the path's cost.)
    for _ in 0..20 {
        let r = pool.get("/").unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.pid, Some(first), "not the lowest idle worker");
        assert!(pool
            .wait_status(Duration::from_secs(5), |s| s["idle"] == 3)
            .is_some());
    }
    let status = pool
        .wait_status(Duration::from_secs(5), |s| total(s, "accepted") >= 20)
        .expect("the supervisor counts each `B`");
    let served: u64 = status["slots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["served"].as_u64().unwrap())
        .sum();
    assert_eq!(served, 20, "{status}");
    assert_eq!(total(&status, "lost"), 0);
    assert_eq!(status["totals"]["killed_by"]["ping_timeout"], 0, "{status}");
    assert_eq!(status["totals"]["killed_by"]["misbehaved"], 0, "{status}");
}

#[test]
fn with_every_worker_busy_connections_wait_on_their_sockets_in_turn() {
    let pool = pool("2");
    assert!(
        pool.wait_idle(2, Duration::from_secs(10)),
        "{}",
        pool.stderr.dump()
    );
    let seats = slots(&pool);
    let (lowest, next) = (seats[&0].0 as i32, seats[&1].0 as i32);
    let addr = pool.addr;
    // The lowest worker is held long, the other briefly.
    let long = thread::spawn(move || get(addr, "/?work_ms=1500"));
    assert!(pool
        .wait_status(Duration::from_secs(5), |s| s["busy"] == 1)
        .is_some());
    let short = thread::spawn(move || get(addr, "/?work_ms=300"));
    assert!(pool
        .wait_status(Duration::from_secs(5), |s| s["busy"] == 2)
        .is_some());
    // Four more while both are busy: the kernel queues them on the two
    // workers' own sockets in turn. (On the overflow instead, the worker
    // that frees first would have taken all four.)
    let waiting: Vec<_> = (0..4)
        .map(|_| thread::spawn(move || get(addr, "/")))
        .collect();
    let pids: Vec<i32> = waiting
        .into_iter()
        .map(|t| {
            t.join()
                .unwrap()
                .expect("no connection is lost")
                .pid
                .unwrap()
        })
        .collect();
    assert_eq!(long.join().unwrap().unwrap().pid, Some(lowest));
    assert_eq!(short.join().unwrap().unwrap().pid, Some(next));
    let on_lowest = pids.iter().filter(|&&p| p == lowest).count();
    assert_eq!(on_lowest, 2, "spread over both sockets: {pids:?}");
    let status = pool
        .wait_status(Duration::from_secs(5), |s| s["idle"] == 2)
        .unwrap();
    assert_eq!(total(&status, "accepted"), 6, "{status}");
    assert_eq!(total(&status, "lost"), 0);
    assert_eq!(status["totals"]["killed_by"]["misbehaved"], 0, "{status}");
}
