//! Hostile workers, local users and clients (issue 11, items 5, 8, 10, 11
//! and 12): nothing they send may leak, stall or spoof the supervisor.

mod common;

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{forkpool_bin, DemoPool};

/// Polls `cond` every 20 ms until it holds or `timeout` passes.
fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How many descriptors process `pid` holds.
fn fd_count(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// `totals.killed_by.REASON` from a status snapshot.
fn killed_by(status: &serde_json::Value, reason: &str) -> u64 {
    status["totals"]["killed_by"][reason].as_u64().unwrap_or(0)
}

/// Whether python3 is here; without it these worker tests cannot run.
fn have_python() -> bool {
    Command::new("python3")
        .arg("-c")
        .arg("import socket; socket.send_fds")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Skips (or, under CI, fails) a test that needs python3.
fn python_or_skip() -> bool {
    if have_python() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "python3 (3.9+) is missing: install it (apt-get install -y python3)"
    );
    eprintln!("skipped: python3 (3.9+) is missing");
    false
}

/// A worker that says Ready, then answers every Ping with a Pong that
/// carries `argv[1]` copies of one pipe descriptor.
const FD_SENDER: &str = r#"
import os, socket, struct, sys
n = int(sys.argv[1])
ch = socket.socket(fileno=int(os.environ["FORKPOOL_CHANNEL_FD"]))
ch.setblocking(True)
ch.send(b"\x01R" + struct.pack(">I", os.getpid()))
r, w = os.pipe()
while True:
    m = ch.recv(16)
    if not m:
        sys.exit(0)
    if m[1:2] == b"p":
        socket.send_fds(ch, [b"\x01P" + m[2:6]], [r] * n)
"#;

/// Item 5: a worker whose Pongs carry 5, 8 or 64 descriptors is killed as
/// misbehaved each time, and none of the descriptors stay in the
/// supervisor.
#[test]
fn descriptors_sent_by_a_worker_are_closed_and_the_worker_is_killed() {
    if !python_or_skip() {
        return;
    }
    for n in ["5", "8", "64"] {
        let pool = DemoPool::start_run(
            &[
                "--dispatch",
                "handoff",
                "--min-children",
                "1",
                "--max-children",
                "1",
                "--min-spare",
                "0",
                "--max-spare",
                "1",
                "--ping-interval",
                "100ms",
                "--ping-timeout",
                "20s",
            ],
            &["python3", "-c", FD_SENDER, n],
        );
        let before = fd_count(pool.pid);
        // Each Pong costs the worker its life; three of them in a row.
        assert!(
            wait_until(Duration::from_secs(30), || killed_by(
                &pool.status(),
                "misbehaved"
            ) >= 3),
            "{n} fds: the worker was not killed as misbehaved three times: {}\n{}",
            pool.status()["totals"],
            pool.stderr.dump()
        );
        // Back to one child (with its one channel) and no stray fds.
        let flat = wait_until(Duration::from_secs(10), || fd_count(pool.pid) <= before);
        assert!(
            flat,
            "{n} fds per message: supervisor went from {before} to {} descriptors",
            fd_count(pool.pid)
        );
    }
}

/// A worker that says Ready, sends one empty datagram, then sits.
const EMPTY_SENDER: &str = r#"
import os, socket, struct, time
ch = socket.socket(fileno=int(os.environ["FORKPOOL_CHANNEL_FD"]))
ch.setblocking(True)
ch.send(b"\x01R" + struct.pack(">I", os.getpid()))
ch.send(b"")
time.sleep(3600)
"#;

/// Item 8: an empty datagram reads as the child closing its channel. The
/// child is out of service at once and killed as `channel_failed` soon
/// after, not left until a long `ping_timeout`.
#[test]
fn an_empty_datagram_closes_the_channel_and_the_child_is_killed_promptly() {
    if !python_or_skip() {
        return;
    }
    let pool = DemoPool::start_run(
        &[
            "--dispatch",
            "handoff",
            "--min-children",
            "1",
            "--max-children",
            "1",
            "--min-spare",
            "0",
            "--max-spare",
            "1",
            "--ping-timeout",
            "60s",
        ],
        &["python3", "-c", EMPTY_SENDER],
    );
    assert!(
        wait_until(Duration::from_secs(20), || killed_by(
            &pool.status(),
            "channel_failed"
        ) >= 1),
        "the child that sent an empty datagram was not killed as channel_failed: {}\n{}",
        pool.status(),
        pool.stderr.dump()
    );
    assert_eq!(killed_by(&pool.status(), "stop_timeout"), 0);
}

/// The endpoint's client cap, as `supervisor/endpoints.rs` sets it.
const MAX_ENDPOINT_CLIENTS: usize = 64;

/// The metrics address a pool printed.
fn metrics_addr(pool: &DemoPool) -> SocketAddr {
    pool.stdout
        .dump()
        .lines()
        .find_map(|l| l.strip_prefix("forkpool: metrics on http://"))
        .and_then(|rest| rest.trim_end_matches("/metrics").parse().ok())
        .expect("the pool prints its metrics address")
}

/// Opens `n` metrics connections that never send a byte, and waits until
/// the supervisor has closed all but at most the cap of them (or its
/// 5 s client timeout did). Returns the most descriptors the supervisor
/// held meanwhile.
fn flood_metrics(pool: &DemoPool, n: usize) -> usize {
    let addr = metrics_addr(pool);
    let mut max = fd_count(pool.pid);
    let mut idle: Vec<TcpStream> = Vec::new();
    for _ in 0..n {
        idle.push(TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap());
        max = max.max(fd_count(pool.pid));
    }
    for s in &idle {
        s.set_nonblocking(true).unwrap();
    }
    let mut closed = vec![false; n];
    let done = wait_until(Duration::from_secs(30), || {
        max = max.max(fd_count(pool.pid));
        for (s, c) in idle.iter_mut().zip(closed.iter_mut()) {
            if !*c {
                *c = match (&*s).read(&mut [0u8; 64]) {
                    Ok(n) => n == 0,
                    Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                };
            }
        }
        closed.iter().filter(|c| **c).count() >= n - MAX_ENDPOINT_CLIENTS
    });
    assert!(
        done,
        "the supervisor never closed the surplus metrics clients"
    );
    max
}

/// Item 11: hundreds of idle metrics clients hold at most the cap's worth
/// of descriptors in the supervisor, and the pool and `forkpool status`
/// still answer.
#[test]
fn idle_metrics_clients_are_capped() {
    let pool = DemoPool::start(&["--metrics", "127.0.0.1:0", "--min-children", "2"]);
    let before = fd_count(pool.pid);
    let max = flood_metrics(&pool, 300);
    assert!(
        max <= before + MAX_ENDPOINT_CLIENTS + 8,
        "300 idle metrics clients took the supervisor from {before} to {max} descriptors"
    );
    assert_eq!(pool.get("/").expect("the pool still serves").status, 200);
    assert_eq!(pool.status()["pid"].as_u64(), Some(pool.pid as u64));
}

/// Item 11: with a small RLIMIT_NOFILE, metrics clients never take the
/// descriptors the pool needs for its own connections.
#[test]
fn metrics_clients_leave_descriptors_for_the_pool() {
    const NOFILE: usize = 80;
    let mut command = Command::new("prlimit");
    command.args([
        format!("--nofile={NOFILE}:{NOFILE}").as_str(),
        forkpool_bin(),
        "demo",
    ]);
    let pool = DemoPool::launch(
        command,
        &["--metrics", "127.0.0.1:0", "--min-children", "2"],
        &[],
        true,
    );
    let max = flood_metrics(&pool, 150);
    assert!(
        max <= NOFILE - 32 + 2,
        "150 idle metrics clients took the supervisor to {max} of {NOFILE} descriptors"
    );
    assert_eq!(pool.get("/").expect("the pool still serves").status, 200);
    assert_eq!(pool.status()["pid"].as_u64(), Some(pool.pid as u64));
}
