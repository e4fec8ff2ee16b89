//! Issue 44, "the network is an input too": what clients that misbehave on
//! the wire do to the clients that do not. Black box: the real `forkpool`
//! binary, real sockets on 127.0.0.1.
//!
//! Each fault is applied to a fresh pool (2 children, up to 8); the pool
//! is given up to 2 s to have 2 idle children again (it grows past the
//! children that held-open connections hold); then a stream of real
//! requests is checked: a `GET` every 50 ms for 1.5 s, then 8 at once,
//! each given 3 s. None may fail and the slowest answer must come within
//! 250 ms; afterwards status must show no child killed or dead and every
//! child it lists alive. The faults:
//!
//! 1. 4 connections reset right after the handshake (`SO_LINGER` {on, 0},
//!    then close: an RST, nothing sent);
//! 2. 4 connections closed with nothing sent (a FIN);
//! 3. 4 connections that send half a request line (`GET / HT`) and reset;
//! 4. 4 connections held open with nothing sent, for the whole stream;
//! 5. a reset every 20 ms for as long as the stream lasts;
//! 6. 4 SYNs whose handshake never completes (sent from a raw socket, so
//!    this machine's kernel answers the SYN-ACK with a reset): without
//!    deferred accept, the one way a connection never reaches the accept
//!    queue.
//!
//! The matrix: `forkpool demo` in every dispatch mode, with
//! `--defer-accept 0` and `5s` (the demo's default), and the example HTTP
//! workers of the Python, Perl, Ruby and C helpers under `forkpool run` in
//! kernel dispatch (`--defer-accept 0`, `run`'s default; Python with `5s`
//! too). One `#[test]` a row of the matrix runs the six faults in turn; a failure prints the
//! row's table (worker, mode, defer, fault, failed, slowest) before it
//! panics. The tests take turns: they measure latency, and two at once on
//! a small machine would measure each other.
//!
//! The pool may grow to 8 children so that the 4 held-open connections,
//! which hold a child each where the pool hands them over at once (no
//! defer), leave children for the stream: with 4 the pool would be full
//! of idle clients for the demo's 5 s read timeout, in every mode, which
//! is the pool's size and not a fault of its dispatch.

#[path = "common/bench_bins.rs"]
mod bench_bins;
#[path = "common/c_worker_build.rs"]
mod c_worker_build;
mod common;
#[path = "common/example_workers.rs"]
mod example_workers;
#[path = "common/rack_support.rs"]
mod rack_support;

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use c_worker_build::BuiltWorker;
use common::{alive, parse_response, require_kernel_dispatch, require_program, total, DemoPool};
use example_workers::{PERL_WORKER, PYTHON_WORKER};
use rack_support::RUBY_DIR;

/// The pool: 2 children to start with, room for the held-open ones.
const POOL: [&str; 4] = ["--min-children", "2", "--max-children", "8"];
/// How many connections faults 1 to 4 make.
const FAULTY: usize = 4;
/// The stream: one request this often ...
const PACE: Duration = Duration::from_millis(50);
/// ... this many times (1.5 s) ...
const PACED: u32 = 30;
/// ... then this many at once.
const BURST: usize = 8;
/// Each request's whole time: connect, send, read to the close.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(3);
/// The slowest answer allowed.
const SLOWEST: Duration = Duration::from_millis(250);
/// Fault 5: one reset this often ...
const STORM_EVERY: Duration = Duration::from_millis(20);
/// ... and never more than this many, nor for longer than this.
const STORM_MAX: usize = 1000;
const STORM_LONGEST: Duration = Duration::from_secs(15);
/// The longest the stream waits for the pool to answer a fault.
const SETTLE: Duration = Duration::from_secs(2);
/// The longest wait for a pool to be ready and idle.
const PATIENCE: Duration = Duration::from_secs(20);

/// `clients/ruby/example_http_worker.rb`.
const RUBY_WORKER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../clients/ruby/example_http_worker.rb"
);

/// Takes this file's turn (see the top of the file).
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    ResetAfterConnect,
    CloseWithNothingSent,
    HalfLineThenReset,
    HeldOpen,
    ResetStorm,
    HandshakeNeverDone,
}

impl Fault {
    const ALL: [Fault; 6] = [
        Fault::ResetAfterConnect,
        Fault::CloseWithNothingSent,
        Fault::HalfLineThenReset,
        Fault::HeldOpen,
        Fault::ResetStorm,
        Fault::HandshakeNeverDone,
    ];

    fn name(self) -> &'static str {
        match self {
            Fault::ResetAfterConnect => "4 resets after connect",
            Fault::CloseWithNothingSent => "4 closes, nothing sent",
            Fault::HalfLineThenReset => "4 half lines, then reset",
            Fault::HeldOpen => "4 held open, nothing sent",
            Fault::ResetStorm => "a reset every 20 ms",
            Fault::HandshakeNeverDone => "4 SYNs, handshake never done",
        }
    }

    /// Applies the fault to the pool at `addr`; what goes on during the
    /// stream (held connections, the storm) lasts until [`Active::end`].
    fn begin(self, addr: SocketAddr) -> Active {
        let mut active = Active::default();
        match self {
            Fault::ResetAfterConnect => {
                for conn in (0..FAULTY).filter_map(|_| connect(addr)) {
                    reset(conn);
                    active.made += 1;
                }
            }
            Fault::CloseWithNothingSent => {
                for conn in (0..FAULTY).filter_map(|_| connect(addr)) {
                    drop(conn);
                    active.made += 1;
                }
            }
            Fault::HalfLineThenReset => {
                for mut conn in (0..FAULTY).filter_map(|_| connect(addr)) {
                    let _ = conn.write_all(b"GET / HT");
                    reset(conn);
                    active.made += 1;
                }
            }
            Fault::HeldOpen => {
                active.held = (0..FAULTY).filter_map(|_| connect(addr)).collect();
                active.made = active.held.len();
            }
            Fault::ResetStorm => {
                let stop = Arc::new(AtomicBool::new(false));
                let count = Arc::new(AtomicUsize::new(0));
                let (stop2, count2) = (Arc::clone(&stop), Arc::clone(&count));
                let thread = std::thread::spawn(move || {
                    let start = Instant::now();
                    let mut next = start;
                    for _ in 0..STORM_MAX {
                        if stop2.load(Ordering::SeqCst) || start.elapsed() > STORM_LONGEST {
                            break;
                        }
                        if let Some(conn) = connect(addr) {
                            reset(conn);
                            count2.fetch_add(1, Ordering::SeqCst);
                        }
                        next += STORM_EVERY;
                        std::thread::sleep(next.saturating_duration_since(Instant::now()));
                    }
                });
                active.storm = Some((stop, count, thread));
            }
            Fault::HandshakeNeverDone => {
                let base = 40_000 + (std::process::id() % 5_000) as u16 * 4;
                for n in 0..FAULTY as u16 {
                    common::send_bare_syn(addr.port(), base + n);
                    active.made += 1;
                }
            }
        }
        active
    }
}

/// What a fault keeps going while the stream runs.
#[derive(Default)]
struct Active {
    /// Connections made (faults 1 to 4).
    made: usize,
    held: Vec<TcpStream>,
    storm: Option<(Arc<AtomicBool>, Arc<AtomicUsize>, JoinHandle<()>)>,
}

impl Active {
    /// Closes the held connections and stops the storm; a note saying how
    /// much of the fault there was.
    fn end(self) -> String {
        drop(self.held);
        match self.storm {
            Some((stop, count, thread)) => {
                stop.store(true, Ordering::SeqCst);
                let _ = thread.join();
                format!("{} resets", count.load(Ordering::SeqCst))
            }
            None => format!("{} connections", self.made),
        }
    }
}

/// A connection to `addr` (the handshake done), or None if it failed.
fn connect(addr: SocketAddr) -> Option<TcpStream> {
    TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()
}

/// Closes `conn` with an RST: `SO_LINGER` {on, 0}, then close.
fn reset(conn: TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: `conn` owns its descriptor for the call; `linger` is live and
    // the length given is its size.
    let rc = unsafe {
        libc::setsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_LINGER: {}", std::io::Error::last_os_error());
    drop(conn);
}

/// Gives the pool up to [`SETTLE`] to answer the fault: until it has 2
/// idle children again, none starting (a held-open connection holds a
/// child where no defer keeps it in the kernel, and the pool grows to
/// replace it). A note of how long that took.
fn settle(pool: &DemoPool) -> String {
    let start = Instant::now();
    let settled = pool
        .wait_status(SETTLE, |s| {
            s["idle"].as_u64() >= Some(2) && s["starting"] == 0
        })
        .is_some();
    match settled {
        true => format!("settled in {} ms", start.elapsed().as_millis()),
        false => format!("not settled in {SETTLE:?}"),
    }
}

/// What the stream saw.
struct Outcome {
    sent: usize,
    failed: usize,
    slowest: Duration,
    /// The first few failures, for the report.
    errors: Vec<String>,
}

/// The stream: a `GET` every [`PACE`] for [`PACED`] times, then [`BURST`]
/// at once, each on its own thread (so a request that hangs holds up no
/// other), each bounded by [`CLIENT_TIMEOUT`].
fn stream(addr: SocketAddr) -> Outcome {
    let start = Instant::now();
    let mut requests: Vec<JoinHandle<(Duration, Result<(), String>)>> = Vec::new();
    for i in 0..PACED {
        std::thread::sleep((start + PACE * i).saturating_duration_since(Instant::now()));
        requests.push(std::thread::spawn(move || timed_get(addr)));
    }
    std::thread::sleep((start + PACE * PACED).saturating_duration_since(Instant::now()));
    requests.extend((0..BURST).map(|_| std::thread::spawn(move || timed_get(addr))));
    let mut outcome = Outcome {
        sent: requests.len(),
        failed: 0,
        slowest: Duration::ZERO,
        errors: Vec::new(),
    };
    for request in requests {
        let (took, result) = request.join().expect("a request thread panicked");
        outcome.slowest = outcome.slowest.max(took);
        if let Err(e) = result {
            outcome.failed += 1;
            if outcome.errors.len() < 3 {
                outcome.errors.push(e);
            }
        }
    }
    outcome
}

/// One `GET /` with `Connection: close`, read to the close, all within
/// [`CLIENT_TIMEOUT`]: how long it took, and whether it got a 200.
fn timed_get(addr: SocketAddr) -> (Duration, Result<(), String>) {
    let start = Instant::now();
    let deadline = start + CLIENT_TIMEOUT;
    let left = |what: &str| {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(format!("{what}: no answer within {CLIENT_TIMEOUT:?}"))
        } else {
            Ok(left)
        }
    };
    let result = (|| {
        let mut conn = TcpStream::connect_timeout(&addr, CLIENT_TIMEOUT)
            .map_err(|e| format!("connect: {e}"))?;
        conn.set_write_timeout(Some(left("write")?)).unwrap();
        conn.write_all(b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
            .map_err(|e| format!("write: {e}"))?;
        let mut raw = Vec::new();
        let mut chunk = [0; 4096];
        loop {
            conn.set_read_timeout(Some(left("read")?)).unwrap();
            match conn.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => raw.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(format!(
                        "read after {:?} ({} bytes): {e}",
                        start.elapsed(),
                        raw.len()
                    ))
                }
            }
        }
        let response = parse_response(&String::from_utf8_lossy(&raw))?;
        match response.status {
            200 => Ok(()),
            other => Err(format!("status {other}")),
        }
    })();
    (start.elapsed(), result)
}

/// What status says after a fault and its stream: problems, if any, and
/// a note of what the pool did.
fn check_state(pool: &DemoPool) -> (Vec<String>, String) {
    let mut problems = Vec::new();
    if !alive(pool.pid) {
        problems.push("the supervisor is gone".to_string());
        return (problems, String::new());
    }
    let status = match pool.try_status() {
        Ok(status) => status,
        Err(e) => {
            problems.push(format!("no status: {e}"));
            return (problems, String::new());
        }
    };
    for counter in ["killed", "died"] {
        let n = total(&status, counter);
        if n != 0 {
            problems.push(format!("{counter} {n}"));
        }
    }
    for slot in status["slots"].as_array().map_or(&[][..], Vec::as_slice) {
        if let Some(pid) = slot["pid"].as_i64() {
            if !alive(pid as i32) {
                problems.push(format!("slot {} (pid {pid}) is gone", slot["slot"]));
            }
        }
    }
    let note = format!(
        "children {}, accepted {}",
        status["slots"].as_array().map_or(0, Vec::len),
        total(&status, "accepted")
    );
    (problems, note)
}

/// One row of the matrix: a worker (the demo, or a helper's example
/// worker under `forkpool run`) in a dispatch mode with a defer-accept.
struct Cell<'a> {
    worker: &'a str,
    mode: &'a str,
    defer: &'a str,
    /// `forkpool run`'s command; empty for `forkpool demo`.
    cmd: Vec<&'a str>,
}

/// One line of the table.
struct Row {
    fault: Fault,
    outcome: Outcome,
    fault_note: String,
    problems: Vec<String>,
    state_note: String,
}

impl Row {
    fn passed(&self) -> bool {
        self.outcome.failed == 0 && self.outcome.slowest < SLOWEST && self.problems.is_empty()
    }
}

impl Cell<'_> {
    fn start(&self) -> DemoPool {
        let mut args = vec!["--dispatch", self.mode, "--defer-accept", self.defer];
        args.extend(POOL);
        if self.cmd.is_empty() {
            DemoPool::start(&args)
        } else {
            DemoPool::start_run(&args, &self.cmd)
        }
    }

    /// Runs the five faults, each on a fresh pool, and panics with the
    /// table if any failed.
    fn run(&self) {
        let _turn = one_at_a_time();
        let began = Instant::now();
        let mut rows = Vec::new();
        for fault in Fault::ALL {
            let pool = self.start();
            if self.mode == "kernel" && !require_kernel_dispatch(&pool) {
                return;
            }
            assert!(
                pool.wait_status(PATIENCE, |s| s["idle"].as_u64() >= Some(2)
                    && s["starting"] == 0)
                    .is_some(),
                "{} {}: the pool never had 2 idle children: {:?}\n{}",
                self.worker,
                self.mode,
                pool.try_status(),
                pool.stderr.dump()
            );
            let active = fault.begin(pool.addr);
            let settled = settle(&pool);
            let outcome = stream(pool.addr);
            let fault_note = [settled, active.end()].join("; ");
            let (problems, state_note) = check_state(&pool);
            rows.push(Row {
                fault,
                outcome,
                fault_note,
                problems,
                state_note,
            });
        }
        let table = self.table(&rows, began.elapsed());
        // Shown with --nocapture, and on failure with the panic.
        eprintln!("{table}");
        assert!(rows.iter().all(Row::passed), "faults failed:\n{table}");
    }

    fn table(&self, rows: &[Row], took: Duration) -> String {
        let mut table = format!(
            "{:<7} {:<8} {:<5} {:<27} {:>8} {:>10}  result\n",
            "worker", "mode", "defer", "fault", "failed", "slowest"
        );
        for row in rows {
            let result = if row.passed() { "ok" } else { "FAIL" };
            let _ = writeln!(
                table,
                "{:<7} {:<8} {:<5} {:<27} {:>8} {:>7} ms  {result}  ({}; {}){}{}",
                self.worker,
                self.mode,
                self.defer,
                row.fault.name(),
                format!("{}/{}", row.outcome.failed, row.outcome.sent),
                row.outcome.slowest.as_millis(),
                row.fault_note,
                row.state_note,
                if row.problems.is_empty() {
                    String::new()
                } else {
                    format!("; state: {}", row.problems.join(", "))
                },
                if row.outcome.errors.is_empty() {
                    String::new()
                } else {
                    format!("; e.g. {}", row.outcome.errors.join(" | "))
                },
            );
        }
        let _ = write!(table, "({} faults in {took:.1?})", rows.len());
        table
    }
}

fn demo(mode: &'static str, defer: &'static str) {
    Cell {
        worker: "demo",
        mode,
        defer,
        cmd: Vec::new(),
    }
    .run();
}

fn helper(worker: &str, defer: &'static str, cmd: Vec<&str>) {
    Cell {
        worker,
        mode: "kernel",
        defer,
        cmd,
    }
    .run();
}

#[test]
fn demo_kernel_no_defer() {
    demo("kernel", "0");
}

#[test]
fn demo_kernel_defer_5s() {
    demo("kernel", "5s");
}

#[test]
fn demo_handoff_no_defer() {
    demo("handoff", "0");
}

#[test]
fn demo_handoff_defer_5s() {
    demo("handoff", "5s");
}

#[test]
fn demo_order_no_defer() {
    demo("order", "0");
}

#[test]
fn demo_order_defer_5s() {
    demo("order", "5s");
}

#[test]
fn demo_shared_no_defer() {
    demo("shared", "0");
}

#[test]
fn demo_shared_defer_5s() {
    demo("shared", "5s");
}

#[test]
fn python_example_worker_kernel() {
    helper("python", "0", vec!["python3", PYTHON_WORKER]);
}

#[test]
fn python_example_worker_kernel_defer_5s() {
    helper("python", "5s", vec!["python3", PYTHON_WORKER]);
}

#[test]
fn perl_example_worker_kernel() {
    helper("perl", "0", vec!["perl", PERL_WORKER]);
}

#[test]
fn ruby_example_worker_kernel() {
    if require_program("ruby", "run bash .ci/deps/ruby.sh").is_some() {
        helper("ruby", "0", vec!["ruby", "-I", RUBY_DIR, RUBY_WORKER]);
    }
}

#[test]
fn c_example_worker_kernel() {
    if let Some(worker) = BuiltWorker::new() {
        helper("c", "0", vec![worker.command()]);
    }
}
