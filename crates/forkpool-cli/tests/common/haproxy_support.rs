//! A real HAProxy in front of test pools: writes a config for the given
//! servers, runs `haproxy -f CFG -db` on loopback as a child (killed by pid
//! on Drop), reads each server's state and weight from its stats socket,
//! and drives load through it, counting answers per server.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::common::{parse_response, temp_path};

/// The response header the test config adds, naming the server that
/// answered (HAProxy's own name for it, e.g. `pool_a`).
pub const SERVED_BY: &str = "x-haproxy-server";

/// The `haproxy` program, or `None` when the test must return without
/// running (see `common::require`: under CI a missing HAProxy fails).
pub fn require_haproxy() -> Option<PathBuf> {
    super::common::require_program("haproxy", "run bash .ci/deps/haproxy.sh")
}

/// One backend server: a forkpool pool's listener.
#[derive(Debug, Clone)]
pub struct Server {
    /// HAProxy's name for it (letters, digits, `_`).
    pub name: String,
    /// The pool's listening address.
    pub addr: SocketAddr,
    /// A port on 127.0.0.1 answering HAProxy's agent check, if any.
    pub agent_port: Option<u16>,
}

/// A running HAProxy.
pub struct Haproxy {
    child: Option<Child>,
    /// Its pid.
    pub pid: i32,
    /// The frontend clients connect to.
    pub addr: SocketAddr,
    dir: PathBuf,
    stats: PathBuf,
}

/// One server's line of `show stat`.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerStat {
    /// The server's name.
    pub name: String,
    /// `UP`, `DOWN`, `DRAIN`, `MAINT`, `UP 1/2`, `NOLB`, ...
    pub status: String,
    /// The current effective weight.
    pub weight: u32,
    /// Connections open to it now.
    pub current: u64,
    /// Connections it has had in total.
    pub total: u64,
}

impl ServerStat {
    /// True when HAProxy considers it down (a health check failed `fall`
    /// times, or it was never up).
    pub fn is_down(&self) -> bool {
        self.status.starts_with("DOWN")
    }
}

/// A free loopback port. The socket is closed before HAProxy binds it, so
/// another process may take it in between: [`Haproxy::start`] retries.
fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// How HAProxy checks each server's health.
#[derive(Debug, Clone, Copy)]
pub enum Check<'a> {
    /// `option httpchk GET PATH`, expecting a 200: every 200 ms, 100 ms
    /// while a server's state changes.
    Http(&'a str),
    /// A plain TCP connect every `inter_ms` (`check inter 100ms`): HAProxy
    /// connects and closes without sending a byte.
    Tcp { inter_ms: u32 },
}

/// The test configuration: the example in `dist/haproxy/haproxy.cfg` (an
/// HTTP health check, and an agent check on the server's `agent_port` when
/// it has one), with short intervals so a test sees changes within a
/// second, a stats socket to read server states from, and a header naming
/// the server that answered.
pub fn config(frontend: SocketAddr, stats: &Path, servers: &[Server], check_path: &str) -> String {
    config_with(
        frontend,
        stats,
        servers,
        Check::Http(check_path),
        "leastconn",
    )
}

/// Like [`config`], with the health check `check` and `balance ALGORITHM`
/// (`leastconn`, `roundrobin`, ...).
pub fn config_with(
    frontend: SocketAddr,
    stats: &Path,
    servers: &[Server],
    check: Check,
    balance: &str,
) -> String {
    let (check_lines, intervals, server_check) = match check {
        Check::Http(path) => (
            format!("    option httpchk GET {path}\n    http-check expect status 200\n"),
            "inter 200ms fastinter 100ms downinter 200ms".to_string(),
            "check".to_string(),
        ),
        Check::Tcp { inter_ms: n } => (
            String::new(),
            format!("inter {n}ms fastinter {n}ms downinter {n}ms"),
            format!("check inter {n}ms"),
        ),
    };
    let mut cfg = format!(
        "global
    stats socket {stats} mode 600 level admin
    maxconn 1000

defaults
    mode http
    timeout connect 1s
    timeout client 30s
    timeout server 30s
    timeout queue 10s
    timeout check 1s
    retries 3
    option redispatch 1
    option http-server-close

frontend web
    bind {frontend}
    default_backend pools

backend pools
    balance {balance}
{check_lines}    http-response set-header {SERVED_BY} %s
    default-server {intervals} fall 2 rise 2 weight 100
",
        stats = stats.display(),
    );
    for s in servers {
        cfg.push_str(&format!("    server {} {} {server_check}", s.name, s.addr));
        if let Some(port) = s.agent_port {
            cfg.push_str(&format!(" agent-check agent-port {port} agent-inter 100ms"));
        }
        cfg.push('\n');
    }
    cfg
}

impl Haproxy {
    /// Writes the test config for `servers` and starts HAProxy, waiting
    /// until its stats socket answers and every server has been checked
    /// up.
    pub fn start(program: &Path, servers: &[Server], check_path: &str) -> Haproxy {
        Self::start_with(program, servers, Check::Http(check_path), "leastconn")
    }

    /// Like [`Haproxy::start`], with the health check `check` and `balance
    /// ALGORITHM` (see [`config_with`]).
    pub fn start_with(program: &Path, servers: &[Server], check: Check, balance: &str) -> Haproxy {
        let dir = temp_path("haproxy");
        std::fs::create_dir_all(&dir).unwrap();
        let stats = dir.join("stats.sock");
        let cfg_path = dir.join("haproxy.cfg");
        let mut attempts = 0;
        loop {
            attempts += 1;
            let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
            let cfg = config_with(addr, &stats, servers, check, balance);
            std::fs::write(&cfg_path, cfg).unwrap();
            let log = std::fs::File::create(dir.join("haproxy.log")).unwrap();
            let child = Command::new(program)
                .arg("-f")
                .arg(&cfg_path)
                .arg("-db")
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("start haproxy");
            let mut haproxy = Haproxy {
                pid: child.id() as i32,
                child: Some(child),
                addr,
                dir: dir.clone(),
                stats: stats.clone(),
            };
            match haproxy.wait_started(Duration::from_secs(10)) {
                Ok(()) => {
                    let all_up = haproxy.wait_for(Duration::from_secs(10), |stats| {
                        stats.len() == servers.len() && stats.iter().all(|s| s.status == "UP")
                    });
                    assert!(
                        all_up.is_some(),
                        "servers never all UP: {:?}\n{}",
                        haproxy.servers(),
                        haproxy.log()
                    );
                    return haproxy;
                }
                // The port was taken between free_port and HAProxy's bind.
                Err(log) if attempts < 3 && log.contains("cannot bind") => continue,
                Err(log) => panic!("haproxy did not start:\n{log}"),
            }
        }
    }

    /// Polls the stats socket until it answers; the log if HAProxy exits
    /// or the deadline passes.
    fn wait_started(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return Err(self.log());
            }
            if self.show_stat().is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What HAProxy printed so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("haproxy.log")).unwrap_or_default()
    }

    fn show_stat(&self) -> std::io::Result<String> {
        let mut socket = UnixStream::connect(&self.stats)?;
        socket.set_read_timeout(Some(Duration::from_secs(5)))?;
        socket.write_all(b"show stat\n")?;
        let mut out = String::new();
        socket.read_to_string(&mut out)?;
        Ok(out)
    }

    /// Every server's state, from `show stat` (a CSV whose first line,
    /// after `# `, names the columns).
    pub fn servers(&self) -> Vec<ServerStat> {
        let text = self.show_stat().expect("haproxy stats socket");
        let mut lines = text.lines();
        let header: Vec<&str> = lines
            .next()
            .and_then(|l| l.strip_prefix("# "))
            .expect("show stat header")
            .split(',')
            .collect();
        let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
        let (px, sv, status, weight, scur, stot) = (
            col("pxname"),
            col("svname"),
            col("status"),
            col("weight"),
            col("scur"),
            col("stot"),
        );
        lines
            .map(|l| l.split(',').collect::<Vec<_>>())
            .filter(|f| f.len() > stot && f[px] == "pools" && f[sv] != "BACKEND")
            .map(|f| ServerStat {
                name: f[sv].to_string(),
                status: f[status].to_string(),
                weight: f[weight].parse().unwrap_or(0),
                current: f[scur].parse().unwrap_or(0),
                total: f[stot].parse().unwrap_or(0),
            })
            .collect()
    }

    /// Column `column` of server `name`'s line of `show stat` (e.g.
    /// `check_status`: `L4OK` for a TCP check that connected, `L7OK` for
    /// an HTTP one; `agent_status`).
    pub fn server_column(&self, name: &str, column: &str) -> Option<String> {
        let text = self.show_stat().ok()?;
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next()?.strip_prefix("# ")?.split(',').collect();
        let (px, sv) = (
            header.iter().position(|h| *h == "pxname")?,
            header.iter().position(|h| *h == "svname")?,
        );
        let col = header.iter().position(|h| *h == column)?;
        lines
            .map(|l| l.split(',').collect::<Vec<_>>())
            .find(|f| f.len() > col.max(sv).max(px) && f[px] == "pools" && f[sv] == name)
            .map(|f| f[col].to_string())
    }

    /// One server's state.
    pub fn server(&self, name: &str) -> ServerStat {
        self.servers()
            .into_iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no server {name} in haproxy's stats"))
    }

    /// Polls the stats until `cond` holds; the stats then, or `None` at
    /// the deadline.
    pub fn wait_for(
        &self,
        timeout: Duration,
        cond: impl Fn(&[ServerStat]) -> bool,
    ) -> Option<Vec<ServerStat>> {
        let deadline = Instant::now() + timeout;
        loop {
            let stats = self.servers();
            if cond(&stats) {
                return Some(stats);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One request through the balancer.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// When it was sent, from the start of the load.
    pub sent: Duration,
    /// When its answer (or error) came.
    pub done: Duration,
    /// The server that answered a 200, or `None` for a failure.
    pub server: Option<String>,
    /// What went wrong, for a failure.
    pub error: Option<String>,
}

/// Requests sent back to back from a few threads through HAProxy, each
/// outcome recorded with its times and the server that answered.
pub struct Load {
    stop: Arc<AtomicBool>,
    started: Instant,
    outcomes: Arc<Mutex<Vec<Outcome>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    /// Starts `threads` threads sending `GET path` to `addr`; each stops
    /// at [`Load::finish`] or after `limit`, whichever comes first.
    pub fn start(addr: SocketAddr, threads: usize, path: &str, limit: Duration) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let outcomes = Arc::new(Mutex::new(Vec::new()));
        let started = Instant::now();
        let threads = (0..threads)
            .map(|_| {
                let (stop, outcomes, path) =
                    (Arc::clone(&stop), Arc::clone(&outcomes), path.to_string());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) && started.elapsed() < limit {
                        let sent = started.elapsed();
                        let (server, error) = match request(addr, &path) {
                            Ok(server) => (Some(server), None),
                            Err(e) => (None, Some(e)),
                        };
                        let done = started.elapsed();
                        outcomes.lock().unwrap().push(Outcome {
                            sent,
                            done,
                            server,
                            error,
                        });
                    }
                })
            })
            .collect();
        Load {
            stop,
            started,
            outcomes,
            threads,
        }
    }

    /// Time since the load started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Requests answered so far.
    pub fn count(&self) -> usize {
        self.outcomes.lock().unwrap().len()
    }

    /// Waits until `n` more requests than now have been answered, or the
    /// deadline; true if they were.
    pub fn wait_more(&self, n: usize, timeout: Duration) -> bool {
        let target = self.count() + n;
        let deadline = Instant::now() + timeout;
        while self.count() < target {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    /// Stops the threads and returns every outcome, in order of sending.
    pub fn finish(mut self) -> Outcomes {
        self.stop.store(true, Ordering::SeqCst);
        for t in std::mem::take(&mut self.threads) {
            t.join().unwrap();
        }
        let mut all = std::mem::take(&mut *self.outcomes.lock().unwrap());
        all.sort_by_key(|o| o.sent);
        Outcomes(all)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// One request on a fresh connection, bounded in time; the answering
/// server's name for a 200.
fn request(addr: SocketAddr, path: &str) -> Result<String, String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect: {e}"))?;
    let limit = Some(Duration::from_secs(20));
    stream
        .set_read_timeout(limit)
        .and_then(|()| stream.set_write_timeout(limit))
        .map_err(|e| e.to_string())?;
    let head = format!("GET {path} HTTP/1.1\r\nHost: forkpool-test\r\nConnection: close\r\n\r\n");
    stream
        .write_all(head.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    server_of_answer(&mut stream)
}

/// Reads the answer on `stream` to its close: the name of the HAProxy
/// server that answered a 200.
pub fn server_of_answer(stream: &mut TcpStream) -> Result<String, String> {
    let mut raw = String::new();
    stream
        .read_to_string(&mut raw)
        .map_err(|e| format!("read: {e}"))?;
    let response = parse_response(&raw)?;
    if response.status != 200 {
        return Err(format!("status {}", response.status));
    }
    raw.split("\r\n\r\n")
        .next()
        .unwrap_or("")
        .lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case(SERVED_BY))
        .map(|(_, value)| value.trim().to_string())
        .ok_or_else(|| format!("no {SERVED_BY} header in {raw:?}"))
}

/// Prints what a load through two pools (`pool_a`, `pool_b`) did, with
/// its timeline, and fails the test if any request failed.
pub fn report(what: &str, outcomes: &Outcomes) {
    println!(
        "{what}: sent {}, failed {}, pool_a {}, pool_b {}\n{}",
        outcomes.sent(),
        outcomes.failures().len(),
        outcomes.served_by("pool_a"),
        outcomes.served_by("pool_b"),
        outcomes.timeline(&["pool_a", "pool_b"], Duration::from_millis(500))
    );
    assert!(
        outcomes.failures().is_empty(),
        "{what}: failed requests: {:?}",
        outcomes.failures()
    );
}

/// Everything a load produced.
#[derive(Debug)]
pub struct Outcomes(pub Vec<Outcome>);

impl Outcomes {
    /// Requests sent.
    pub fn sent(&self) -> usize {
        self.0.len()
    }

    /// The failed requests.
    pub fn failures(&self) -> Vec<&Outcome> {
        self.0.iter().filter(|o| o.server.is_none()).collect()
    }

    /// Requests answered by `server`.
    pub fn served_by(&self, server: &str) -> usize {
        self.0
            .iter()
            .filter(|o| o.server.as_deref() == Some(server))
            .count()
    }

    /// Requests answered by `server` among those sent in `[from, to)`.
    pub fn served_by_between(&self, server: &str, from: Duration, to: Duration) -> usize {
        self.0
            .iter()
            .filter(|o| o.sent >= from && o.sent < to && o.server.as_deref() == Some(server))
            .count()
    }

    /// A line per window of `step`: requests sent in it, and how many each
    /// server answered and how many failed, for reports.
    pub fn timeline(&self, servers: &[&str], step: Duration) -> String {
        let end = self.0.last().map_or(Duration::ZERO, |o| o.sent);
        let mut out = String::new();
        let mut from = Duration::ZERO;
        while from <= end {
            let to = from + step;
            let window: Vec<_> = self
                .0
                .iter()
                .filter(|o| o.sent >= from && o.sent < to)
                .collect();
            out.push_str(&format!(
                "{:>6.1}s sent {:>4}",
                from.as_secs_f64(),
                window.len()
            ));
            for s in servers {
                let n = window
                    .iter()
                    .filter(|o| o.server.as_deref() == Some(*s))
                    .count();
                out.push_str(&format!("  {s} {n:>4}"));
            }
            let failed = window.iter().filter(|o| o.server.is_none()).count();
            out.push_str(&format!("  failed {failed}\n"));
            from = to;
        }
        out
    }
}
