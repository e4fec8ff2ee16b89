//! Test harness: runs the real `forkpool` binary as a subprocess on
//! loopback, reads its logs as they come, and cleans up every process it
//! started, by pid, whatever happens to the test.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

mod require;
#[allow(unused_imports)]
pub use require::{require, require_program, under_ci};

/// Lines a process printed, with a condition variable to wait on new ones.
#[derive(Default)]
pub struct Lines {
    lines: Mutex<Vec<String>>,
    grew: Condvar,
}

impl Lines {
    fn push(&self, line: String) {
        self.lines.lock().unwrap().push(line);
        self.grew.notify_all();
    }

    /// Waits until the lines so far satisfy `done`; false on timeout.
    fn wait_until(&self, timeout: Duration, done: impl Fn(&[String]) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut lines = self.lines.lock().unwrap();
        loop {
            if done(&lines) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            lines = self.grew.wait_timeout(lines, deadline - now).unwrap().0;
        }
    }

    /// Waits until `count` lines contain `needle`; false on timeout.
    pub fn wait_for_count(&self, needle: &str, count: usize, timeout: Duration) -> bool {
        self.wait_until(timeout, |lines| {
            lines.iter().filter(|l| l.contains(needle)).count() >= count
        })
    }

    /// Waits for one line containing every one of `needles`; false on
    /// timeout.
    pub fn wait_for_all(&self, needles: &[&str], timeout: Duration) -> bool {
        self.wait_until(timeout, |lines| {
            lines
                .iter()
                .any(|l| needles.iter().all(|needle| l.contains(needle)))
        })
    }

    /// Waits for one line containing `needle`.
    pub fn wait_for(&self, needle: &str, timeout: Duration) -> bool {
        self.wait_for_count(needle, 1, timeout)
    }

    /// How many lines so far contain `needle`.
    pub fn count(&self, needle: &str) -> usize {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// Everything so far, for failure messages.
    pub fn dump(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }
}

fn collect(stream: impl Read + Send + 'static, into: Arc<Lines>) {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            match line {
                Ok(line) => into.push(line),
                Err(_) => break,
            }
        }
    });
}

/// A running `forkpool demo` or `forkpool run`.
pub struct DemoPool {
    child: Option<Child>,
    pub pid: i32,
    pub addr: SocketAddr,
    pub stdout: Arc<Lines>,
    pub stderr: Arc<Lines>,
    /// Every child pid ever seen, so Drop can kill leftovers.
    seen_children: Mutex<Vec<i32>>,
    /// The control socket `forkpool status` reads.
    pub control: std::path::PathBuf,
}

/// Whether `pid` ignores signal `sig` (its `SigIgn` mask in `/proc`).
pub fn ignores_signal(pid: i32, sig: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0);
    mask & (1 << (sig - 1)) != 0
}

/// Pool options for exactly one child, which the pool neither grows past
/// nor retires for being idle.
pub const ONE_CHILD: [&str; 8] = [
    "--min-children",
    "1",
    "--max-children",
    "1",
    "--min-spare",
    "0",
    "--max-spare",
    "1",
];

/// Whether `pool` runs in `kernel` dispatch; where the kernel refused the
/// eBPF program it fell back, and (see [`require`]) this fails under CI.
pub fn require_kernel_dispatch(pool: &DemoPool) -> bool {
    let status = pool.status();
    require(
        status["dispatch"] == "kernel",
        &format!("kernel dispatch ({})", status["dispatch_fallback"]),
        "run as root on Linux 5.12 or later (CAP_BPF)",
    )
}

/// A fresh path in the temp dir, unique to this test process.
pub fn temp_path(what: &str) -> std::path::PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    std::env::temp_dir().join(format!("forkpool-test-{}-{n}-{what}", std::process::id()))
}

pub fn forkpool_bin() -> &'static str {
    env!("CARGO_BIN_EXE_forkpool")
}

impl DemoPool {
    /// Starts `forkpool demo --listen 127.0.0.1:0 ARGS` with debug logs.
    pub fn start(args: &[&str]) -> DemoPool {
        Self::start_with(args, &[])
    }

    /// Like [`DemoPool::start`], with extra environment variables.
    pub fn start_with(args: &[&str], env: &[(&str, &str)]) -> DemoPool {
        Self::start_from(std::path::Path::new(forkpool_bin()), args, env)
    }

    /// Like [`DemoPool::start_with`], running the binary at `program`.
    pub fn start_from(program: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> DemoPool {
        let mut command = Command::new(program);
        command.arg("demo").envs(env.iter().copied());
        Self::launch(command, args, &[], true)
    }

    /// Starts `forkpool run --listen 127.0.0.1:0 ARGS -- CMD` with debug
    /// logs and waits until the pool is ready.
    pub fn start_run(args: &[&str], cmd: &[&str]) -> DemoPool {
        let mut command = Command::new(forkpool_bin());
        command.arg("run");
        Self::launch(command, args, cmd, true)
    }

    /// Like [`DemoPool::start_run`] without waiting for the pool to be
    /// ready: for workers that never stay ready long enough to make it so
    /// (send no signals to such a pool before its status answers).
    pub fn start_run_unready(args: &[&str], cmd: &[&str]) -> DemoPool {
        let mut command = Command::new(forkpool_bin());
        command.arg("run");
        Self::launch(command, args, cmd, false)
    }

    /// Runs `command` (a program and its subcommand, or a wrapper that
    /// `exec`s one) with ARGS, a `--listen` and `--control` unless ARGS
    /// have their own, then `-- CMD` if CMD is not empty, with debug logs.
    /// Waits for the listening address and, if `wait_ready`, for the pool
    /// to say it is ready (workers that never start never make it so).
    pub fn launch(mut command: Command, args: &[&str], cmd: &[&str], wait_ready: bool) -> DemoPool {
        let mut control = temp_path("control.sock");
        if !args.contains(&"--listen") {
            command.args(["--listen", "127.0.0.1:0"]);
        }
        match args.iter().position(|a| *a == "--control") {
            Some(i) => control = args[i + 1].into(),
            None => {
                command.arg("--control").arg(&control);
            }
        }
        command.args(args);
        if !cmd.is_empty() {
            command.arg("--").args(cmd);
        }
        command
            .env("FORKPOOL_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // A binary copied a moment ago may still be open for writing in a
        // process another test thread is forking (ETXTBSY until it execs).
        let mut attempts = 0;
        let mut child = loop {
            match command.spawn() {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && attempts < 50 => {
                    attempts += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                other => break other.expect("start forkpool"),
            }
        };
        let pid = child.id() as i32;
        let stdout = Arc::new(Lines::default());
        let stderr = Arc::new(Lines::default());
        collect(child.stdout.take().unwrap(), Arc::clone(&stdout));
        collect(child.stderr.take().unwrap(), Arc::clone(&stderr));
        let mut pool = DemoPool {
            child: Some(child),
            pid,
            addr: "127.0.0.1:1".parse().unwrap(),
            stdout,
            stderr,
            seen_children: Mutex::new(Vec::new()),
            control,
        };
        assert!(
            pool.stdout
                .wait_for("forkpool: listening on", Duration::from_secs(30)),
            "pool did not start; stderr:\n{}",
            pool.stderr.dump()
        );
        // Signals sent before the supervisor's handlers exist would take
        // their default action: wait until status says the pool has been
        // ready (the handlers exist before status is served).
        assert!(
            !wait_ready || pool.wait_ready(Duration::from_secs(30)),
            "pool never became ready (status without `ready` comes from a \
             supervisor built before it: `cargo build -p forkpool-bench`); \
             status: {:?}\nstderr:\n{}",
            pool.try_status(),
            pool.stderr.dump()
        );
        // The first TCP listener, if any, is the one `get` talks to.
        let tcp = pool
            .stdout
            .lines
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| l.strip_prefix("forkpool: listening on "))
            .find_map(|rest| rest.split(' ').next()?.parse().ok());
        if let Some(addr) = tcp {
            pool.addr = addr;
        }
        pool
    }

    /// The supervisor's current children, from /proc.
    pub fn children(&self) -> Vec<i32> {
        let path = format!("/proc/{0}/task/{0}/children", self.pid);
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let pids: Vec<i32> = text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        let mut seen = self.seen_children.lock().unwrap();
        for p in &pids {
            if !seen.contains(p) {
                seen.push(*p);
            }
        }
        pids
    }

    /// Polls the child count (there is no event for it) until `cond` holds.
    pub fn wait_children(&self, timeout: Duration, cond: impl Fn(usize) -> bool) -> bool {
        self.wait_child_pids(timeout, |pids| cond(pids.len()))
    }

    /// Polls the list of child pids until `cond` holds.
    pub fn wait_child_pids(&self, timeout: Duration, cond: impl Fn(&[i32]) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if cond(&self.children()) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILLs child `victim` and waits until the supervisor has counted its
    /// death, spawned its `spawned_total`-th child and is back to `live`
    /// children without the victim.
    pub fn kill_and_await_replacement(&self, victim: i32, spawned_total: usize, live: usize) {
        kill9(victim);
        let wait = Duration::from_secs(5);
        assert!(
            self.wait_status(wait, |s| total(s, "died") >= 1
                && total(s, "spawned") >= spawned_total as u64)
                .is_some(),
            "no death counted and no {spawned_total}th spawn\n{}",
            self.stderr.dump()
        );
        assert!(
            self.wait_child_pids(wait, |p| p.len() == live && !p.contains(&victim)),
            "no replacement for {victim}\n{}",
            self.stderr.dump()
        );
    }

    /// Sends a signal to the supervisor.
    pub fn signal(&self, sig: i32) {
        // SAFETY-free: nix is not a dev-dependency here; use the kill command.
        let status = Command::new("kill")
            .args([format!("-{sig}"), self.pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the supervisor to exit; returns its status.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut()?;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `forkpool status --json` for this pool, parsed; a failure panics
    /// with what the pool logged, to say why it did not answer.
    pub fn status(&self) -> serde_json::Value {
        self.try_status()
            .unwrap_or_else(|e| panic!("{e}\nthe pool's log:\n{}", self.stderr.dump()))
    }

    /// `forkpool status --json` for this pool, or why it failed.
    pub fn try_status(&self) -> Result<serde_json::Value, String> {
        let out = Command::new(forkpool_bin())
            .args(["status", "--json", "--control"])
            .arg(&self.control)
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "status failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| format!("status JSON: {e}"))
    }

    /// Waits until status answers with `ready` (the pool has been ready:
    /// `min_children`, at least one, were up); false on timeout.
    fn wait_ready(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.try_status().is_ok_and(|s| s["ready"] == true) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Polls `forkpool status --json` until `cond` holds for a snapshot and
    /// returns that snapshot; `None` once `timeout` has passed. The way to
    /// wait for the supervisor to reach a state, rather than for its log.
    pub fn wait_status(
        &self,
        timeout: Duration,
        cond: impl Fn(&serde_json::Value) -> bool,
    ) -> Option<serde_json::Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let status = self.status();
            if cond(&status) {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the supervisor reports `n` idle children (all started
    /// and ready, none busy); false on timeout.
    pub fn wait_idle(&self, n: u64, timeout: Duration) -> bool {
        self.wait_status(timeout, |s| s["idle"] == n).is_some()
    }

    /// Waits until `totals.NAME` in status is at least `at_least`; false
    /// on timeout.
    pub fn wait_total(&self, name: &str, at_least: u64, timeout: Duration) -> bool {
        self.wait_status(timeout, |s| total(s, name) >= at_least)
            .is_some()
    }

    /// A `GET` with `Connection: close`.
    pub fn get(&self, path: &str) -> Result<Response, String> {
        get(self.addr, path)
    }
}

/// `totals.NAME` of a status snapshot (0 when absent).
pub fn total(status: &serde_json::Value, name: &str) -> u64 {
    status["totals"][name].as_u64().unwrap_or(0)
}

/// `totals.killed_by.REASON` of a status snapshot (0 when absent).
pub fn killed_by(status: &serde_json::Value, reason: &str) -> u64 {
    status["totals"]["killed_by"][reason].as_u64().unwrap_or(0)
}

/// The totals the supervisor printed on stdout as it exited
/// (`forkpool: totals {json}`), shaped like a status snapshot
/// (`{"totals": ...}`) so `total` and `killed_by` read them. Panics when
/// there is no such line.
pub fn final_totals(pool: &DemoPool) -> serde_json::Value {
    const PREFIX: &str = "forkpool: totals ";
    assert!(
        pool.stdout.wait_for(PREFIX, Duration::from_secs(2)),
        "no totals line on stdout:\n{}",
        pool.stdout.dump()
    );
    let dump = pool.stdout.dump();
    let json = dump.lines().find_map(|l| l.strip_prefix(PREFIX)).unwrap();
    serde_json::json!({ "totals": serde_json::from_str::<serde_json::Value>(json).unwrap() })
}

/// Whether process `pid` is running: a reaped process has no /proc
/// entry, and a zombie counts as gone.
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

impl Drop for DemoPool {
    fn drop(&mut self) {
        // Freeze the supervisor first, so it cannot start a child after
        // the list is taken; a child that ignores SIGTERM would otherwise
        // outlive the test.
        let running = self
            .child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)));
        if running {
            let _ = Command::new("kill")
                .args(["-STOP", &self.pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
        let _ = self.children();
        for pid in self.seen_children.lock().unwrap().iter() {
            kill9(*pid);
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// SIGKILL by pid, ignoring a process that is already gone.
pub fn kill9(pid: i32) {
    let _ = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// Sends a signal by name or number to any pid.
pub fn signal_pid(pid: i32, sig: &str) {
    let status = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{sig} {pid} failed");
}

/// A parsed response.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub slot: Option<usize>,
    pub pid: Option<i32>,
    pub body: String,
}

/// One `GET` on a fresh connection, with a 20 s bound.
pub fn get(addr: SocketAddr, path: &str) -> Result<Response, String> {
    let mut stream = try_send(addr, path)?;
    let mut raw = String::new();
    stream
        .read_to_string(&mut raw)
        .map_err(|e| format!("read: {e}"))?;
    parse_response(&raw)
}

/// Connects and sends a `GET` with `Connection: close`, and returns the
/// connection for the answer to be read later. `connect` returns once the
/// connection is in the listener's backlog, whether or not anyone has
/// accepted it yet.
pub fn send(addr: SocketAddr, path: &str) -> TcpStream {
    try_send(addr, path).unwrap()
}

fn try_send(addr: SocketAddr, path: &str) -> Result<TcpStream, String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("write: {e}"))?;
    Ok(stream)
}

pub fn parse_response(raw: &str) -> Result<Response, String> {
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("incomplete response: {raw:?}"))?;
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line: {raw:?}"))?;
    let mut slot = None;
    let mut pid = None;
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            match name.to_ascii_lowercase().as_str() {
                "x-forkpool-slot" => slot = value.trim().parse().ok(),
                "x-forkpool-pid" => pid = value.trim().parse().ok(),
                _ => {}
            }
        }
    }
    Ok(Response {
        status,
        slot,
        pid,
        body: body.to_string(),
    })
}

/// A pool of one worker (in handoff) gets 8 slow requests at once
/// (`/?work_ms=50`): while it serves one, the others wait in the backlog,
/// and it takes each next one itself (`N`) rather than going idle and
/// being handed it. Panics, with the pool's status, when it did not.
pub fn assert_takes_the_next_waiting_connection(pool: &DemoPool) {
    for r in concurrent_gets(pool.addr, "/?work_ms=50", 8) {
        let r = r.unwrap_or_else(|e| panic!("{e}\n{}", pool.stderr.dump()));
        assert_eq!(r.status, 200);
    }
    let status = pool.status();
    assert_eq!(total(&status, "accepted"), 8, "{status}");
    assert!(total(&status, "taken_next") >= 1, "{status}");
    assert_eq!(total(&status, "died"), 0, "{status}");
}

/// Runs `n` requests at once on threads and returns their results.
pub fn concurrent_gets(addr: SocketAddr, path: &str, n: usize) -> Vec<Result<Response, String>> {
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let path = path.to_string();
            std::thread::spawn(move || get(addr, &path))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Runs requests back to back from `threads` threads until `stop`.
pub fn continuous_load(
    addr: std::net::SocketAddr,
    threads: usize,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> (
    Arc<std::sync::atomic::AtomicUsize>,
    Vec<std::thread::JoinHandle<Vec<String>>>,
) {
    let ok = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handles = (0..threads)
        .map(|_| {
            let stop = Arc::clone(&stop);
            let ok = Arc::clone(&ok);
            std::thread::spawn(move || {
                let mut failures = Vec::new();
                let deadline = Instant::now() + Duration::from_secs(60);
                while !stop.load(std::sync::atomic::Ordering::SeqCst) && Instant::now() < deadline {
                    match get(addr, "/?work_ms=5") {
                        Ok(r) if r.status == 200 => {
                            ok.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                        Ok(r) => failures.push(format!("status {}", r.status)),
                        Err(e) => failures.push(e),
                    }
                }
                failures
            })
        })
        .collect();
    (ok, handles)
}

// --- Metrics (observe.rs, operations.rs) ---------------------------------

/// `GET /metrics` from the pool's `--metrics` endpoint (the address it
/// printed), asserting a 200 answer; the whole response.
pub fn scrape_metrics(pool: &DemoPool) -> String {
    let line = pool
        .stdout
        .dump()
        .lines()
        .find_map(|l| {
            l.strip_prefix("forkpool: metrics on http://")
                .map(str::to_string)
        })
        .expect("metrics line");
    let addr = line.trim_end_matches("/metrics").to_string();
    let mut stream = TcpStream::connect(&addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    text
}

// --- Keep-alive turns (psgi.rs, wsgi.rs) ----------------------------------

/// Drives a kept-alive connection whose first request went out at
/// `opened`, while another client waits for the one worker: `ask` sends
/// the next request on it and says whether the answer closed it.
/// Requests go a tenth of TURN apart (at least 50 ms), for at most two
/// turns and ten seconds. Asserts that the connection was kept alive for
/// its turn (at least three answers within it, unless TURN is zero) and
/// closed by the first answer after it.
pub fn check_keepalive_turn(
    label: &str,
    turn: Duration,
    opened: Instant,
    mut ask: impl FnMut() -> bool,
) {
    let pace = (turn / 10).max(Duration::from_millis(50));
    let mut kept_within_turn = 0;
    let closed_after = loop {
        let sent = opened.elapsed();
        assert!(
            sent < (turn * 2).max(Duration::from_secs(10)),
            "{label}: still kept alive after {sent:?}, with a client waiting"
        );
        if ask() {
            break sent;
        }
        // The server's clock for the turn starts a little after ours.
        assert!(
            sent < turn + Duration::from_millis(50),
            "{label}: still kept alive {sent:?} after the first request, with a client waiting"
        );
        if opened.elapsed() < turn {
            kept_within_turn += 1;
        }
        std::thread::sleep(pace);
    };
    assert!(
        closed_after >= turn,
        "{label}: closed {closed_after:?} after the first request, within its turn of {turn:?}"
    );
    if !turn.is_zero() {
        assert!(
            kept_within_turn >= 3,
            "{label}: only {kept_within_turn} requests kept alive within the turn"
        );
    }
}

/// How many TCP segments `stream` has received so far (`tcpi_segs_in`
/// from the kernel's `TCP_INFO`), handshake included.
pub fn segments_received(stream: &TcpStream) -> u32 {
    use std::os::fd::AsRawFd;
    // SAFETY: all-zero bytes are a valid `tcp_info` (plain integers).
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` and `len` are live and `len` is `info`'s size; the
    // kernel writes at most `len` bytes and says how many.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0, "TCP_INFO: {}", std::io::Error::last_os_error());
    info.tcpi_segs_in
}

/// Asserts that a `Connection: close` answer and the end of the
/// connection reach the client in one segment: the client receives the
/// handshake's SYN-ACK, the acknowledgement of its request, and the answer
/// carrying the FIN. A server that sends its FIN after the answer costs
/// the client a fourth segment (and one more acknowledgement). Of 10
/// connections in a row, 8 must: the kernel sends held bytes by itself
/// after 200 ms, which a worker stalled that long between its answer and
/// its close (a loaded test machine) would see.
pub fn assert_closing_answer_carries_the_fin(addr: SocketAddr, path: &str) {
    // One write, so the request is one segment and gets one acknowledgement.
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    let mut segments = Vec::new();
    for _ in 0..10 {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut raw = String::new();
        stream.read_to_string(&mut raw).unwrap();
        let answer = parse_response(&raw).unwrap();
        assert_eq!(answer.status, 200, "{raw}");
        segments.push(segments_received(&stream));
    }
    let together = segments.iter().filter(|&&n| n <= 3).count();
    assert!(
        together >= 8,
        "segments received per closing answer: {segments:?}: the FIN came apart from the answer"
    );
}

/// Sends one TCP SYN to 127.0.0.1:`port` from a port nothing listens on,
/// through a raw socket (root): the SYN-ACK is answered with a reset by
/// this machine's kernel, so the handshake never completes.
pub fn send_bare_syn(port: u16, source_port: u16) {
    // SAFETY: a plain socket call; the descriptor is owned at once.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_TCP) };
    assert!(
        raw >= 0,
        "a raw socket needs root: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: `raw` is a new descriptor nothing else owns.
    let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
    let mut tcp = [0u8; 20];
    tcp[0..2].copy_from_slice(&source_port.to_be_bytes());
    tcp[2..4].copy_from_slice(&port.to_be_bytes());
    tcp[4..8].copy_from_slice(&0x1234_5678u32.to_be_bytes()); // sequence
    tcp[12] = 5 << 4; // header length: 5 words
    tcp[13] = 0x02; // SYN
    tcp[14..16].copy_from_slice(&64_240u16.to_be_bytes()); // window
    let localhost = [127u8, 0, 0, 1];
    let mut sum: u32 = 0;
    let mut add = |bytes: &[u8]| {
        for pair in bytes.chunks(2) {
            sum += u32::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]));
        }
    };
    add(&localhost);
    add(&localhost);
    add(&[0, libc::IPPROTO_TCP as u8, 0, 20]);
    add(&tcp);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    tcp[16..18].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    let to = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(localhost),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: `tcp` and `to` are live buffers of the sizes given.
    let sent = unsafe {
        libc::sendto(
            std::os::fd::AsRawFd::as_raw_fd(&sock),
            tcp.as_ptr().cast(),
            tcp.len(),
            0,
            (&to as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    assert_eq!(sent, 20, "{}", std::io::Error::last_os_error());
}

/// A Python worker (the helper's `forkpool_worker`) that answers each
/// request with `200 ok` and then asks to leave (`worker.leave()`, `X`),
/// written to a temporary file: its path.
pub fn leaving_python_worker() -> std::path::PathBuf {
    let program = temp_path("leaving_worker.py");
    std::fs::write(
        &program,
        format!(
            "import sys\nsys.path.insert(0, {python:?})\nimport forkpool_worker\n\
             worker = forkpool_worker.Worker.from_env()\n\
             def handle(conn, listener):\n\
             \x20   head = b''\n\
             \x20   while b'\\r\\n\\r\\n' not in head:\n\
             \x20       head += conn.recv(65536) or b'\\r\\n\\r\\n'\n\
             \x20   conn.sendall(b'HTTP/1.0 200 OK\\r\\nContent-Length: 2\\r\\n\\r\\nok')\n\
             \x20   worker.leave()\n\
             worker.serve(handle)\n",
            python = concat!(env!("CARGO_MANIFEST_DIR"), "/../../clients/python"),
        ),
    )
    .unwrap();
    program
}
