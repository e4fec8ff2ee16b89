//! The shared HTTP corpus, `tests/http-corpus/` (the rules: docs/http.md):
//! loading its cases, and running them against a server over TCP.
//!
//! A test file uses it as the others use their helpers:
//! `#[path = "common/http_corpus.rs"] mod http_corpus;`, then asserts
//! that `http_corpus::run_corpus(addr)` returns no failure. A server that
//! is tested without TCP (the demo's parser) loads the cases with
//! [`load_cases`] and compares what it parsed with [`check_app`].
#![allow(dead_code)] // each test file uses some of these

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

/// How long one read may wait for the server: a case that gets no answer
/// within it fails (a server waiting for bytes that never come).
const READ_TIMEOUT: Duration = Duration::from_secs(3);

/// The request sent after a `"close": false` case, on the same connection.
const FOLLOW_UP: &[u8] = b"GET /follow-up HTTP/1.1\r\nHost: h\r\n\r\n";

/// One case: the bytes sent and the outcome expected.
pub struct Case {
    /// `class/case`, e.g. `host/duplicate`.
    pub name: String,
    /// The exact bytes of the `.req` file.
    pub request: Vec<u8>,
    /// Every response expected, in order: `{"status": N}` (only the
    /// status is checked: a refusal, or a HEAD answer) or
    /// `{"status": 200, "app": {...}}` (what the echo app saw).
    pub responses: Vec<Value>,
    /// Whether the server must close the connection after the last one.
    pub close: bool,
}

impl Case {
    /// The class: the case's directory, e.g. `host`.
    pub fn class(&self) -> &str {
        self.name.split('/').next().unwrap_or("")
    }
}

/// One case the server got wrong.
#[derive(Debug)]
pub struct Failure {
    /// `class/case`.
    pub case: String,
    /// What differed.
    pub what: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.case, self.what)
    }
}

/// `tests/http-corpus` at the repository root.
pub fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/http-corpus")
}

/// Every case of the corpus, sorted by name.
pub fn load_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for class in sorted_entries(&corpus_dir()) {
        if !class.is_dir() {
            continue;
        }
        for file in sorted_entries(&class) {
            if file.extension().is_some_and(|e| e == "json") {
                cases.push(load_case(&file));
            }
        }
    }
    assert!(
        cases.len() > 100,
        "the corpus at {:?} looks incomplete",
        corpus_dir()
    );
    cases
}

fn sorted_entries(dir: &Path) -> Vec<PathBuf> {
    let read = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut paths: Vec<PathBuf> = read.map(|e| e.unwrap().path()).collect();
    paths.sort();
    paths
}

fn load_case(json_path: &Path) -> Case {
    let class = json_path.parent().unwrap().file_name().unwrap();
    let stem = json_path.file_stem().unwrap();
    let name = format!("{}/{}", class.to_string_lossy(), stem.to_string_lossy());
    let text = std::fs::read_to_string(json_path).unwrap();
    let expect: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}.json: {e}"));
    let request = std::fs::read(json_path.with_extension("req"))
        .unwrap_or_else(|e| panic!("{name}.req: {e}"));
    Case {
        name,
        request,
        responses: expect["responses"].as_array().expect("responses").clone(),
        close: expect["close"].as_bool().expect("close"),
    }
}

/// Runs every case against the server at `addr`, each on a fresh
/// connection; the list of every mismatch (empty: the server passes).
pub fn run_corpus(addr: SocketAddr) -> Vec<Failure> {
    load_cases()
        .iter()
        .filter_map(|case| {
            run_case(addr, case).err().map(|what| Failure {
                case: case.name.clone(),
                what,
            })
        })
        .collect()
}

/// How many failures each class has, for a report.
pub fn failures_by_class(failures: &[Failure]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for failure in failures {
        let class = failure.case.split('/').next().unwrap_or("").to_string();
        *counts.entry(class).or_insert(0) += 1;
    }
    counts
}

/// Sends one case and checks every response and the connection's fate.
pub fn run_case(addr: SocketAddr, case: &Case) -> Result<(), String> {
    let conn = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect: {e}"))?;
    conn.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    conn.set_write_timeout(Some(READ_TIMEOUT)).unwrap();
    // Written from a thread: a server may answer (and stop reading) before
    // a large request is all sent. A failed write is not itself a failure.
    let mut writer = conn.try_clone().unwrap();
    let bytes = case.request.clone();
    let sending = std::thread::spawn(move || {
        let _ = writer.write_all(&bytes);
    });
    let mut reader = BufReader::new(conn);
    let head_only = case.request.starts_with(b"HEAD ");
    let mut outcome = Ok(());
    for (i, expected) in case.responses.iter().enumerate() {
        let checked = read_response(&mut reader, head_only && i == 0)
            .and_then(|response| check_response(expected, &response));
        if let Err(e) = checked {
            outcome = Err(format!("response {}: {e}", i + 1));
            break;
        }
    }
    if outcome.is_ok() {
        outcome = if case.close {
            check_closed(&mut reader)
        } else {
            check_open(&mut reader)
        };
    }
    let _ = reader.get_ref().shutdown(Shutdown::Both);
    let _ = sending.join();
    outcome
}

/// One response as read: status, lower-case headers, body.
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        let found = self.headers.iter().find(|(n, _)| n == name);
        found.map(|(_, v)| v.as_str())
    }
}

fn read_line(reader: &mut impl BufRead) -> Result<String, String> {
    let mut line = Vec::new();
    match reader.read_until(b'\n', &mut line) {
        Ok(0) => return Err("the connection closed with no (further) response".into()),
        Ok(_) => {}
        Err(e) if is_timeout(&e) => return Err("no answer before the read timeout".into()),
        Err(e) => return Err(format!("read: {e}")),
    }
    if !line.ends_with(b"\r\n") {
        return Err(format!("a response line without CRLF: {line:?}"));
    }
    line.truncate(line.len() - 2);
    String::from_utf8(line).map_err(|e| format!("a response line that is not UTF-8: {e}"))
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// Reads one final response, skipping interim (1xx) ones; the body is
/// framed by Content-Length, chunks, or the end of the connection.
pub fn read_response(reader: &mut impl BufRead, head_only: bool) -> Result<Response, String> {
    loop {
        let status_line = read_line(reader)?;
        let status = status_line
            .strip_prefix("HTTP/1.")
            .and_then(|rest| rest.get(2..5))
            .and_then(|s| s.parse::<u16>().ok())
            .ok_or_else(|| format!("a malformed status line {status_line:?}"))?;
        let mut headers = Vec::new();
        loop {
            let line = read_line(reader)?;
            if line.is_empty() {
                break;
            }
            let (name, value) = line
                .split_once(':')
                .ok_or_else(|| format!("a malformed response header {line:?}"))?;
            headers.push((name.to_ascii_lowercase(), value.trim().to_string()));
        }
        if (100..200).contains(&status) {
            continue;
        }
        let mut response = Response {
            status,
            headers,
            body: Vec::new(),
        };
        if !head_only && status != 204 && status != 304 {
            response.body = read_body(reader, &response)?;
        }
        return Ok(response);
    }
}

fn read_body(reader: &mut impl BufRead, response: &Response) -> Result<Vec<u8>, String> {
    let io = |e: std::io::Error| format!("reading the body: {e}");
    if let Some(length) = response.header("content-length") {
        let length: usize = length
            .parse()
            .map_err(|_| format!("Content-Length {length:?}"))?;
        let mut body = vec![0; length];
        reader.read_exact(&mut body).map_err(io)?;
        return Ok(body);
    }
    if response.header("transfer-encoding").is_some() {
        let mut body = Vec::new();
        loop {
            let line = read_line(reader)?;
            let size = usize::from_str_radix(line.split(';').next().unwrap_or(""), 16)
                .map_err(|_| format!("a malformed chunk size {line:?}"))?;
            if size == 0 {
                while !read_line(reader)?.is_empty() {}
                return Ok(body);
            }
            let start = body.len();
            body.resize(start + size, 0);
            reader.read_exact(&mut body[start..]).map_err(io)?;
            if !read_line(reader)?.is_empty() {
                return Err("a chunk longer than its size".into());
            }
        }
    }
    let mut body = Vec::new();
    reader.read_to_end(&mut body).map_err(io)?;
    Ok(body)
}

fn check_response(expected: &Value, response: &Response) -> Result<(), String> {
    let status = expected["status"].as_u64().expect("status") as u16;
    if response.status != status {
        let body = String::from_utf8_lossy(&response.body);
        return Err(format!(
            "status {} ({body:.120}), expected {status}",
            response.status
        ));
    }
    let Some(app) = expected.get("app") else {
        return Ok(());
    };
    let seen: Value = serde_json::from_slice(&response.body).map_err(|e| {
        let body = String::from_utf8_lossy(&response.body);
        format!("the body is not the echo app's JSON ({e}): {body:.200}")
    })?;
    check_app(app, &seen)
}

/// Compares what the app saw (`{"method", "path", "query", "headers",
/// "body"}`) with a case's `app` expectation: the same method, path,
/// query and body; every expected header with its value; none of the
/// `absent` ones.
pub fn check_app(expected: &Value, seen: &Value) -> Result<(), String> {
    let mut wrong = Vec::new();
    for key in ["method", "path", "query", "body"] {
        if let Some(want) = expected.get(key) {
            if seen.get(key) != Some(want) {
                wrong.push(format!("{key} {} (expected {want})", shown(seen.get(key))));
            }
        }
    }
    let headers = &seen["headers"];
    if let Some(want) = expected["headers"].as_object() {
        for (name, value) in want {
            if headers.get(name) != Some(value) {
                let got = shown(headers.get(name));
                wrong.push(format!("header {name} {got} (expected {value})"));
            }
        }
    }
    for name in expected["absent"].as_array().into_iter().flatten() {
        let name = name.as_str().expect("absent names are strings");
        if let Some(value) = headers.get(name) {
            wrong.push(format!("header {name} reached the app ({value})"));
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!("the app saw {}", wrong.join("; ")))
    }
}

fn shown(value: Option<&Value>) -> String {
    let text = value.map_or("nothing".to_string(), Value::to_string);
    text.chars().take(120).collect()
}

/// `"close": true`: the server must close, sending nothing more.
fn check_closed(reader: &mut BufReader<TcpStream>) -> Result<(), String> {
    let mut rest = Vec::new();
    match reader.read_to_end(&mut rest) {
        Ok(_) if rest.is_empty() => Ok(()),
        Ok(_) => Err(format!(
            "more bytes after the last response: {:.120}",
            show_bytes(&rest)
        )),
        Err(e) if e.kind() == ErrorKind::ConnectionReset => Ok(()),
        Err(e) if is_timeout(&e) => Err("the connection was left open, expected a close".into()),
        Err(e) => Err(format!("after the last response: {e}")),
    }
}

/// `"close": false`: a further GET on the connection is answered.
fn check_open(reader: &mut BufReader<TcpStream>) -> Result<(), String> {
    reader
        .get_mut()
        .write_all(FOLLOW_UP)
        .map_err(|e| format!("the connection was closed, expected it open ({e})"))?;
    match read_response(reader, false) {
        Ok(r) if r.status == 200 => Ok(()),
        Ok(r) => Err(format!("the follow-up GET got {}", r.status)),
        Err(e) => Err(format!("the connection did not serve a follow-up GET: {e}")),
    }
}

fn show_bytes(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
