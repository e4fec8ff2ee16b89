//! forkpool-psgi's part of issue 25 beyond the corpus: an idle kept-alive
//! connection gives way to a waiting client, a request body must arrive
//! whole within `--body-timeout`, and a response header with a line break
//! from the app is answered 500, never sent. The checks every app server
//! shares are in `common/http_server_checks.rs`; this file adds the
//! issue's own scenario (100 clients at once) and a Plack app.

mod common;

#[path = "common/http_corpus.rs"]
mod http_corpus;

#[path = "common/http_server_checks.rs"]
mod http_server_checks;

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

/// Issue 25: the whole body must arrive within `--body-timeout` (2 s): a
/// client dripping it gets 408 and the worker is free at once.
#[test]
fn a_dripping_body_gets_408_at_the_body_timeout() {
    if common::require_program("perl", "apt-get install perl").is_none() {
        return;
    }
    let pool = start_echo_pool("1", &["--body-timeout", "2"]);
    http_server_checks::dripping_body_gets_408_at_the_body_timeout(&pool);
}

/// 100 clients one after the other on 4 workers, each keeping its
/// connection idle after its answer: none waits behind the idle ones.
#[test]
fn idle_kept_alive_clients_give_way_to_a_new_one() {
    if common::require_program("perl", "apt-get install perl").is_none() {
        return;
    }
    let extra = ["--keepalive-timeout", "20", "--keepalive-turn", "0"];
    let pool = start_echo_pool("4", &extra);
    http_server_checks::idle_kept_alive_clients_give_way_to_a_new_one(&pool);
}

/// An app that puts CRLF in a header value or its status gets a 500 with
/// nothing of it sent, and a log line naming the header (core Perl app).
#[test]
fn an_app_cannot_split_its_response() {
    if common::require_program("perl", "apt-get install perl").is_none() {
        return;
    }
    let pool = psgi_support::start_app_pool("1", &[], psgi_support::INJECT_APP);
    http_server_checks::app_cannot_split_its_response(&pool);
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
