//! The Python helper in `--dispatch kernel` (issue 26), against the real
//! supervisor: `forkpool_worker` (clients/python/example_http_worker.py),
//! `forkpool_wsgi` on a small WSGI app (clients/tests/slot_app.py), and a
//! Flask app.
//!
//! A worker that keeps its record on the scoreboard (it said `K`) takes
//! its connections from the kernel, never through the supervisor: the
//! tests check that with the supervisor stopped (SIGSTOP), or with the
//! count of connections the supervisor handed on (the dispatch latency
//! histogram's count), which a worker that said `R` would make grow.

mod common;

#[path = "common/bench_bins.rs"]
mod bench_bins;
#[path = "common/example_workers.rs"]
mod example_workers;
#[path = "common/wsgi_support.rs"]
mod wsgi_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{killed_by, parse_response, require, scrape_metrics, send, signal_pid, total};
use common::{DemoPool, Response};
use example_workers::PYTHON_WORKER;
use wsgi_support::{clients_dir, connect, request, venv_python};

/// Exactly one worker (`--min-children` comes from the pool helper).
const ONE_WORKER: [&str; 2] = ["--max-children", "1"];

/// Long enough for a Python worker to start on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(20);

/// `clients/tests`, where the small WSGI app lives.
fn test_apps() -> String {
    clients_dir().join("../tests").display().to_string()
}

/// `forkpool run` in kernel dispatch with `children` workers running
/// `cmd` (from `dir`, with the helper on PYTHONPATH), once all are idle;
/// None (under CI, a failure) where the kernel refuses the program.
fn kernel_python_pool(
    children: usize,
    extra: &[&str],
    cmd: &[&str],
    dir: Option<&std::path::Path>,
) -> Option<DemoPool> {
    require_program_python()?;
    // `children` workers, none retired for being idle; pings patient with
    // a loaded machine; metrics for the count of connections handed on.
    let min = format!("--min-children={children}");
    let mut args = vec!["--dispatch=kernel", &min, "--min-spare=0", "--max-spare=64"];
    args.extend(["--ping-timeout=20s", "--metrics=127.0.0.1:0"]);
    args.extend_from_slice(extra);
    let mut command = Command::new(common::forkpool_bin());
    command.arg("run").env("PYTHONPATH", clients_dir());
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    let pool = DemoPool::launch(command, &args, cmd, true);
    let status = pool.status();
    let why = format!("kernel dispatch ({})", status["dispatch_fallback"]);
    if !require(
        status["dispatch"] == "kernel",
        &why,
        "run as root on Linux 5.12 or later (CAP_BPF)",
    ) {
        return None;
    }
    let idle = pool.wait_status(PATIENCE, |s| s["idle"] == children as u64);
    assert!(
        idle.is_some(),
        "workers never idle:\n{}",
        pool.stderr.dump()
    );
    Some(pool)
}

fn require_program_python() -> Option<std::path::PathBuf> {
    common::require_program("python3", "apt-get install python3")
}

/// `python3 clients/python/example_http_worker.py`.
fn example_worker() -> [&'static str; 2] {
    ["python3", PYTHON_WORKER]
}

/// `python3 -m forkpool_wsgi` serving clients/tests/slot_app.py.
fn slot_app(extra: &[&str]) -> Vec<String> {
    let mut cmd: Vec<String> = ["python3", "-m", "forkpool_wsgi", "--chdir"]
        .map(String::from)
        .to_vec();
    cmd.push(test_apps());
    cmd.extend(["slot_app:app", "--no-access-log"].map(String::from));
    cmd.extend(extra.iter().map(|s| s.to_string()));
    cmd
}

fn as_strs(cmd: &[String]) -> Vec<&str> {
    cmd.iter().map(String::as_str).collect()
}

/// How many connections the supervisor handed on itself (`C`), from
/// the dispatch latency histogram.
fn handed_by_supervisor(pool: &DemoPool) -> u64 {
    let metrics = scrape_metrics(pool);
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("forkpool_dispatch_latency_seconds_count "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no dispatch latency count in:\n{metrics}"))
}

/// Runs `work` while the supervisor is stopped, so only the kernel and
/// the workers can serve; the supervisor goes on afterwards even if
/// `work` panics.
fn without_supervisor<T>(pool: &DemoPool, work: impl FnOnce() -> T) -> T {
    signal_pid(pool.pid, "STOP");
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
    signal_pid(pool.pid, "CONT");
    result.unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// A GET on a fresh connection, answered within 10 s or an error.
fn get_soon(pool: &DemoPool, path: &str) -> Result<Response, String> {
    answer_of(send(pool.addr, path))
}

/// The slots that answered `n` GETs one after the other, up to the
/// first that failed (a connection nobody took gives up after 10 s).
fn slots_of_sequential_gets(pool: &DemoPool, n: usize) -> Vec<Result<Option<usize>, String>> {
    let mut slots = Vec::new();
    while slots.len() < n && !matches!(slots.last(), Some(Err(_))) {
        slots.push(get_soon(pool, "/").map(|r| r.slot));
    }
    slots
}

fn answer_of(mut conn: TcpStream) -> Result<Response, String> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut raw = String::new();
    conn.read_to_string(&mut raw)
        .map_err(|e| format!("no answer: {e}"))?;
    parse_response(&raw)
}

fn worker_in(status: &serde_json::Value, slot: u64) -> i32 {
    let found = status["slots"]
        .as_array()
        .and_then(|slots| slots.iter().find(|s| s["slot"] == slot));
    match found.and_then(|s| s["pid"].as_i64()) {
        Some(pid) => pid as i32,
        None => panic!("slot {slot} is empty: {status}"),
    }
}

/// No worker killed for a protocol violation, none dead, no fallback.
fn assert_clean(status: &serde_json::Value) {
    assert_eq!(killed_by(status, "misbehaved"), 0, "{status}");
    assert_eq!(total(status, "killed"), 0, "{status}");
    assert_eq!(total(status, "died"), 0, "{status}");
    assert!(status.get("dispatch_fallback").is_none(), "{status}");
}

/// `n` sequential requests with the supervisor stopped, all served by
/// slot 0; then the board says `n` were accepted by the workers, and the
/// supervisor handed none on.
fn slot_zero_serves_alone(pool: &DemoPool, n: usize) {
    let slots = without_supervisor(pool, || slots_of_sequential_gets(pool, n));
    assert_eq!(slots, vec![Ok(Some(0)); n], "{}", pool.stderr.dump());
    // Read off the board once the supervisor runs again. (Not slot 0's
    // `served`: a worker the supervisor reads busy before its first idle
    // store is counted one connection more.)
    let status = pool
        .wait_status(PATIENCE, |s| s["totals"]["accepted"] == n as u64)
        .unwrap_or_else(|| panic!("never {n} accepted: {}", pool.status()));
    assert_eq!(handed_by_supervisor(pool), 0);
    assert_clean(&status);
}

/// 30 sequential requests with the supervisor stopped: every one served
/// by slot 0, which the kernel picks because the worker went idle on the
/// board before each close. The supervisor then reads the 30 off the board.
#[test]
fn sequential_requests_all_go_to_slot_zero_without_the_supervisor() {
    let Some(pool) = kernel_python_pool(3, &[], &example_worker(), None) else {
        return;
    };
    slot_zero_serves_alone(&pool, 30);
}

/// Four connections arrive while all four idle workers are stopped: the
/// kernel reserves a different one for each, and none goes through the
/// supervisor.
#[test]
fn a_burst_lands_one_connection_per_idle_worker() {
    let Some(pool) = kernel_python_pool(4, &[], &example_worker(), None) else {
        return;
    };
    let status = pool.status();
    let pids: Vec<i32> = (0..4).map(|slot| worker_in(&status, slot)).collect();
    for &pid in &pids {
        signal_pid(pid, "STOP");
    }
    let waiting: Vec<TcpStream> = (0..4).map(|_| send(pool.addr, "/?work_ms=50")).collect();
    for &pid in &pids {
        signal_pid(pid, "CONT");
    }
    let mut slots: Vec<Option<usize>> = waiting
        .into_iter()
        .map(|conn| answer_of(conn).expect("an answer").slot)
        .collect();
    slots.sort_unstable();
    assert_eq!(slots, [0, 1, 2, 3].map(Some), "{}", pool.stderr.dump());
    assert_eq!(handed_by_supervisor(&pool), 0);
    assert_clean(&pool.status());
}

/// Under `--preload` a worker forked by the template says `K` and is given
/// its seat (its own socket and the board, `S`): sequential requests go to
/// slot 0 with the supervisor stopped, none handed on.
#[test]
fn preloaded_workers_take_their_seat_and_keep_the_board() {
    let Some(pool) = kernel_python_pool(2, &["--preload"], &example_worker(), None) else {
        return;
    };
    slot_zero_serves_alone(&pool, 10);
}

/// A stopped worker cannot accept: the kernel queues one connection on
/// its socket (it was idle on the board) and sends the next to slot 1.
/// Killed, the worker loses nothing: the supervisor takes what was queued
/// on its socket and hands it on, the one connection it hands.
#[test]
fn a_killed_worker_loses_nothing_queued_on_its_socket() {
    let Some(pool) = kernel_python_pool(2, &[], &example_worker(), None) else {
        return;
    };
    let first = worker_in(&pool.status(), 0);
    signal_pid(first, "STOP");
    let queued = send(pool.addr, "/");
    let next = get_soon(&pool, "/").expect("the next connection is served");
    assert_eq!(next.slot, Some(1), "{}", pool.stderr.dump());
    signal_pid(first, "KILL");
    let answer = answer_of(queued).expect("the queued connection is served");
    assert_eq!(answer.status, 200);
    assert_ne!(answer.pid, Some(first));
    assert!(pool.wait_total("died", 1, PATIENCE), "{}", pool.status());
    assert_eq!(handed_by_supervisor(&pool), 1);
}

/// `max_requests_per_child` 5: each worker is told its share
/// (FORKPOOL_MAX_REQUESTS), serves exactly 5 and leaves; every request is
/// answered.
#[test]
fn a_worker_leaves_when_it_has_served_its_share() {
    let extra = ["--max-requests-per-child", "5"];
    let Some(pool) = kernel_python_pool(1, &extra, &example_worker(), None) else {
        return;
    };
    let pids: Vec<i32> = (0..20)
        .map(|_| {
            let r = get_soon(&pool, "/").expect("every request is answered");
            assert_eq!(r.status, 200);
            r.pid.expect("pid header")
        })
        .collect();
    let runs: Vec<usize> = pids.chunk_by(|a, b| a == b).map(|run| run.len()).collect();
    assert_eq!(runs, [5, 5, 5, 5], "{pids:?}");
    let status = pool.status();
    assert!(total(&status, "retired") >= 3, "{status}");
    assert_clean(&status);
}

/// A worker not told its share (FORKPOOL_MAX_REQUESTS removed) is sent
/// `Q` by the supervisor, which reads what it served on the board (at
/// least every 100 ms): it exits and is replaced, and every request is
/// answered. Requests go on until three workers have answered.
#[test]
fn a_worker_not_told_its_share_is_recycled_by_quit() {
    let extra = ["--max-requests-per-child", "5"];
    let cmd = [
        "env",
        "-u",
        "FORKPOOL_MAX_REQUESTS",
        "python3",
        PYTHON_WORKER,
    ];
    let Some(pool) = kernel_python_pool(1, &extra, &cmd, None) else {
        return;
    };
    let deadline = Instant::now() + PATIENCE;
    let mut pids: Vec<i32> = Vec::new();
    while pids.len() < 3 && Instant::now() < deadline {
        let r = get_soon(&pool, "/").expect("every request is answered");
        assert_eq!(r.status, 200);
        let pid = r.pid.expect("pid header");
        if pids.last() != Some(&pid) {
            pids.push(pid);
        }
    }
    assert_eq!(pids.len(), 3, "no worker recycled: {pids:?}");
    let status = pool.status();
    assert!(total(&status, "retired") >= 2, "{status}");
    assert_clean(&status);
}

/// forkpool_wsgi in kernel dispatch: new connections go to slot 0 with the
/// supervisor stopped, and a kept-alive connection stays with its worker.
#[test]
fn forkpool_wsgi_serves_in_kernel_dispatch_with_keepalive() {
    let cmd = slot_app(&[]);
    let Some(pool) = kernel_python_pool(2, &[], &as_strs(&cmd), None) else {
        return;
    };
    let (slots, kept): (Vec<_>, Vec<_>) = without_supervisor(&pool, || {
        let slots = slots_of_sequential_gets(&pool, 10);
        let mut conn = connect(pool.addr);
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let kept = (0..5)
            .map(|_| request(&mut conn, "GET / HTTP/1.1\r\nHost: t\r\n\r\n"))
            .map(|r| (r.status, r.header("x-forkpool-pid"), r.header("connection")))
            .collect();
        (slots, kept)
    });
    assert_eq!(slots, vec![Ok(Some(0)); 10], "{}", pool.stderr.dump());
    let pid = worker_in(&pool.status(), 0).to_string();
    assert!(
        kept.iter().all(|k| k == &(200, Some(pid.clone()), None)),
        "{kept:?}"
    );
    assert_eq!(handed_by_supervisor(&pool), 0);
    assert_clean(&pool.status());
}

/// One worker holds an idle kept-alive connection (busy on the board), so
/// a new client lands on the overflow: the worker sees it there and gives
/// way, closing the kept-alive connection long before its keep-alive
/// timeout, and the new client is served.
#[test]
fn forkpool_wsgi_gives_way_on_the_overflow() {
    let cmd = slot_app(&["--keepalive-timeout", "120"]);
    let Some(pool) = kernel_python_pool(1, &ONE_WORKER, &as_strs(&cmd), None) else {
        return;
    };
    let mut kept = connect(pool.addr);
    let first = request(&mut kept, "GET / HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!((first.status, first.header("connection")), (200, None));
    let waiting = send(pool.addr, "/");
    let served = answer_of(waiting).expect("the waiting client is served");
    assert_eq!(served.status, 200);
    // The kept-alive connection was closed, idle, without an answer.
    kept.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut rest = Vec::new();
    let ended = kept.read_to_end(&mut rest);
    assert!(ended.is_ok() && rest.is_empty(), "{ended:?} {rest:?}");
    assert_clean(&pool.status());
}

/// The Flask test app in kernel dispatch: keep-alive, a streamed body,
/// and new connections all to the same (slot 0) worker, none through the
/// supervisor.
#[test]
fn flask_app_in_kernel_dispatch() {
    let Some(python) = venv_python() else { return };
    let cmd = [python.as_str(), "-m", "forkpool_wsgi", "flask_app:app"];
    let apps = wsgi_support::apps_dir();
    let Some(pool) = kernel_python_pool(2, &[], &cmd, Some(&apps)) else {
        return;
    };
    let slot0 = worker_in(&pool.status(), 0).to_string();
    let mut conn = connect(pool.addr);
    for _ in 0..3 {
        let r = request(&mut conn, "GET /pid HTTP/1.1\r\nHost: t\r\n\r\n");
        assert_eq!(String::from_utf8_lossy(&r.body), slot0);
    }
    let posted = request(
        &mut conn,
        "POST /digest HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello",
    );
    assert!(posted.body.starts_with(b"5 2cf24dba"), "{posted:?}");
    drop(conn);
    // Idle again once it has seen the client close.
    let finished = pool.wait_status(PATIENCE, |s| s["slots"][0]["served"] == 1);
    assert!(finished.is_some(), "{}", pool.status());
    for _ in 0..5 {
        let mut conn = connect(pool.addr);
        conn.write_all(b"GET /pid HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            .unwrap();
        let r = wsgi_support::read_response(&mut conn, false);
        assert_eq!(String::from_utf8_lossy(&r.body), slot0);
        // The close comes once the worker is idle again.
        let rest = conn.read_to_end(&mut Vec::new());
        assert_eq!(rest.ok(), Some(0));
    }
    assert_eq!(handed_by_supervisor(&pool), 0);
    assert_clean(&pool.status());
}
