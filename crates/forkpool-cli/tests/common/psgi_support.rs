//! Helpers for `tests/psgi.rs`: a pool of `forkpool-psgi` workers, a raw
//! HTTP/1.1 response reader, and the worker's memory from /proc.
#![allow(dead_code)]

use std::io::Read;
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::DemoPool;

/// The Perl helper's directory.
pub const PERL_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../clients/perl");
/// The PSGI server's command.
pub const PSGI_SERVER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../clients/perl/forkpool-psgi"
);
/// The Plack app the tests serve.
pub const TEST_APP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../clients/perl/t/app.psgi");

/// How long a worker may take to start or a state to be reached on a
/// loaded machine; a quiet one never waits this long.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// True if Plack (and plackup) are installed; without them the test must
/// return without running (see `common::require`: under CI a failure).
pub fn require_plack() -> bool {
    let plack = Command::new("perl")
        .args(["-MPlack::Request", "-MPlack::Builder", "-e1"])
        .output()
        .is_ok_and(|o| o.status.success());
    let plackup = Command::new("plackup")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    crate::common::require(
        plack && plackup,
        "Plack (and plackup)",
        "run bash .ci/deps/perl.sh",
    )
}

/// `forkpool run` with one worker running CMD in dispatch MODE, once the
/// worker is idle.
pub fn start_pool(mode: &str, cmd: &[&str]) -> DemoPool {
    let mut args = vec!["--ping-timeout", "20s", "--dispatch", mode];
    args.extend_from_slice(&crate::common::ONE_CHILD);
    let pool = DemoPool::start_run(&args, cmd);
    assert!(
        wait_idle(&pool, 1),
        "the worker never became idle:\n{}",
        pool.stderr.dump()
    );
    pool
}

/// The README's command, `perl clients/perl/forkpool-psgi [ARGS] app.psgi`,
/// in a one-worker pool.
pub fn start_psgi(mode: &str, server_args: &[&str]) -> DemoPool {
    let mut cmd = vec!["perl", PSGI_SERVER];
    cmd.extend_from_slice(server_args);
    cmd.push(TEST_APP);
    start_pool(mode, &cmd)
}

/// The shared corpus's echo app (clients/tests): it reads the whole body,
/// and needs no Plack.
pub const ECHO_APP: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../clients/tests/echo_app.psgi"
);

/// An app that tries to split its response (clients/tests).
pub const INJECT_APP: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../clients/tests/inject_app.psgi"
);

/// A pool of `workers` forkpool-psgi workers, run with `server_args`,
/// serving the echo app in `handoff`, once they are all idle.
pub fn start_echo_pool(workers: &str, server_args: &[&str]) -> DemoPool {
    start_app_pool(workers, server_args, ECHO_APP)
}

/// Like [`start_echo_pool`] with the app file `app`.
pub fn start_app_pool(workers: &str, server_args: &[&str], app: &str) -> DemoPool {
    let args = [
        "--ping-timeout",
        "20s",
        "--min-children",
        workers,
        "--max-children",
        workers,
        "--min-spare",
        "0",
        "--max-spare",
        workers,
    ];
    let mut cmd = vec!["perl", PSGI_SERVER];
    cmd.extend_from_slice(server_args);
    cmd.push(app);
    let pool = DemoPool::start_run(&args, &cmd);
    let n: u64 = workers.parse().unwrap();
    assert!(
        wait_idle(&pool, n),
        "the workers never became idle:\n{}",
        pool.stderr.dump()
    );
    pool
}

/// Polls `forkpool status` until `n` workers are idle and none busy.
pub fn wait_idle(pool: &DemoPool, n: u64) -> bool {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let status = pool.status();
        if status["idle"] == n && status["busy"] == 0 && status["starting"] == 0 {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The pids of the pool's workers, by slot, from `forkpool status`.
pub fn worker_pids(pool: &DemoPool) -> Vec<i32> {
    pool.status()["slots"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["pid"].as_i64())
        .map(|p| p as i32)
        .collect()
}

/// A field of /proc/PID/status in KiB (`VmRSS`, `VmHWM`).
pub fn rss_kib(pid: i32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// A connection to the pool, reads bounded by [`PATIENCE`].
pub fn connect(pool: &DemoPool) -> TcpStream {
    let conn = TcpStream::connect_timeout(&pool.addr, Duration::from_secs(5)).unwrap();
    conn.set_read_timeout(Some(PATIENCE)).unwrap();
    conn
}

/// `rounds` times: a new connection, `request` on it, its answer read to
/// the end of its body, and the next connection made at once, without
/// waiting for the close (as wrk does with `Connection: close`). Each
/// answer's `X-Forkpool-Slot` and `Connection`.
pub fn reconnecting_at_once(
    pool: &DemoPool,
    rounds: usize,
    request: &[u8],
) -> Vec<(Option<String>, Option<String>)> {
    use std::io::Write;
    (0..rounds)
        .map(|_| {
            let mut conn = connect(pool);
            conn.write_all(request).unwrap();
            let answer = read_response(&mut conn, false);
            (
                answer.header("x-forkpool-slot"),
                answer.header("connection"),
            )
        })
        .collect()
}

/// A connection that has had one answer (`GET /?name=a`) and is kept
/// alive, as the give-way tests need.
pub fn kept_alive(pool: &DemoPool) -> TcpStream {
    use std::io::Write;
    let mut kept = connect(pool);
    kept.write_all(b"GET /?name=a HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let first = read_response(&mut kept, false);
    assert_eq!(first.header("connection"), None, "kept alive");
    kept
}

/// One HTTP response.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    }

    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn read_byte(conn: &mut TcpStream) -> Option<u8> {
    // read_exact retries a read interrupted by a signal (EINTR, which a
    // socket with a read timeout returns even for a handler installed with
    // SA_RESTART, such as glibc's own): one such read was once taken for
    // the server closing the connection.
    let mut byte = [0];
    conn.read_exact(&mut byte).ok().map(|()| byte[0])
}

/// A line without its CRLF, read a byte at a time so that nothing of the
/// next response is consumed.
fn read_line(conn: &mut TcpStream) -> String {
    let mut line = Vec::new();
    while let Some(b) = read_byte(conn) {
        if b == b'\n' {
            break;
        }
        line.push(b);
    }
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    String::from_utf8_lossy(&line).into_owned()
}

fn read_exact(conn: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut body = vec![0; n];
    conn.read_exact(&mut body).expect("the whole body");
    body
}

/// Reads one response: its head, then (unless `head_only` or a 1xx) its
/// body as its framing says: Content-Length, chunked, or up to the close.
pub fn read_response(conn: &mut TcpStream, head_only: bool) -> Resp {
    let status_line = read_line(conn);
    let status = status_line
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
        let (name, value) = line.split_once(':').expect("a header line");
        headers.push((name.to_ascii_lowercase(), value.trim().to_string()));
    }
    let mut resp = Resp {
        status,
        headers,
        body: Vec::new(),
    };
    if head_only || status < 200 || status == 204 || status == 304 {
        return resp;
    }
    if let Some(length) = resp.header("content-length") {
        resp.body = read_exact(conn, length.parse().unwrap());
    } else if resp.header("transfer-encoding").as_deref() == Some("chunked") {
        loop {
            let size = usize::from_str_radix(read_line(conn).split(';').next().unwrap(), 16)
                .expect("a chunk size");
            if size == 0 {
                while !read_line(conn).is_empty() {}
                break;
            }
            resp.body.extend(read_exact(conn, size));
            assert_eq!(read_line(conn), "", "CRLF after a chunk");
        }
    } else {
        conn.read_to_end(&mut resp.body).unwrap();
    }
    resp
}
