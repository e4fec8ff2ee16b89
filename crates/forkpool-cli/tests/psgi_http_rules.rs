//! forkpool-psgi's part of issue 25 beyond the corpus: an idle kept-alive
//! connection gives way to a waiting client, a request body must arrive
//! whole within `--body-timeout`, and a response header with a line break
//! from the app is answered 500, never sent.

mod common;

#[path = "common/psgi_support.rs"]
mod psgi_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use psgi_support::{connect, read_response, require_plack, start_echo_pool, start_psgi};

/// Issue 25: with 4 workers and 100 kept-alive clients that send nothing
/// after their first response, every client still gets its first answer
/// and a new GET is answered promptly, because an idle kept-alive
/// connection gives way (within 100 ms, once its 20 ms turn is over) when
/// another client waits and no worker is free. Without the give-way each
/// idle connection holds its worker for the whole keep-alive timeout
/// (5 s): 25 rounds of 5 s before the last of the 100 is served.
#[test]
fn idle_kept_alive_clients_do_not_starve_a_new_one() {
    if common::require_program("perl", "apt-get install perl").is_none() {
        return;
    }
    let pool = start_echo_pool("4", &[]);
    let mut clients: Vec<TcpStream> = (0..100)
        .map(|_| {
            let mut conn = connect(&pool);
            conn.write_all(b"GET /first HTTP/1.1\r\nHost: t\r\n\r\n")
                .unwrap();
            conn
        })
        .collect();
    // Each client reads its first response and then stays silent, its
    // connection open. The whole round is bounded: 15 s is three
    // keep-alive timeouts, far beyond what the give-way needs (about
    // 100 / 4 x 50 ms) and far short of what starving takes (125 s).
    let deadline = Instant::now() + Duration::from_secs(15);
    for (i, conn) in clients.iter_mut().enumerate() {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "only {i} of 100 kept-alive clients got their first response within 15 s"
        );
        conn.set_read_timeout(Some(left)).unwrap();
        let first = read_response(conn, false);
        assert_eq!(first.status, 200, "client {i}");
    }
    let started = Instant::now();
    let mut late = connect(&pool);
    late.write_all(b"GET /late HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    late.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let answer = read_response(&mut late, false);
    let waited = started.elapsed();
    assert_eq!(answer.status, 200);
    // 100 ms to give way, plus the reconnect and a debug build's slack.
    assert!(
        waited < Duration::from_secs(1),
        "a new GET waited {waited:?} behind idle kept-alive connections"
    );
    drop(clients);
}

/// Issue 25: the whole body must arrive within `--body-timeout`. A
/// client dripping one byte every 0.5 s, each read well inside `--timeout`,
/// gets 408 after about 2 s, and the worker is free again.
#[test]
fn a_dripping_body_gets_408_at_the_body_timeout() {
    if common::require_program("perl", "apt-get install perl").is_none() {
        return;
    }
    let pool = start_echo_pool("1", &["--body-timeout", "2"]);
    let mut conn = connect(&pool);
    conn.write_all(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n")
        .unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    // Drip until the answer comes, for at most 40 bytes (20 s, ten times
    // the body timeout; --timeout, 60 s, never ends a read here).
    for _ in 0..40 {
        if conn.write_all(b"x").is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
        conn.set_nonblocking(true).unwrap();
        let mut buf = [0; 512];
        if let Ok(n) = conn.read(&mut buf) {
            answer.extend_from_slice(&buf[..n]);
        }
        conn.set_nonblocking(false).unwrap();
        if !answer.is_empty() {
            break;
        }
    }
    let dripped_for = started.elapsed();
    let text = String::from_utf8_lossy(&answer);
    assert!(
        text.starts_with("HTTP/1.1 408 "),
        "no 408 while the body dripped for {dripped_for:?}: {text:?}"
    );
    assert!(
        dripped_for < Duration::from_secs(6),
        "the 408 came after {dripped_for:?}, not at the 2 s body timeout"
    );
    assert!(psgi_support::wait_idle(&pool, 1), "worker not freed");
}

/// Issue 25: a header value from the app with CR/LF in it is refused with
/// 500 before anything is sent (the injected header never reaches the
/// client), and the worker serves on.
#[test]
fn a_response_header_with_a_line_break_is_answered_500() {
    if !require_plack() {
        return;
    }
    let pool = start_psgi("handoff", &[]);
    let mut conn = connect(&pool);
    conn.write_all(b"GET /inject HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 500 "), "{text:?}");
    assert!(!text.contains("stolen"), "the header was sent: {text:?}");
    let mut again = connect(&pool);
    again
        .write_all(b"GET /?name=next HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&mut again, false).body_text(), "hello next\n");
}
