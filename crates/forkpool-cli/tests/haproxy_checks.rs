//! Issue 44: a real load balancer's checks. Two `forkpool demo` pools in
//! `kernel` dispatch (the default) behind a real HAProxy whose servers have
//! plain TCP health checks every 100 ms (`check inter 100ms`: HAProxy
//! connects and closes, a connection that never sends a byte) and an agent
//! check on each pool's `--agent` port every 100 ms:
//!
//! - under load no request fails and both pools serve;
//! - a pool whose children are all busy (slow requests sent straight to
//!   it) gets at most a tenth of new requests: the agent says it is full
//!   even though the TCP checks' connections come and go (before the fix
//!   they held kernel-dispatch reservations, the agent said `up ready
//!   75%` and HAProxy sent the saturated pool 12 of 40);
//! - `TERM` to one pool under load, with a drain delay, fails nothing.
//!
//! HAProxy comes from `bash .ci/deps/haproxy.sh`; kernel dispatch needs
//! root (or `CAP_BPF`) on Linux 5.12+. Without either the tests say `NOT
//! RUN` and return, and fail under `CI=true`. The tests take turns (one
//! lock), so their timings do not disturb each other. Alone:
//! `cargo test -p forkpool-cli --test haproxy_checks -- --nocapture`.

mod common;
#[path = "common/haproxy_support.rs"]
mod haproxy_support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use common::{parse_response, require_kernel_dispatch, DemoPool};
use haproxy_support::{report, require_haproxy, Check, Haproxy, Load, Server};

/// Every server's health check: a TCP connect every 100 ms.
const TCP_CHECK: Check = Check::Tcp { inter_ms: 100 };

/// A pool that may grow to 4 children, answering the agent check.
const POOL_ARGS: &[&str] = &[
    "--min-children",
    "2",
    "--max-children",
    "4",
    "--agent",
    "127.0.0.1:0",
];

/// One test at a time: each starts two pools and an HAProxy and measures
/// shares and timings on a small machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The agent address a pool started with `--agent 127.0.0.1:0` printed.
fn agent_addr(pool: &DemoPool) -> SocketAddr {
    const PREFIX: &str = "forkpool: agent check on ";
    assert!(
        pool.stdout.wait_for(PREFIX, Duration::from_secs(10)),
        "no agent address:\n{}",
        pool.stdout.dump()
    );
    pool.stdout
        .dump()
        .lines()
        .find_map(|l| l.strip_prefix(PREFIX))
        .and_then(|a| a.trim().parse().ok())
        .expect("agent address")
}

/// What the pool's agent answers now (one line), as HAProxy reads it.
fn agent_says(pool: &DemoPool) -> String {
    let read = || -> std::io::Result<String> {
        let mut s = TcpStream::connect_timeout(&agent_addr(pool), Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        let mut line = String::new();
        s.read_to_string(&mut line)?;
        Ok(line.trim().to_string())
    };
    read().unwrap_or_else(|e| format!("(no answer: {e})"))
}

/// `forkpool demo ARGS`, or `None` when kernel dispatch is not in force
/// (the test returns; under CI it has failed).
fn kernel_pool(args: &[&str]) -> Option<DemoPool> {
    let pool = DemoPool::start(args);
    require_kernel_dispatch(&pool).then_some(pool)
}

fn server(name: &str, pool: &DemoPool) -> Server {
    Server {
        name: name.to_string(),
        addr: pool.addr,
        agent_port: Some(agent_addr(pool).port()),
    }
}

/// HAProxy in front of `a` (`pool_a`) and `b` (`pool_b`) with TCP checks
/// and agent checks, once both are UP and their TCP checks pass (`L4OK`:
/// a connect, not an HTTP check).
fn behind_haproxy(program: &Path, a: &DemoPool, b: &DemoPool, balance: &str) -> Haproxy {
    let servers = [server("pool_a", a), server("pool_b", b)];
    let haproxy = Haproxy::start_with(program, &servers, TCP_CHECK, balance);
    let deadline = Instant::now() + Duration::from_secs(5);
    for name in ["pool_a", "pool_b"] {
        loop {
            let check = haproxy.server_column(name, "check_status");
            if check.as_deref() == Some("L4OK") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{name}'s health check is not a passing TCP check: {check:?}\n{}",
                haproxy.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    haproxy
}

/// Both pools' status, for reports: served per slot and connections the
/// kernel picked a child for that never reached it (`totals.abandoned`:
/// the TCP checks' connections among them).
fn pools_line(a: &DemoPool, b: &DemoPool) -> String {
    let line = |name: &str, pool: &DemoPool| match pool.try_status() {
        Ok(s) => {
            let served: Vec<_> = s["slots"]
                .as_array()
                .map(|slots| slots.iter().map(|s| s["served"].clone()).collect())
                .unwrap_or_default();
            format!(
                "{name}: served per slot {served:?}, abandoned {}, dispatch {}",
                s["totals"]["abandoned"], s["dispatch"]
            )
        }
        Err(e) => format!("{name}: {e}"),
    };
    format!("{}; {}", line("pool_a", a), line("pool_b", b))
}

#[test]
fn under_load_with_tcp_checks_nothing_fails_and_both_pools_serve() {
    let _turn = one_at_a_time();
    let Some(program) = require_haproxy() else {
        return;
    };
    let Some(a) = kernel_pool(POOL_ARGS) else {
        return;
    };
    let Some(b) = kernel_pool(POOL_ARGS) else {
        return;
    };
    let haproxy = behind_haproxy(&program, &a, &b, "leastconn");
    let load = Load::start(haproxy.addr, 4, "/?work_ms=10", Duration::from_secs(10));
    while load.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let outcomes = load.finish();
    report("under load", &outcomes);
    println!("{}", pools_line(&a, &b));
    assert!(
        outcomes.failures().is_empty(),
        "failed requests: {:?}",
        outcomes.failures()
    );
    for name in ["pool_a", "pool_b"] {
        assert!(
            outcomes.served_by(name) >= 10,
            "{name} served {} of {}: {:?}",
            outcomes.served_by(name),
            outcomes.sent(),
            haproxy.servers()
        );
    }
    assert!(
        haproxy.servers().iter().all(|s| s.status == "UP"),
        "{:?}",
        haproxy.servers()
    );
}

/// A request through HAProxy, sent: the connection, to read its answer
/// from later.
fn send(addr: SocketAddr, path: &str) -> Result<TcpStream, String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .map_err(|e| e.to_string())?;
    let head = format!("GET {path} HTTP/1.1\r\nHost: forkpool-test\r\nConnection: close\r\n\r\n");
    stream
        .write_all(head.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    Ok(stream)
}

/// The answer to a request [`send`] sent: the HAProxy server that answered
/// a 200.
fn answered_by(stream: Result<TcpStream, String>) -> Result<String, String> {
    haproxy_support::server_of_answer(&mut stream?)
}

/// Per server, how many of `answers` it served; the failures.
fn tally(answers: &[Result<String, String>]) -> (usize, usize, Vec<String>) {
    let on = |name: &str| answers.iter().filter(|r| r.as_deref() == Ok(name)).count();
    let failed = answers.iter().filter_map(|r| r.clone().err()).collect();
    (on("pool_a"), on("pool_b"), failed)
}

/// New requests while pool_a is saturated.
const NEW_REQUESTS: usize = 40;
/// How long pool_a's children are kept busy.
const SLOW_MS: u64 = 6000;

/// Pool A (2 children at most) gets as many slow requests as it has
/// children, sent straight to it; once its status shows both busy, 40 new
/// requests through HAProxy (`roundrobin`, so each server's share follows
/// its weight, which the agent sets) go at most 4 to A. Before that, with
/// A free, a control run of 40 shows A does get its share.
#[test]
fn a_saturated_pool_gets_at_most_a_tenth_of_new_requests() {
    let _turn = one_at_a_time();
    let Some(program) = require_haproxy() else {
        return;
    };
    let Some(a) = kernel_pool(&[
        "--min-children",
        "2",
        "--max-children",
        "2",
        "--agent",
        "127.0.0.1:0",
    ]) else {
        return;
    };
    let Some(b) = kernel_pool(POOL_ARGS) else {
        return;
    };
    let haproxy = behind_haproxy(&program, &a, &b, "roundrobin");

    // Control: with A free, one request at a time, A gets its share.
    let free: Vec<_> = (0..NEW_REQUESTS)
        .map(|_| answered_by(send(haproxy.addr, "/")))
        .collect();
    let (free_a, free_b, free_failed) = tally(&free);
    println!("pool_a free: pool_a {free_a}, pool_b {free_b}, failed {free_failed:?}");
    assert!(free_failed.is_empty(), "{free_failed:?}");
    assert!(
        free_a >= 8 && free_b >= 8,
        "with pool_a free: pool_a {free_a}, pool_b {free_b}"
    );

    // Saturate A: one slow request per child, straight to its listener.
    assert!(
        a.wait_status(Duration::from_secs(5), |s| s["idle"] == 2)
            .is_some(),
        "pool_a's children never both idle: {}",
        a.status()
    );
    let saturated_at = Instant::now();
    let slow: Vec<_> = (0..2)
        .map(|_| send(a.addr, &format!("/?work_ms={SLOW_MS}")))
        .collect();
    // Both bounded, and checked after the share: the share is measured
    // whatever they saw. Status reads the scoreboard every 100 ms, HAProxy
    // asks the agent every 100 ms.
    let all_busy = a.wait_status(Duration::from_secs(2), |s| s["busy"] == 2 && s["idle"] == 0);
    let weight_one = haproxy.wait_for(Duration::from_secs(2), |s| {
        s.iter().any(|s| s.name == "pool_a" && s.weight == 1)
    });
    let agent = agent_says(&a);
    let weight = haproxy.server("pool_a").weight;
    let seen = all_busy.clone().unwrap_or_else(|| a.status());
    let seen = format!(
        "busy {}, idle {}, slots {}",
        seen["busy"], seen["idle"], seen["line"]
    );
    let settled_in = saturated_at.elapsed();

    let new: Vec<_> = (0..NEW_REQUESTS).map(|_| send(haproxy.addr, "/")).collect();
    let all_sent_in = saturated_at.elapsed();
    let answers: Vec<_> = new.into_iter().map(answered_by).collect();
    let (on_a, on_b, failed) = tally(&answers);
    let slow: Vec<_> = slow
        .into_iter()
        .map(|s| {
            let mut raw = String::new();
            s.and_then(|mut s| s.read_to_string(&mut raw).map_err(|e| e.to_string()))
                .and_then(|_| parse_response(&raw))
                .map(|r| r.status)
        })
        .collect();
    println!(
        "pool_a saturated: of {NEW_REQUESTS} new requests pool_a {on_a} ({:.1}%), pool_b {on_b}, \
         failed {}; pool_a's status {seen}, its agent said {agent:?}, HAProxy weight {weight} \
         ({:?} after saturating), all {NEW_REQUESTS} sent {:?} after saturating; slow requests \
         {slow:?}\n{}",
        100.0 * on_a as f64 / NEW_REQUESTS as f64,
        failed.len(),
        settled_in,
        all_sent_in,
        pools_line(&a, &b)
    );
    assert!(failed.is_empty(), "failed requests: {failed:?}");
    assert!(
        on_a * 10 <= NEW_REQUESTS,
        "the saturated pool got {on_a} of {NEW_REQUESTS} new requests (at most {} allowed); \
         its agent said {agent:?}, HAProxy weight {weight}",
        NEW_REQUESTS / 10
    );
    assert!(
        all_sent_in < Duration::from_millis(SLOW_MS - 1500),
        "the new requests went out {all_sent_in:?} after saturating, too late to measure"
    );
    assert!(
        all_busy.is_some(),
        "pool_a's status never showed both children busy: {seen}"
    );
    assert!(
        weight_one.is_some(),
        "HAProxy never gave the saturated pool weight 1: agent said {agent:?}, {:?}",
        haproxy.servers()
    );
    assert!(
        slow.iter().all(|s| s.as_ref() == Ok(&200)),
        "the slow requests: {slow:?}"
    );
}

/// `TERM` to pool A under load through HAProxy: its agent says `drain`
/// for the drain delay, HAProxy stops sending to it, its TCP check then
/// fails once its listeners close, and no request fails.
#[test]
fn term_of_one_pool_under_load_with_tcp_checks_fails_nothing() {
    let _turn = one_at_a_time();
    let Some(program) = require_haproxy() else {
        return;
    };
    let mut args = POOL_ARGS.to_vec();
    args.extend(["--drain-delay", "2s"]);
    let Some(mut a) = kernel_pool(&args) else {
        return;
    };
    let Some(b) = kernel_pool(POOL_ARGS) else {
        return;
    };
    let haproxy = behind_haproxy(&program, &a, &b, "leastconn");
    let load = Load::start(haproxy.addr, 4, "/?work_ms=10", Duration::from_secs(60));
    let shared = haproxy.wait_for(Duration::from_secs(20), |s| {
        s.len() == 2 && s.iter().all(|s| s.total >= 30)
    });
    assert!(shared.is_some(), "{:?}", haproxy.servers());

    let term_at = load.elapsed();
    a.signal(15);
    let drained = haproxy.wait_for(Duration::from_secs(5), |s| {
        s.iter()
            .any(|s| s.name == "pool_a" && s.status.starts_with("DRAIN"))
    });
    assert!(drained.is_some(), "never drained: {:?}", haproxy.servers());
    let drained_at = load.elapsed();
    let exit = a.wait_exit(Duration::from_secs(30));
    assert!(
        exit.is_some_and(|e| e.success()),
        "pool_a did not stop cleanly after its drain delay: {exit:?}\n{}",
        a.stderr.dump()
    );
    let exited_at = load.elapsed();
    let down = haproxy.wait_for(Duration::from_secs(5), |s| {
        s.iter().any(|s| s.name == "pool_a" && s.is_down())
    });
    assert!(
        down.is_some(),
        "the TCP check never took the stopped pool out: {:?}",
        haproxy.servers()
    );
    assert!(
        load.wait_more(100, Duration::from_secs(30)),
        "the load stalled after the stop"
    );
    let outcomes = load.finish();
    report("term with drain delay", &outcomes);
    println!(
        "TERM at {term_at:?}, DRAIN at {drained_at:?}, exited at {exited_at:?}; pool_a \
         served {} before TERM, {} after; pool_b {} after",
        outcomes.served_by_between("pool_a", Duration::ZERO, term_at),
        outcomes.served_by_between("pool_a", term_at, Duration::MAX),
        outcomes.served_by_between("pool_b", term_at, Duration::MAX),
    );
    assert!(
        outcomes.failures().is_empty(),
        "failed requests: {:?}",
        outcomes.failures()
    );
    assert!(outcomes.served_by_between("pool_a", Duration::ZERO, term_at) > 0);
    assert!(outcomes.served_by_between("pool_b", exited_at, Duration::MAX) > 0);
}
