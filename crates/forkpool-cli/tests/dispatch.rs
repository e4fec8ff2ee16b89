//! Where connections go: the lowest idle child, in every mode.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{parse_response, send, DemoPool};

fn sequential_requests_go_to_slot_zero(mode: &str) {
    let pool = DemoPool::start(&[
        "--dispatch",
        mode,
        "--min-children",
        "4",
        "--min-spare",
        "2",
    ]);
    assert!(pool.wait_children(Duration::from_secs(5), |n| n == 4));
    let mut slots = Vec::new();
    for _ in 0..20 {
        let r = pool.get("/").expect("request");
        assert_eq!(r.status, 200);
        assert_eq!(r.body, "hello\n");
        slots.push(r.slot.expect("slot header"));
    }
    assert!(
        slots.iter().all(|s| *s == 0),
        "{mode}: sequential requests should all go to slot 0, got {slots:?}\n{}",
        pool.stderr.dump()
    );
}

#[test]
fn handoff_keeps_the_lowest_child_hot() {
    sequential_requests_go_to_slot_zero("handoff");
}

#[test]
fn order_keeps_the_lowest_child_hot() {
    sequential_requests_go_to_slot_zero("order");
}

/// Where the kernel refuses (outside CI, without root) the pool falls back
/// to handoff, which keeps the lowest child hot too: tests/kernel_dispatch.rs
/// checks the kernel really picked.
#[test]
fn kernel_keeps_the_lowest_child_hot() {
    sequential_requests_go_to_slot_zero("kernel");
}

#[test]
fn shared_mode_serves_and_reports() {
    let pool = DemoPool::start(&["--dispatch", "shared", "--min-children", "3"]);
    for _ in 0..10 {
        let r = pool.get("/").expect("request");
        assert_eq!(r.status, 200);
        assert!(r.slot.is_some_and(|s| s < 3), "slot {:?}", r.slot);
    }
    // Children tell the supervisor when they accept.
    assert!(pool.wait_total("accepted", 10, Duration::from_secs(5)));
}

#[test]
fn keep_alive_serves_several_requests_on_one_connection() {
    let pool = DemoPool::start(&[]);
    let mut stream = TcpStream::connect(pool.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut pids = Vec::new();
    for _ in 0..3 {
        stream
            .write_all(b"GET /?work_ms=1 HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        // Read exactly one response: head, then the 6-byte body.
        while !buf.ends_with(b"\r\n\r\n") {
            stream.read_exact(&mut byte).unwrap();
            buf.push(byte[0]);
        }
        let mut body = [0u8; 6];
        stream.read_exact(&mut body).unwrap();
        buf.extend_from_slice(&body);
        let r = parse_response(std::str::from_utf8(&buf).unwrap()).unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body, "hello\n");
        pids.push(r.pid.unwrap());
    }
    assert!(
        pids.windows(2).all(|w| w[0] == w[1]),
        "one child serves the connection: {pids:?}"
    );
}

#[test]
fn unix_listener_serves() {
    let dir = std::env::temp_dir().join(format!("forkpool-unix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("demo.sock");
    let listen = format!("unix:{}", path.display());
    let pool = DemoPool::start(&["--listen", &listen]);
    // The pool is ready, so its listener is bound.
    let mut stream = std::os::unix::net::UnixStream::connect(&path).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    let r = parse_response(&raw).unwrap();
    assert_eq!((r.status, r.body.as_str()), (200, "hello\n"));
    drop(pool);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_requests_get_clear_errors() {
    let pool = DemoPool::start(&[]);
    let r = pool.get("/?work_ms=soon").unwrap();
    assert_eq!(r.status, 400);
    assert!(
        r.body.contains("work_ms must be a whole number"),
        "{}",
        r.body
    );
    let mut stream = TcpStream::connect(pool.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(b"\x16\x03\x01 not http\r\n\r\n").unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    assert!(raw.starts_with("HTTP/1.1 400"), "{raw}");
}

#[test]
fn a_refused_request_on_a_kept_alive_connection_closes_it() {
    let pool = DemoPool::start(&[]);
    let mut stream = TcpStream::connect(pool.addr).unwrap();
    // Kept alive by default, but the answer says close: the connection
    // must then end (EOF), not wait for a next request until the
    // keep-alive timeout ends it.
    stream
        .set_read_timeout(Some(forkpool_cli::demo::http::KEEPALIVE_TIMEOUT / 2))
        .unwrap();
    stream
        .write_all(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n")
        .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    assert!(raw.starts_with("HTTP/1.1 405"), "{raw}");
    assert!(raw.contains("Connection: close"), "{raw}");
}

#[test]
fn a_closing_answer_reaches_a_client_that_sent_more_after_it() {
    let pool = DemoPool::start(&[]);
    for i in 0..10 {
        let mut stream = TcpStream::connect(pool.addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        // Asks to close, then sends 64 KiB more anyway: the server closes
        // on input it never read, which resets the connection and throws
        // away what its kernel still holds. The answer must have left
        // before that, not wait for the close.
        let mut bytes = b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n".to_vec();
        bytes.resize(bytes.len() + (64 << 10), b'x');
        stream.write_all(&bytes).unwrap();
        let mut raw = Vec::new();
        let _ = stream.read_to_end(&mut raw); // may end in a reset
        let raw = String::from_utf8_lossy(&raw);
        assert_eq!(
            raw.matches("HTTP/1.1 200 OK").count(),
            1,
            "connection {i}: {raw:?}"
        );
    }
}

#[test]
fn a_closing_answer_carries_the_fin_in_every_mode() {
    for mode in ["kernel", "handoff", "shared"] {
        let pool = DemoPool::start(&["--dispatch", mode]);
        common::assert_closing_answer_carries_the_fin(pool.addr, "/");
    }
}

#[test]
fn a_kept_alive_connection_gives_way_after_its_share() {
    let pool = DemoPool::start(&["--keepalive-requests", "3"]);
    let mut stream = TcpStream::connect(pool.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // Three requests pipelined: the third answer says close, then EOF.
    // The first is a HEAD, answered without a body, once: each request
    // is answered once and in order (a head left in the buffer would be
    // answered again, HEAD after HEAD).
    stream
        .write_all(
            b"HEAD / HTTP/1.1\r\nHost: h\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n\
              GET / HTTP/1.1\r\nHost: h\r\n\r\n",
        )
        .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    assert_eq!(raw.matches("HTTP/1.1 200 OK").count(), 3, "{raw}");
    assert_eq!(raw.matches("hello").count(), 2, "{raw}");
    assert_eq!(raw.matches("Connection: keep-alive").count(), 2, "{raw}");
    assert!(raw.trim_end().ends_with("hello"), "{raw}");
    assert_eq!(raw.matches("Connection: close").count(), 1, "{raw}");
}

fn answer(mut stream: TcpStream) -> common::Response {
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    let r = parse_response(&raw).unwrap();
    assert_eq!(r.status, 200, "{raw}");
    r
}

/// A pool of exactly one child.
fn one_child_pool(extra: &[&str]) -> DemoPool {
    let mut args = common::ONE_CHILD.to_vec();
    args.extend_from_slice(extra);
    DemoPool::start(&args)
}

/// One child, held busy by a slow request, while three more connections
/// queue in the backlog behind it: the four connections, in order.
fn queue_behind_a_slow_request(pool: &DemoPool) -> Vec<TcpStream> {
    let slow = send(pool.addr, "/?work_ms=1000");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while pool.status()["busy"].as_u64() != Some(1) {
        assert!(
            std::time::Instant::now() < deadline,
            "the child never got busy"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let queued = (0..3).map(|_| send(pool.addr, "/"));
    std::iter::once(slow).chain(queued).collect()
}

#[test]
fn a_finishing_child_takes_the_waiting_connections_itself() {
    let pool = one_child_pool(&[]);
    let answers: Vec<_> = queue_behind_a_slow_request(&pool)
        .into_iter()
        .map(answer)
        .collect();
    let pids: Vec<_> = answers.iter().map(|r| r.pid).collect();
    assert!(pids.iter().all(|p| *p == pids[0]), "{pids:?}");
    // The supervisor handed over the first; the child took the three that
    // waited in the backlog as it finished each one before.
    let totals = &pool.status()["totals"];
    assert_eq!(totals["accepted"], 4, "{totals}");
    assert_eq!(totals["taken_next"], 3, "{totals}");
    assert_eq!(pool.status()["slots"][0]["served"], 4);
}

#[test]
fn a_child_at_its_request_limit_takes_no_next_connection() {
    let pool = one_child_pool(&["--max-requests-per-child", "2"]);
    let answers: Vec<_> = queue_behind_a_slow_request(&pool)
        .into_iter()
        .map(answer)
        .collect();
    let pids: Vec<_> = answers.iter().map(|r| r.pid.expect("pid header")).collect();
    // The first child takes the second connection itself, which makes two:
    // the supervisor retires it, and it leaves the other two in the
    // backlog for its replacement instead of taking a third.
    assert_eq!(pids[0], pids[1], "{pids:?}");
    assert_ne!(pids[2], pids[0], "{pids:?}");
    assert_eq!(pids[2], pids[3], "{pids:?}");
    let totals = &pool.status()["totals"];
    assert_eq!(totals["accepted"], 4, "{totals}");
    assert_eq!(totals["taken_next"], 2, "{totals}");
}

#[test]
fn a_child_told_to_quit_takes_no_next_connection() {
    // Without serving the backlog on stop, which would hand the queued
    // connections out on purpose before telling the child to quit.
    let mut pool = one_child_pool(&["--no-serve-backlog-on-stop"]);
    let mut conns = queue_behind_a_slow_request(&pool).into_iter();
    pool.signal(libc::SIGTERM);
    answer(conns.next().unwrap());
    // The child finishes its connection, finds the quit waiting and takes
    // none of the queued ones; they are closed with the listener.
    for mut queued in conns {
        let mut raw = String::new();
        let _ = queued.read_to_string(&mut raw);
        assert!(!raw.contains("200 OK"), "served after quit: {raw}");
    }
    assert!(pool.wait_exit(Duration::from_secs(10)).is_some());
    let totals = common::final_totals(&pool);
    assert_eq!(common::total(&totals, "taken_next"), 0, "{totals}");
}

/// Checks that a connection that has sent nothing is not accepted while
/// one made after it is served, and that it is served once it speaks.
fn assert_silent_connection_waits(pool: &DemoPool) {
    let accepted = || pool.status()["totals"]["accepted"].as_u64().unwrap();
    let before = accepted();
    let mut silent = TcpStream::connect(pool.addr).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    // A request made after the silent connection is served first: the
    // kernel has not reported the silent one to the pool at all. (Without
    // TCP_DEFER_ACCEPT the supervisor accepts it first and hands it to a
    // child, where it would sit until the read timeout.)
    assert_eq!(pool.get("/").unwrap().status, 200);
    assert_eq!(accepted(), before + 1);
    // As soon as it speaks, it is served.
    silent
        .write_all(b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        .unwrap();
    assert_eq!(answer(silent).status, 200);
    assert_eq!(accepted(), before + 2);
}

#[test]
fn with_defer_accept_a_silent_connection_waits_in_the_kernel() {
    let pool = DemoPool::start(&["--defer-accept", "30s", "--min-children", "2"]);
    assert_silent_connection_waits(&pool);
}

/// Kernel dispatch: each slot's own socket defers like the listener.
#[test]
fn with_defer_accept_a_silent_connection_waits_in_the_kernel_in_kernel_dispatch() {
    let pool = DemoPool::start(&[
        "--dispatch",
        "kernel",
        "--defer-accept",
        "30s",
        "--min-children",
        "2",
    ]);
    assert_silent_connection_waits(&pool);
}

#[test]
fn a_reload_turns_defer_accept_on() {
    a_reload_turns_defer_accept_on_in("handoff");
}

/// Kernel dispatch: the slots' sockets follow the reload too.
#[test]
fn a_reload_turns_defer_accept_on_in_kernel_dispatch() {
    a_reload_turns_defer_accept_on_in("kernel");
}

fn a_reload_turns_defer_accept_on_in(mode: &str) {
    let file = common::temp_path("defer.toml");
    let first = format!("[pool]\nmin_children = 2\ndispatch = \"{mode}\"\n");
    std::fs::write(&file, &first).unwrap();
    let pool = DemoPool::start(&["--config", file.to_str().unwrap()]);
    std::fs::write(&file, format!("{first}defer_accept = \"30s\"\n")).unwrap();
    pool.signal(libc::SIGHUP);
    // The new generation serves (the old one has gone).
    assert!(pool
        .wait_status(Duration::from_secs(5), |s| {
            s["serving_generation"] == 2
                && s["slots"]
                    .as_array()
                    .is_some_and(|a| a.iter().all(|e| e["generation"] == 2))
        })
        .is_some());
    assert_silent_connection_waits(&pool);
    let _ = std::fs::remove_file(&file);
}
