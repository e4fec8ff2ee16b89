//! Behind a load balancer: HAProxy's agent check (`--agent`), `/live` and
//! `/ready` on the metrics address, and the drain delay before a stop.
//! Every wait polls for a state with a bounded deadline.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{send, DemoPool};

/// The address printed after `prefix` on the pool's standard output.
fn printed_addr(pool: &DemoPool, prefix: &str) -> SocketAddr {
    assert!(
        pool.stdout.wait_for(prefix, Duration::from_secs(10)),
        "no `{prefix}` line; stdout:\n{}",
        pool.stdout.dump()
    );
    pool.stdout
        .dump()
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .map(|rest| rest.trim_end_matches("/metrics").parse().expect("address"))
        .expect("line seen above")
}

fn agent_addr(pool: &DemoPool) -> SocketAddr {
    printed_addr(pool, "forkpool: agent check on ")
}

fn metrics_addr(pool: &DemoPool) -> SocketAddr {
    printed_addr(pool, "forkpool: metrics on http://")
}

/// One agent-check exchange: connect, read the line, the agent closes.
fn agent_line(addr: SocketAddr) -> Result<String, String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut line = String::new();
    stream
        .read_to_string(&mut line)
        .map_err(|e| format!("read: {e}"))?;
    Ok(line)
}

/// A raw HTTP request to the metrics address: status code and body.
fn probe(addr: SocketAddr, request: &str) -> Result<(u16, String), String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut raw = String::new();
    stream
        .read_to_string(&mut raw)
        .map_err(|e| format!("read: {e}"))?;
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad response {raw:?}"))?;
    let body = raw
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Ok((status, body))
}

fn get_path(addr: SocketAddr, path: &str) -> (u16, String) {
    probe(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n"),
    )
    .unwrap()
}

/// Polls `f` until it returns true or `timeout` passes.
fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// A demo pool of exactly `n` children, with `extra` arguments.
fn fixed_pool(n: &str, extra: &[&str]) -> DemoPool {
    let mut args = vec!["--min-children", n, "--max-children", n, "--min-spare", "0"];
    args.extend_from_slice(extra);
    DemoPool::start(&args)
}

#[test]
fn agent_weight_follows_spare_capacity() {
    let pool = fixed_pool("2", &["--agent", "127.0.0.1:0"]);
    let agent = agent_addr(&pool);
    assert!(
        wait_until(Duration::from_secs(10), || agent_line(agent).as_deref()
            == Ok("up ready 100%\n")),
        "an idle pool reports full weight; last: {:?}",
        agent_line(agent)
    );
    // Both children busy on slow requests: the weight falls to its floor.
    let slow: Vec<_> = (0..2).map(|_| send(pool.addr, "/?work_ms=4000")).collect();
    let mut last = String::new();
    assert!(
        wait_until(Duration::from_secs(10), || {
            last = agent_line(agent).unwrap_or_default();
            last == "up ready 1%\n"
        }),
        "a saturated pool reports the 1% floor; last: {last:?}"
    );
    // And back when they finish.
    for mut s in slow {
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    }
    assert!(
        wait_until(Duration::from_secs(10), || agent_line(agent).as_deref()
            == Ok("up ready 100%\n")),
        "the weight comes back; last: {:?}",
        agent_line(agent)
    );
}

#[test]
fn live_and_ready_answer_on_the_metrics_address() {
    let pool = fixed_pool(
        "1",
        &["--metrics", "127.0.0.1:0", "--ready-unless-saturated"],
    );
    let metrics = metrics_addr(&pool);
    assert_eq!(get_path(metrics, "/live"), (200, "live\n".to_string()));
    assert!(
        wait_until(Duration::from_secs(10), || get_path(metrics, "/ready").0
            == 200),
        "a serving pool is ready"
    );
    let (status, body) = probe(metrics, "HEAD /ready HTTP/1.1\r\nHost: p\r\n\r\n").unwrap();
    assert_eq!((status, body.as_str()), (200, ""), "HEAD has no body");
    let (status, _) = probe(metrics, "POST /ready HTTP/1.1\r\nHost: p\r\n\r\n").unwrap();
    assert_eq!(status, 405);
    let (status, body) = get_path(metrics, "/metrics");
    assert_eq!(status, 200);
    assert!(body.contains("forkpool_"), "other paths keep the metrics");

    // The only child busy: not ready while saturated, still live.
    let mut slow = send(pool.addr, "/?work_ms=4000");
    let mut last = (0, String::new());
    assert!(
        wait_until(Duration::from_secs(10), || {
            last = get_path(metrics, "/ready");
            last.0 == 503
        }),
        "saturated: not ready; last: {last:?}"
    );
    assert!(last.1.contains("saturated"), "{last:?}");
    assert_eq!(get_path(metrics, "/live").0, 200);
    let mut out = String::new();
    let _ = slow.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(
        wait_until(Duration::from_secs(10), || get_path(metrics, "/ready").0
            == 200),
        "ready again once the child is free"
    );
}

#[test]
fn drain_delay_reports_drain_while_serving_then_stops() {
    let mut pool = DemoPool::start(&[
        "--agent",
        "127.0.0.1:0",
        "--metrics",
        "127.0.0.1:0",
        "--drain-delay",
        "4s",
        "--min-children",
        "2",
    ]);
    let agent = agent_addr(&pool);
    let metrics = metrics_addr(&pool);
    assert!(wait_until(Duration::from_secs(10), || agent_line(agent)
        .is_ok_and(|l| l.starts_with("up ready"))));
    let signalled = Instant::now();
    pool.signal(15);
    let mut last = String::new();
    assert!(
        wait_until(Duration::from_secs(3), || {
            last = agent_line(agent).unwrap_or_default();
            last == "drain\n"
        }),
        "TERM with a drain delay: the agent says drain; last: {last:?}"
    );
    assert_eq!(get_path(metrics, "/ready").0, 503);
    assert_eq!(get_path(metrics, "/live").0, 200);
    // Still serving normally while draining.
    let r = pool.get("/").expect("served during the drain delay");
    assert_eq!(r.status, 200);
    assert!(
        signalled.elapsed() < Duration::from_secs(4),
        "the checks above took the whole delay; the test proves nothing"
    );
    let status = pool.wait_exit(Duration::from_secs(30));
    assert!(status.is_some(), "the pool stops once the delay is over");
    assert!(
        signalled.elapsed() >= Duration::from_secs(4),
        "stopped before the drain delay was over"
    );
}

#[test]
fn a_second_term_skips_the_drain_delay() {
    let mut pool = DemoPool::start(&["--agent", "127.0.0.1:0", "--drain-delay", "120s"]);
    let agent = agent_addr(&pool);
    pool.signal(15);
    assert!(
        wait_until(Duration::from_secs(5), || agent_line(agent).as_deref()
            == Ok("drain\n")),
        "draining"
    );
    pool.signal(15);
    assert!(
        pool.wait_exit(Duration::from_secs(30)).is_some(),
        "a second TERM stops well before the 120 s delay"
    );
}

#[test]
fn without_a_balancer_to_warn_term_stops_at_once() {
    let mut pool = DemoPool::start(&["--drain-delay", "120s"]);
    pool.signal(15);
    assert!(
        pool.wait_exit(Duration::from_secs(30)).is_some(),
        "no agent and no metrics: nobody to warn, no delay"
    );
}
