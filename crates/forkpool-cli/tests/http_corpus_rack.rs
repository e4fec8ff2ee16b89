//! forkpool-rack against docs/http.md: the shared HTTP corpus
//! (tests/http-corpus) with the echo app `clients/tests/echo_config.ru`,
//! the valid cases again through `Rack::Lint`, and what the corpus cannot
//! show: the app's response checked, the body deadline, and idle kept-alive
//! connections giving way.

mod common;

#[path = "common/http_corpus.rs"]
mod http_corpus;

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::DemoPool;

fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients")
}

/// True if Ruby and Rack are installed (else, under CI, a failure).
fn require_rack() -> bool {
    let found = Command::new("ruby")
        .args(["-e", "require 'rack'; require 'json'"])
        .output()
        .is_ok_and(|o| o.status.success());
    common::require(found, "ruby with Rack", "run bash .ci/deps/ruby.sh")
}

/// `forkpool run` with `workers` workers of `forkpool-rack CONFIG`, from
/// clients/tests; `extra` goes to forkpool-rack, `env` to the workers.
fn start_app(
    config: &str,
    workers: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Option<DemoPool> {
    if !require_rack() {
        return None;
    }
    let ruby_dir = clients_dir().join("ruby");
    let server = ruby_dir.join("forkpool-rack");
    let mut command = Command::new(common::forkpool_bin());
    command
        .arg("run")
        .current_dir(clients_dir().join("tests"))
        .envs(env.iter().copied());
    let args = [
        "--ping-timeout",
        "20s",
        "--dispatch",
        "handoff",
        "--min-children",
        workers,
        "--max-children",
        workers,
        "--min-spare",
        "0",
        "--max-spare",
        workers,
    ];
    let mut cmd = vec![
        "ruby",
        "-I",
        ruby_dir.to_str().unwrap(),
        server.to_str().unwrap(),
        "--no-access-log",
        "--head-timeout",
        "5",
    ];
    cmd.extend(extra);
    cmd.push(config);
    Some(DemoPool::launch(command, &args, &cmd, true))
}

fn assert_passes(failures: &[http_corpus::Failure]) {
    let report: Vec<String> = failures.iter().map(|f| f.to_string()).collect();
    assert!(
        failures.is_empty(),
        "{} corpus cases failed ({:?}):\n{}",
        failures.len(),
        http_corpus::failures_by_class(failures),
        report.join("\n")
    );
}

#[test]
fn forkpool_rack_passes_the_whole_corpus() {
    let Some(pool) = start_app("echo_config.ru", "4", &[], &[]) else {
        return;
    };
    assert_passes(&http_corpus::run_corpus(pool.addr));
}

/// The valid cases again, with the echo app behind `Rack::Lint` (the Rack
/// specification's checker): a complaint is an exception, so a 500.
#[test]
fn forkpool_rack_keeps_the_rack_spec_on_the_valid_cases() {
    let lint = [("FORKPOOL_ECHO_LINT", "1")];
    let Some(pool) = start_app("echo_config.ru", "4", &[], &lint) else {
        return;
    };
    let failures: Vec<http_corpus::Failure> = http_corpus::load_cases()
        .iter()
        .filter(|case| case.class() == "valid")
        .filter_map(|case| {
            let what = http_corpus::run_case(pool.addr, case).err()?;
            let case = case.name.clone();
            Some(http_corpus::Failure { case, what })
        })
        .collect();
    assert_passes(&failures);
}

/// One request on a fresh connection: the response and the connection.
fn get(addr: SocketAddr, path: &str) -> (http_corpus::Response, BufReader<TcpStream>) {
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(conn, "GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    let mut reader = BufReader::new(conn);
    let response = http_corpus::read_response(&mut reader, false).unwrap();
    (response, reader)
}

/// A Rack app that puts CRLF in a header value or in its status gets a
/// 500 with nothing of it sent, and a log line naming the header.
#[test]
fn an_app_cannot_split_its_response() {
    let Some(pool) = start_app("inject_config.ru", "1", &[], &[]) else {
        return;
    };
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

/// A client dripping its body (a byte every 0.5 s) gets 408 at
/// `--body-timeout` (2 s), and the only worker is free for the next client
/// at once.
#[test]
fn a_dripping_body_gets_408_at_the_body_timeout() {
    let Some(pool) = start_app("echo_config.ru", "1", &["--body-timeout", "2"], &[]) else {
        return;
    };
    let mut conn = TcpStream::connect(pool.addr).unwrap();
    conn.write_all(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n")
        .unwrap();
    conn.set_nonblocking(true).unwrap();
    let started = Instant::now();
    let mut answered = false;
    while !answered && started.elapsed() < Duration::from_secs(8) {
        let _ = conn.write_all(b"x");
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

/// 100 clients, one after the other, each keeping its connection after
/// its answer, on 4 workers: from the fifth on, every worker holds an idle
/// kept-alive connection when a client comes, and one gives way to it
/// (docs/http.md, "Give-way") long before the keep-alive timeout (20 s).
#[test]
fn idle_kept_alive_clients_give_way_to_a_new_one() {
    let extra = ["--keepalive-timeout", "20", "--keepalive-turn", "0"];
    let Some(pool) = start_app("echo_config.ru", "4", &extra, &[]) else {
        return;
    };
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
