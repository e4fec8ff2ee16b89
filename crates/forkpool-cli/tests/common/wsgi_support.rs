//! Helpers for `tests/wsgi.rs`: finding the Python venv `.ci/deps/python.sh`
//! makes, and a raw HTTP/1.1 client that keeps connections open.
#![allow(dead_code)] // each test file uses some of these

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::DemoPool;

/// The workspace's `target/` directory.
pub fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `clients/python`.
pub fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients/python")
}

/// `crates/forkpool-cli/tests/apps`, where the Flask test app lives.
pub fn apps_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/apps")
}

/// The venv's python with Flask, or `None` when it is missing and the
/// test must return without running (see `common::require`: under CI a
/// failure).
pub fn venv_python() -> Option<String> {
    let python = target_dir().join("py-venv/bin/python");
    let flask = python.exists()
        && std::process::Command::new(&python)
            .args(["-c", "import flask"])
            .status()
            .is_ok_and(|s| s.success());
    let why = format!("a Flask venv at {}", python.display());
    crate::common::require(flask, &why, "run bash .ci/deps/python.sh")
        .then(|| python.to_str().unwrap().to_string())
}

/// A connection with generous read and write timeouts.
pub fn connect(addr: SocketAddr) -> TcpStream {
    let conn = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    conn.set_write_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    conn
}

/// One HTTP response as read off the wire.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    /// A header's value by lower-case name.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    }
}

/// Sends `text` and reads one response (without a body for HEAD).
pub fn request(conn: &mut TcpStream, text: &str) -> Reply {
    conn.write_all(text.as_bytes()).unwrap();
    read_response(conn, text.starts_with("HEAD "))
}

fn read_line(conn: &mut TcpStream) -> String {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\r\n") {
        // read_exact retries a read a signal interrupted (EINTR).
        conn.read_exact(&mut byte)
            .unwrap_or_else(|e| panic!("reading a response line: {e}; so far {line:?}"));
        line.push(byte[0]);
    }
    line.truncate(line.len() - 2);
    String::from_utf8(line).unwrap()
}

/// Reads one response: the head, then a body framed by Content-Length,
/// chunks, or the end of the connection.
pub fn read_response(conn: &mut TcpStream, head_only: bool) -> Reply {
    let status_line = read_line(conn);
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let mut headers = Vec::new();
    loop {
        let line = read_line(conn);
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').expect("header line");
        headers.push((name.to_ascii_lowercase(), value.trim().to_string()));
    }
    let mut reply = Reply {
        status,
        headers,
        body: Vec::new(),
    };
    if head_only || (100..200).contains(&status) || status == 204 || status == 304 {
        return reply;
    }
    if let Some(length) = reply.header("content-length") {
        reply.body = vec![0; length.parse().unwrap()];
        conn.read_exact(&mut reply.body).unwrap();
    } else if reply.header("transfer-encoding").as_deref() == Some("chunked") {
        loop {
            let size = usize::from_str_radix(&read_line(conn), 16).unwrap();
            if size == 0 {
                while !read_line(conn).is_empty() {}
                break;
            }
            let mut chunk = vec![0; size];
            conn.read_exact(&mut chunk).unwrap();
            reply.body.extend_from_slice(&chunk);
            assert_eq!(read_line(conn), "", "chunk longer than its size");
        }
    } else {
        conn.read_to_end(&mut reply.body).unwrap();
    }
    reply
}

/// Sends the start of a request head, then one more byte every `every`,
/// until the server answers (true) or `limit` passes (false). The answer
/// is left unread on `conn`.
pub fn drip_head(conn: &mut TcpStream, every: Duration, limit: Duration) -> bool {
    conn.write_all(b"GET / HTTP/1.1\r\n").unwrap();
    conn.set_nonblocking(true).unwrap();
    let started = Instant::now();
    let mut answered = false;
    while started.elapsed() < limit {
        let mut probe = [0u8; 1];
        match conn.peek(&mut probe) {
            Ok(_) => {
                answered = true;
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("dripping client: {e}"),
        }
        // The server may have closed its side already; the peek says so.
        let _ = conn.write_all(b"X");
        std::thread::sleep(every);
    }
    conn.set_nonblocking(false).unwrap();
    answered
}

/// The pids of every slot in a status snapshot.
pub fn slot_pids(status: &serde_json::Value) -> Vec<i32> {
    status["slots"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["pid"].as_i64())
        .map(|p| p as i32)
        .collect()
}

/// The slot entry of the worker with `pid`, if it is in the snapshot.
pub fn status_pid_of(status: &serde_json::Value, pid: i32) -> Option<serde_json::Value> {
    status["slots"]
        .as_array()?
        .iter()
        .find(|s| s["pid"].as_i64() == Some(pid as i64))
        .cloned()
}

/// Polls `forkpool status --json` until `cond` holds or `timeout` passes.
pub fn wait_status(
    pool: &DemoPool,
    timeout: Duration,
    cond: impl Fn(&serde_json::Value) -> bool,
) -> bool {
    pool.wait_status(timeout, cond).is_some()
}

/// A process's peak resident memory (VmHWM), in KiB.
pub fn worker_peak_rss_kib(pid: i32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

/// Removes a directory when dropped (also on panic).
pub struct RemoveOnDrop(pub PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
