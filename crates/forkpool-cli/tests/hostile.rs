//! Hostile workers, local users and clients (issue 11, items 5, 8, 10, 11
//! and 12): nothing they send may leak, stall or spoof the supervisor.

mod common;

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{forkpool_bin, killed_by, DemoPool};

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

/// Whether python3 is here; without it these worker tests cannot run.
fn have_python() -> bool {
    Command::new("python3")
        .arg("-c")
        .arg("import socket; socket.send_fds")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether a test that needs python3 can run (see `common::require`).
fn require_python() -> bool {
    common::require(
        have_python(),
        "python3 (3.9+, for socket.send_fds)",
        "apt-get install -y python3",
    )
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
    if !require_python() {
        return;
    }
    for n in ["5", "8", "64"] {
        let args = [
            &ONE_DEMO_CHILD[..],
            &["--ping-interval", "100ms", "--ping-timeout", "20s"],
        ];
        let pool = DemoPool::start_run(&args.concat(), &["python3", "-c", FD_SENDER, n]);
        let before = fd_count(pool.pid);
        // Each Pong costs the worker its life; three of them in a row.
        assert!(
            pool.wait_status(Duration::from_secs(30), |s| killed_by(s, "misbehaved") >= 3)
                .is_some(),
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
    if !require_python() {
        return;
    }
    let args = [&ONE_DEMO_CHILD[..], &["--ping-timeout", "60s"]];
    // Its ready report and the empty datagram may arrive in one read, so
    // the pool may never count as ready: do not wait for it.
    let pool = DemoPool::start_run_unready(&args.concat(), &["python3", "-c", EMPTY_SENDER]);
    assert!(
        pool.wait_status(Duration::from_secs(20), |s| killed_by(s, "channel_failed")
            >= 1)
            .is_some(),
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

/// `forkpool demo ARGS` under `prlimit --nofile=NOFILE:NOFILE`.
fn demo_under_nofile(nofile: usize, args: &[&str], wait_ready: bool) -> DemoPool {
    let mut command = Command::new("prlimit");
    command.args([
        format!("--nofile={nofile}:{nofile}").as_str(),
        forkpool_bin(),
        "demo",
    ]);
    DemoPool::launch(command, args, &[], wait_ready)
}

/// Item 11: with a small RLIMIT_NOFILE, metrics clients never take the
/// descriptors the pool needs for its own connections.
#[test]
fn metrics_clients_leave_descriptors_for_the_pool() {
    const NOFILE: usize = 80;
    let pool = demo_under_nofile(
        NOFILE,
        &["--metrics", "127.0.0.1:0", "--min-children", "2"],
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

/// A pool asked for more children than its descriptors allow (40
/// children under `RLIMIT_NOFILE` 80, three descriptors each in the
/// supervisor) starts as many as leave the last 40 free: the 32 kept for
/// connections and the 8 below them for status clients. It keeps
/// answering requests, and `forkpool status` still answers, which a pool
/// whose children took its last descriptors could not do.
#[test]
fn children_never_take_the_descriptors_kept_for_connections_and_status() {
    const NOFILE: usize = 80;
    let pool = demo_under_nofile(
        NOFILE,
        &[
            "--dispatch",
            "handoff",
            "--min-children",
            "40",
            "--max-children",
            "40",
        ],
        false, // never ready: 40 children cannot start
    );
    // Until the children stop coming (the same count half a second
    // apart), or 20 s: status must answer all along.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = None;
    loop {
        let status = pool.try_status().expect("forkpool status answers");
        let children = status["slots"].as_array().map_or(0, Vec::len);
        if (children > 0 && last == Some(children)) || Instant::now() > deadline {
            break;
        }
        last = Some(children);
        std::thread::sleep(Duration::from_millis(500));
    }
    for _ in 0..5 {
        assert_eq!(pool.get("/").expect("the pool still serves").status, 200);
    }
    let status = pool.status();
    assert_eq!(status["pid"].as_u64(), Some(pool.pid as u64));
    let children = status["slots"].as_array().map_or(0, Vec::len);
    assert!((1..40).contains(&children), "{children} children: {status}");
    let held = fd_count(pool.pid);
    assert!(
        held <= NOFILE - 32,
        "the supervisor holds {held} of {NOFILE} descriptors"
    );
}

/// One child in `handoff` mode (so a stalled request would stall the whole
/// pool, and a replaced child is easy to count).
static ONE_DEMO_CHILD: std::sync::LazyLock<Vec<&str>> =
    std::sync::LazyLock::new(|| [&["--dispatch", "handoff"][..], &common::ONE_CHILD].concat());

/// The demo's overall request deadline (`demo/http.rs`).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Reads what the server sent until it closes or `timeout` passes.
fn read_answer(stream: &mut TcpStream, timeout: Duration) -> String {
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let deadline = Instant::now() + timeout;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            // Not restarted after a signal, with a read timeout: no close.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// The anonymous part of process `pid`'s resident set, in KiB: its heap
/// and stacks, where a kept body would be. The code pages a first 413 or
/// a first discarded body fault in (hundreds of KiB of the debug binary)
/// are file-backed and not counted.
fn anon_rss_kib(pid: i64) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Item 12: a client that sends one byte every 2 s gets 408 once the
/// request deadline passes, and the child is free again.
#[test]
fn a_dripping_client_gets_408_and_frees_the_child() {
    use std::io::Write;
    let pool = DemoPool::start(&ONE_DEMO_CHILD);
    let mut stream = TcpStream::connect(pool.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let head = b"GET / HTTP/1.1\r\nHost: drip\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let started = Instant::now();
    let bound = REQUEST_TIMEOUT + Duration::from_secs(8);
    let mut answer = Vec::new();
    let mut next = 0;
    let mut buf = [0u8; 1024];
    while started.elapsed() < bound && next < head.len() {
        if started.elapsed() >= Duration::from_secs(2) * next as u32 {
            if stream.write_all(&head[next..next + 1]).is_err() {
                break;
            }
            next += 1;
        }
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            // A read with a timeout is not restarted after a signal (the
            // harness's other children exiting): EINTR is no close.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(_) => break,
        }
    }
    let answer = String::from_utf8_lossy(&answer).into_owned();
    assert!(
        answer.starts_with("HTTP/1.1 408 "),
        "a dripping client got {answer:?} after {:?}",
        started.elapsed()
    );
    assert!(
        wait_until(Duration::from_secs(10), || pool.status()["idle"] == 1),
        "the child is not idle again: {}",
        pool.status()
    );
    assert_eq!(pool.get("/").expect("served after the drip").status, 200);
}

/// Item 12: a huge `Content-Length` is answered 413 at once, without the
/// child reading (or keeping) the body; a body within the cap is read and
/// discarded, not kept.
#[test]
fn huge_bodies_get_413_and_bodies_are_not_kept() {
    use std::io::Write;
    let pool = DemoPool::start(&ONE_DEMO_CHILD);
    let child = pool.status()["slots"][0]["pid"].as_i64().unwrap();
    // One ordinary request first, so the pages any request touches count
    // in the baseline.
    assert_eq!(pool.get("/").expect("served").status, 200);
    let before = anon_rss_kib(child);

    let mut stream = TcpStream::connect(pool.addr).unwrap();
    stream
        .write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3000000000\r\n\r\n")
        .unwrap();
    // Send 32 MiB of body: a server that buffers it grows by as much.
    let mut writer = stream.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let block = vec![b'x'; 64 * 1024];
        for _ in 0..512 {
            if writer.write_all(&block).is_err() {
                break;
            }
        }
    });
    let answer = read_answer(&mut stream, Duration::from_secs(15));
    assert!(
        answer.starts_with("HTTP/1.1 413 "),
        "a 3 GB Content-Length got {answer:?}"
    );
    drop(stream);
    sender.join().unwrap();

    // 900 KiB of body, under the cap: read and thrown away.
    let mut stream = TcpStream::connect(pool.addr).unwrap();
    let body = vec![b'y'; 900 * 1024];
    stream
        .write_all(
            format!(
                "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .as_bytes(),
        )
        .unwrap();
    stream.write_all(&body).unwrap();
    let answer = read_answer(&mut stream, Duration::from_secs(15));
    assert!(answer.starts_with("HTTP/1.1 200 "), "got {answer:?}");
    let after = anon_rss_kib(child);
    assert!(
        after <= before + 512,
        "the child's anonymous RSS went from {before} KiB to {after} KiB"
    );
}

/// A process this test started, killed and reaped when dropped.
struct Started(std::process::Child);

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A scratch directory with `mode`, owned by `owner` if given, removed
/// when dropped.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new(name: &str, mode: u32, owner: Option<u32>) -> ScratchDir {
        use std::os::unix::fs::PermissionsExt;
        let dir = common::temp_path(name);
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
        if let Some(uid) = owner {
            std::os::unix::fs::chown(&dir, Some(uid), Some(uid)).unwrap();
        }
        ScratchDir(dir)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const NOBODY: u32 = 65534;

/// Whether this test runs as root, which acting as another local user
/// needs (see `common::require`).
fn require_root() -> bool {
    let out = Command::new("id").arg("-u").output().unwrap();
    common::require(
        String::from_utf8_lossy(&out.stdout).trim() == "0",
        "root (to act as another local user)",
        "run the tests as root",
    )
}

/// Starts `forkpool demo --control PATH`, expects it to refuse and exit
/// within 15 s, and returns what it printed on stderr.
fn refused_control(path: &Path) -> String {
    let child = Command::new(forkpool_bin())
        .args([
            "demo",
            "--listen",
            "127.0.0.1:0",
            "--min-children",
            "1",
            "--control",
        ])
        .arg(path)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut started = Started(child);
    let mut status = None;
    wait_until(Duration::from_secs(15), || {
        status = started.0.try_wait().unwrap();
        status.is_some()
    });
    let status = status.unwrap_or_else(|| panic!("the pool accepted {}", path.display()));
    let mut err = String::new();
    started
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(
        !status.success(),
        "the pool accepted {}: {err}",
        path.display()
    );
    err
}

/// Item 10: a control path in a directory another user owns is refused.
#[test]
fn a_control_directory_owned_by_another_user_is_refused() {
    if !require_root() {
        return;
    }
    let dir = ScratchDir::new("nobodys", 0o755, Some(NOBODY));
    let err = refused_control(&dir.0.join("control.sock"));
    assert!(err.contains("belongs to uid 65534"), "{err}");
}

/// Item 10: a control path in a world-writable, non-sticky directory is
/// refused; the same directory made sticky is accepted.
#[test]
fn a_world_writable_control_directory_is_refused_unless_sticky() {
    let dir = ScratchDir::new("open", 0o777, None);
    let err = refused_control(&dir.0.join("control.sock"));
    assert!(err.contains("not sticky"), "{err}");
    let sticky = ScratchDir::new("sticky", 0o1777, None);
    let path = sticky.0.join("control.sock");
    let pool = DemoPool::start(&["--control", path.to_str().unwrap()]);
    let out = Command::new(forkpool_bin())
        .args(["status", "--json", "--control"])
        .arg(&path)
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    assert_eq!(status["pid"].as_u64(), Some(pool.pid as u64));
}

/// Item 10: a socket another user bound first at the control path is
/// neither trusted by `forkpool status` nor taken by the supervisor.
#[test]
fn a_spoofed_control_socket_is_refused() {
    if !require_root() || !require_python() {
        return;
    }
    use std::os::unix::process::CommandExt;
    let dir = ScratchDir::new("shared", 0o1777, None);
    let path = dir.0.join("control.sock");
    let fake = r#"
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen(8)
while True:
    c, _ = s.accept()
    try:
        c.sendall(json.dumps({"pid": 4242, "line": "spoofed"}).encode() + b"\n")
    except OSError:
        pass
    c.close()
"#;
    let _attacker = Started(
        Command::new("python3")
            .args(["-c", fake])
            .arg(&path)
            .uid(NOBODY)
            .gid(NOBODY)
            .spawn()
            .unwrap(),
    );
    assert!(wait_until(Duration::from_secs(15), || {
        std::os::unix::net::UnixStream::connect(&path).is_ok()
    }));
    let out = Command::new(forkpool_bin())
        .args(["status", "--json", "--control"])
        .arg(&path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("uid 65534"),
        "forkpool status trusted another user's socket: {}{err}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = refused_control(&path);
    assert!(err.contains("belongs to uid 65534"), "{err}");
}

/// Item 10: with no `XDG_RUNTIME_DIR`, the default control socket lives in
/// a private directory `TMPDIR/forkpool-UID/` the supervisor makes (mode
/// 0700), and `forkpool status` finds it there.
#[test]
fn the_default_control_socket_is_in_a_private_directory() {
    use std::os::unix::fs::MetadataExt;
    let tmp = ScratchDir::new("tmpdir", 0o755, None);
    let uid = String::from_utf8(Command::new("id").arg("-u").output().unwrap().stdout).unwrap();
    let private = tmp.0.join(format!("forkpool-{}", uid.trim()));
    let _pool = Started(
        Command::new(forkpool_bin())
            .args(["demo", "--listen", "127.0.0.1:0", "--min-children", "1"])
            .env("TMPDIR", &tmp.0)
            .env_remove("XDG_RUNTIME_DIR")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let status = || {
        Command::new(forkpool_bin())
            .args(["status", "--json"])
            .env("TMPDIR", &tmp.0)
            .env_remove("XDG_RUNTIME_DIR")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    assert!(
        wait_until(Duration::from_secs(15), status),
        "forkpool status did not find the pool at the default path in {}",
        private.display()
    );
    let mode = std::fs::symlink_metadata(&private).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o700, "{} has mode {mode:o}", private.display());
}

/// An oversized request is refused with a clean close: the child answers
/// 413, stops sending, and reads and drops what the client still sends
/// for a moment before it closes. Closing on unread bytes instead makes
/// the kernel reset the connection, and a client's stack may then throw
/// the answer away before the client reads it (RFC 9112, 9.6).
#[test]
fn an_oversized_request_is_refused_with_a_clean_close() {
    use std::io::{Read, Write};
    let pool = DemoPool::start(&ONE_DEMO_CHILD);
    let mut stream = TcpStream::connect(pool.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    stream
        .write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3000000000\r\n\r\n")
        .unwrap();
    stream.write_all(&vec![b'x'; 256 * 1024]).unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let ended = loop {
        match stream.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) => break Err(e),
        }
    };
    let answer = String::from_utf8_lossy(&answer).into_owned();
    assert!(answer.starts_with("HTTP/1.1 413 "), "got {answer:?}");
    assert!(
        ended.is_ok(),
        "the connection ended with {ended:?} after the 413, not a clean close"
    );
}
