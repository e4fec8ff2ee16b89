//! An example worker in Rust for `forkpool run`: a separate program that
//! the supervisor execs in every slot, answering HTTP like `forkpool demo`.
//!
//! ```sh
//! forkpool run --listen 127.0.0.1:8080 -- forkpool-example-worker
//! curl -i 'http://127.0.0.1:8080/?work_ms=100'
//! ```
//!
//! `GET` with any path answers `hello`; `?work_ms=N` sleeps N ms first.
//! Responses carry `X-Forkpool-Slot` and `X-Forkpool-Pid` and close the
//! connection. Everything forkpool-specific is the two calls in `main`.
//!
//! The same program runs unchanged under `forkpool run --preload`: it is
//! then started once as a template and every worker is forked from it.
//!
//! With `--json` as its first argument it answers each connection at once,
//! without reading a request, with one JSON line saying who served it:
//! `pid`, `slot`, `preloaded` (the pid of the process that started the
//! program: the template's in a forked worker), `warm` (the pid of the
//! process that served this program's first connection: state a refork
//! carries over) and `after_fork` (whether the `after_fork` hook ran in
//! this process). `clients/tests/template_harness.py` checks those.
//!
//! With `--chaos` (fault-injection tests only), `?leak_fds=N` (at most
//! 1000) makes it open N descriptors of /dev/null and keep them for the
//! life of the process, as a leaking handler does (500 if one cannot be
//! opened), and `?grow_mib=N` (at most 1024) makes it keep N MiB more of
//! memory it has written to (its own, unshared) for the life of the
//! process, as a handler that leaks memory does.
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::io::{Read, Write};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use forkpool::worker::ExecWorker;
use forkpool::Connection;

fn main() {
    // The library logs with `tracing`; stderr goes to the supervisor,
    // which logs each line with this worker's slot.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .without_time()
        .init();
    let worker = match ExecWorker::from_env() {
        Ok(worker) => worker,
        Err(e) => {
            eprintln!("forkpool-example-worker: {e}");
            std::process::exit(2);
        }
    };
    if std::env::args().nth(1).as_deref() == Some("--json") {
        std::process::exit(report(worker));
    }
    let chaos = std::env::args().any(|a| a == "--chaos");
    std::process::exit(worker.serve(move |conn: Connection<'_>| answer(conn, chaos)));
}

/// What `?leak_fds=N` opened (with `--chaos`), never closed.
static LEAKED: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());

/// What `?grow_mib=N` kept (with `--chaos`), never freed.
static GROWN: std::sync::Mutex<Vec<Vec<u8>>> = std::sync::Mutex::new(Vec::new());

/// The pid of the process the `after_fork` hook last ran in.
static HOOKED: AtomicU32 = AtomicU32::new(0);

/// `--json`: answers each connection with who served it and what it saw.
fn report(worker: ExecWorker) -> i32 {
    let preloaded = std::process::id();
    // A descriptor opened while loading: a forked worker must not hold it.
    // It lives in a static, never dropped: in a forked worker its number
    // is closed, and closing it again would close another file.
    static LOADED_FROM: OnceLock<std::io::Result<std::fs::File>> = OnceLock::new();
    LOADED_FROM.get_or_init(|| std::env::current_exe().and_then(std::fs::File::open));
    let mut warm = None;
    let worker = worker.after_fork(|| {
        HOOKED.store(std::process::id(), Ordering::SeqCst);
        eprintln!("after_fork ran in {}", std::process::id());
    });
    worker.serve(move |conn: Connection<'_>| {
        let pid = std::process::id();
        let warm = *warm.get_or_insert(pid);
        let line = format!(
            "{{\"pid\": {pid}, \"slot\": {}, \"preloaded\": {preloaded}, \"warm\": {warm}, \
             \"after_fork\": {}}}\n",
            conn.worker.slot,
            HOOKED.load(Ordering::SeqCst) == pid
        );
        let mut stream = conn.stream;
        let _ = stream.write_all(line.as_bytes());
    })
}

/// `name=N` in the query of `target`, or 0.
fn query_number(target: &str, name: &str) -> u64 {
    target
        .split_once('?')
        .map_or("", |(_, query)| query)
        .split('&')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0)
}

/// Opens `n` descriptors and keeps them (`--chaos`'s `?leak_fds=N`).
fn leak(n: u64) -> std::io::Result<()> {
    let mut leaked = LEAKED.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..n {
        leaked.push(std::fs::File::open("/dev/null")?);
    }
    Ok(())
}

/// Keeps `mib` MiB more, written to, so the pages are this process's own
/// (`--chaos`'s `?grow_mib=N`).
fn grow(mib: u64) {
    let mut grown = GROWN.lock().unwrap_or_else(|e| e.into_inner());
    grown.push(vec![1u8; (mib as usize) << 20]);
}

/// Serves one request and closes.
fn answer(conn: Connection<'_>, chaos: bool) {
    let Connection {
        mut stream, worker, ..
    } = conn;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut head = Vec::new();
    let mut chunk = [0u8; 2048];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&head);
    let target = head.split_whitespace().nth(1).unwrap_or("/");
    let work_ms = query_number(target, "work_ms").min(60_000);
    std::thread::sleep(Duration::from_millis(work_ms));
    let leaked = match chaos {
        true => {
            grow(query_number(target, "grow_mib").min(1024));
            leak(query_number(target, "leak_fds").min(1000))
        }
        false => Ok(()),
    };
    let (status, body) = match leaked {
        Ok(()) => ("200 OK", "hello\n".to_string()),
        Err(e) => ("500 Internal Server Error", format!("{e}\n")),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
         X-Forkpool-Slot: {}\r\nX-Forkpool-Pid: {}\r\nConnection: close\r\n\r\n{body}",
        body.len(),
        worker.slot,
        worker.pid
    );
    let _ = stream.write_all(response.as_bytes());
}
