//! What docs/http.md asks of every app server that the corpus cannot show,
//! checked the same way for each (`http_corpus_wsgi.rs`,
//! `http_corpus_rack.rs`): the app's response checked before sending, the
//! body deadline, and idle kept-alive connections giving way.
#![allow(dead_code)]

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::common::DemoPool;
use crate::http_corpus;

/// Fails with every mismatch, counted by class, when there is any.
pub fn assert_passes(failures: &[http_corpus::Failure]) {
    let report: Vec<String> = failures.iter().map(|f| f.to_string()).collect();
    assert!(
        failures.is_empty(),
        "{} corpus cases failed ({:?}):\n{}",
        failures.len(),
        http_corpus::failures_by_class(failures),
        report.join("\n")
    );
}

/// Runs the corpus cases of one class (`valid`) against `addr`.
pub fn run_class(addr: SocketAddr, class: &str) -> Vec<http_corpus::Failure> {
    http_corpus::load_cases()
        .iter()
        .filter(|case| case.class() == class)
        .filter_map(|case| {
            let what = http_corpus::run_case(addr, case).err()?;
            let case = case.name.clone();
            Some(http_corpus::Failure { case, what })
        })
        .collect()
}

/// One request on a fresh connection: the response and the connection.
pub fn get(addr: SocketAddr, path: &str) -> (http_corpus::Response, BufReader<TcpStream>) {
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(conn, "GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    let mut reader = BufReader::new(conn);
    let response = http_corpus::read_response(&mut reader, false).unwrap();
    (response, reader)
}

/// `pool` serves an app that puts CRLF in a header value (`/header`) or
/// in its status (`/status`) and answers `ok` on `/`: each gets a 500 with
/// nothing of it sent, and a log line names the header (`X-Bad`).
pub fn app_cannot_split_its_response(pool: &DemoPool) {
    for path in ["/header", "/status"] {
        let (response, _conn) = get(pool.addr, path);
        let injected = response.headers.iter().any(|(n, _)| n == "x-injected")
            || String::from_utf8_lossy(&response.body).contains("X-Injected:");
        assert!(
            response.status == 500 && !injected,
            "{path}: {} {:?}",
            response.status,
            response.headers
        );
    }
    let (fine, _conn) = get(pool.addr, "/");
    assert_eq!((fine.status, fine.body.as_slice()), (200, &b"ok"[..]));
    assert!(
        pool.stderr.wait_for("'X-Bad'", Duration::from_secs(5)),
        "no log line names the app's header:\n{}",
        pool.stderr.dump()
    );
}

/// `pool` has one worker of an app that reads the body, with a body
/// timeout of 2 s: a client dripping its body (a byte every 0.5 s, each
/// read well within any read timeout) gets 408 at the body timeout, and
/// the worker is free for the next client at once.
pub fn dripping_body_gets_408_at_the_body_timeout(pool: &DemoPool) {
    let mut conn = TcpStream::connect(pool.addr).unwrap();
    conn.write_all(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n")
        .unwrap();
    conn.set_nonblocking(true).unwrap();
    let started = Instant::now();
    let mut answered = false;
    while !answered && started.elapsed() < Duration::from_secs(8) {
        let _ = conn.write_all(b"x");
        // Wait up to 0.5 s for an answer before the next byte.
        let until = Instant::now() + Duration::from_millis(500);
        while !answered && Instant::now() < until {
            let mut probe = [0u8; 1];
            answered = match conn.peek(&mut probe) {
                Ok(_) => true,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
                Err(e) => panic!("dripping client: {e}"),
            };
            std::thread::yield_now();
        }
    }
    let waited = started.elapsed();
    assert!(answered, "no answer to a dripping body in {waited:?}");
    conn.set_nonblocking(false).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let response = http_corpus::read_response(&mut BufReader::new(&conn), false).unwrap();
    assert_eq!(response.status, 408, "after {waited:?}");
    assert!(
        waited >= Duration::from_millis(1500),
        "408 too early: {waited:?}"
    );
    drop(conn);
    let asked = Instant::now();
    let (next, _conn) = get(pool.addr, "/next");
    assert_eq!(next.status, 200);
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "the worker stayed busy"
    );
}

/// `pool` has 4 workers and a keep-alive timeout of 20 s: 100 clients,
/// one after the other, each keeping its connection after its answer.
/// From the fifth on, every worker holds an idle kept-alive connection
/// when a client comes, and one gives way to it (docs/http.md, "Give-way")
/// long before the keep-alive timeout.
pub fn idle_kept_alive_clients_give_way_to_a_new_one(pool: &DemoPool) {
    let mut idle = Vec::new();
    let mut slowest = Duration::ZERO;
    for _ in 0..100 {
        let asked = Instant::now();
        let mut conn = TcpStream::connect(pool.addr).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        conn.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        let mut conn = BufReader::new(conn);
        let response = http_corpus::read_response(&mut conn, false);
        let waited = asked.elapsed();
        assert!(
            response.as_ref().is_ok_and(|r| r.status == 200),
            "client {} after {waited:?}: {:?}",
            idle.len() + 1,
            response.err()
        );
        slowest = slowest.max(waited);
        idle.push(conn);
    }
    assert!(
        slowest < Duration::from_millis(900),
        "a new client waited {slowest:?} behind idle kept-alive ones"
    );
}
