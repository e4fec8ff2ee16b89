//! `forkpool run`: workers that are other programs (Python, Perl, Rust, and
//! unmodified socket-activated scripts), against the real supervisor.

#[path = "common/bench_bins.rs"]
mod bench_bins;
mod common;
#[path = "common/example_workers.rs"]
mod example_workers;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{concurrent_gets, final_totals, forkpool_bin, kill9, killed_by, total, DemoPool};
use example_workers::{rust_worker, PERL_WORKER, PYTHON_WORKER};

fn python(extra: &[&'static str]) -> Vec<&'static str> {
    [&["python3", PYTHON_WORKER][..], extra].concat()
}

fn perl(extra: &[&'static str]) -> Vec<&'static str> {
    [&["perl", PERL_WORKER][..], extra].concat()
}

/// How long to wait for workers to start. Generous: these tests run
/// beside builds and benchmarks on a small machine, where a Python start
/// can take seconds; a quiet machine never waits this long.
const START: Duration = Duration::from_secs(30);

/// `forkpool run ARGS -- CMD`, with a start deadline (ping interval plus
/// ping timeout) long enough that a slow start on a loaded machine is not
/// killed as a hung worker.
fn start_run(args: &[&str], cmd: &[&str]) -> DemoPool {
    let mut all = vec!["--ping-timeout", "20s"];
    all.extend_from_slice(args);
    DemoPool::start_run(&all, cmd)
}

/// A directory for scripts a test writes, removed when the test ends.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("forkpool-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn write(&self, file: &str, text: &str) -> String {
        let path = self.0.join(file);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const SCALING: [&str; 10] = [
    "--min-children",
    "1",
    "--max-children",
    "8",
    "--min-spare",
    "1",
    "--max-spare",
    "1",
    "--retire-grace",
    "200ms",
];

/// Six slow requests at once make the pool grow to (at least) six workers,
/// which serve side by side; afterwards the surplus is retired.
fn grows_under_load_then_shrinks(dispatch: &str, cmd: &[&str]) {
    let mut args = SCALING.to_vec();
    args.extend(["--dispatch", dispatch]);
    let pool = start_run(&args, cmd);
    assert!(
        pool.wait_idle(1, START),
        "the first worker never became ready:\n{}",
        pool.stderr.dump()
    );
    assert_eq!(pool.children().len(), 1);
    let addr = pool.addr;
    let load = std::thread::spawn(move || concurrent_gets(addr, "/?work_ms=2500", 6));
    let grew = pool.wait_children(START, |n| n >= 6);
    let results = load.join().unwrap();
    assert!(grew, "the pool did not grow:\n{}", pool.stderr.dump());
    let mut slots = BTreeSet::new();
    for r in &results {
        let r = r
            .as_ref()
            .unwrap_or_else(|e| panic!("{e}\n{}", pool.stderr.dump()));
        assert_eq!(r.status, 200);
        assert_eq!(r.body, "hello\n");
        slots.insert(r.slot.expect("X-Forkpool-Slot"));
    }
    // On a quiet machine all six run side by side, one worker each; a
    // loaded one may start some workers after others have finished, so
    // ask only that the new workers really took part.
    assert!(
        slots.len() >= 3,
        "slots used: {slots:?}\n{}",
        pool.stderr.dump()
    );
    assert!(
        pool.wait_children(START, |n| n <= 2),
        "pool did not shrink: {} children\n{}",
        pool.children().len(),
        pool.stderr.dump()
    );
    // At least four of the six grown were retired as surplus, not killed.
    assert!(
        pool.wait_total("retired", 4, Duration::from_secs(5)),
        "{}",
        pool.stderr.dump()
    );
    let status = pool.status();
    assert_eq!(total(&status, "killed"), 0, "{status}");
    assert_eq!(total(&status, "died"), 0, "{status}");
}

#[test]
fn python_worker_in_handoff_grows_under_load_and_shrinks_after() {
    grows_under_load_then_shrinks("handoff", &python(&[]));
}

#[test]
fn python_worker_in_order_grows_under_load_and_shrinks_after() {
    grows_under_load_then_shrinks("order", &python(&[]));
}

#[test]
fn perl_worker_in_handoff_grows_under_load_and_shrinks_after() {
    grows_under_load_then_shrinks("handoff", &perl(&[]));
}

#[test]
fn perl_worker_in_order_grows_under_load_and_shrinks_after() {
    grows_under_load_then_shrinks("order", &perl(&[]));
}

#[test]
fn rust_worker_in_handoff_grows_under_load_and_shrinks_after() {
    grows_under_load_then_shrinks("handoff", &[rust_worker()]);
}

/// Three slow requests at once are served by three different workers.
fn serves_side_by_side(dispatch: &str, cmd: &[&str]) {
    let pool = start_run(&["--dispatch", dispatch, "--min-children", "3"], cmd);
    assert!(pool.wait_idle(3, START), "{}", pool.stderr.dump());
    let results = concurrent_gets(pool.addr, "/?work_ms=600", 3);
    let pids: BTreeSet<i32> = results
        .iter()
        .map(|r| {
            let r = r
                .as_ref()
                .unwrap_or_else(|e| panic!("{e}\n{}", pool.stderr.dump()));
            assert_eq!(r.status, 200);
            r.pid.expect("X-Forkpool-Pid")
        })
        .collect();
    assert_eq!(pids.len(), 3, "{results:?}");
}

#[test]
fn perl_worker_in_shared_serves_side_by_side() {
    serves_side_by_side("shared", &perl(&[]));
}

#[test]
fn python_worker_in_shared_serves_side_by_side() {
    serves_side_by_side("shared", &python(&[]));
}

#[test]
fn rust_worker_in_order_and_shared_serves_side_by_side() {
    serves_side_by_side("order", &[rust_worker()]);
    serves_side_by_side("shared", &[rust_worker()]);
}

/// `forkpool run ARGS -- CMD` for workers that never become ready.
/// A pool of one worker gets 8 slow requests at once: it takes each next
/// one itself (see `common::assert_takes_the_next_waiting_connection`).
fn takes_the_next_waiting_connection(cmd: &[&str]) {
    let pool = start_run(
        &[&common::ONE_CHILD[..], &["--dispatch", "handoff"]].concat(),
        cmd,
    );
    common::assert_takes_the_next_waiting_connection(&pool);
}

#[test]
fn python_worker_in_handoff_takes_the_next_waiting_connection() {
    takes_the_next_waiting_connection(&python(&[]));
}

#[test]
fn perl_worker_in_handoff_takes_the_next_waiting_connection() {
    takes_the_next_waiting_connection(&perl(&[]));
}

#[test]
fn rust_worker_in_handoff_takes_the_next_waiting_connection() {
    takes_the_next_waiting_connection(&[rust_worker()]);
}

/// An oversized request gets its 413 and a clean close (FIN), not a reset,
/// even though the client is still sending: the worker stops sending and
/// drops what comes for a moment before it closes.
#[test]
fn python_worker_refuses_an_oversized_request_with_a_clean_close() {
    use std::io::{Read, Write};
    let pool = start_run(&common::ONE_CHILD, &python(&[]));
    let mut stream = std::net::TcpStream::connect(pool.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    stream
        .write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3000000000\r\n\r\n")
        .unwrap();
    stream.write_all(&vec![b'x'; 256 * 1024]).unwrap();
    let mut answer = Vec::new();
    let ended = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).into_owned();
    assert!(answer.starts_with("HTTP/1.1 413 "), "got {answer:?}");
    assert!(ended.is_ok(), "ended with {ended:?} after the 413");
}

/// Without a usable syscall.ph (here: an empty one, found first on @INC)
/// the Perl helper cannot call recvmsg(2), and refuses `handoff` naming
/// the fix.
#[test]
fn perl_without_syscall_ph_refuses_handoff_with_a_clear_error() {
    let scratch = Scratch::new("no-syscall-ph");
    scratch.write("syscall.ph", "1;\n");
    let dir = scratch.0.to_str().unwrap();
    let pool = DemoPool::start_run_unready(
        &["--min-children", "1", "--dispatch", "handoff"],
        &["perl", "-I", dir, PERL_WORKER],
    );
    // The worker dies at start-up and never becomes ready...
    assert!(pool.wait_total("died", 1, START), "{}", pool.stderr.dump());
    assert_eq!(pool.status()["idle"], 0);
    // ...and the error message naming the fix is the feature: check it second.
    assert!(
        pool.stderr.wait_for(
            "worker stderr: example_http_worker: dispatch 'handoff' passes connections \
             with SCM_RIGHTS, which needs recvmsg(2): core Perl has none, and this helper \
             calls it with syscall(), but syscall.ph, which numbers the system calls, \
             is missing or broken (install your system's perl headers",
            START
        ),
        "{}",
        pool.stderr.dump()
    );
}

/// Plays the supervisor for one Perl worker in `handoff` mode: waits for
/// Ready, sends a Connection (`C`) with no descriptor attached, and
/// prints the worker's exit status and standard error. Bounded: the
/// worker gets 10 s to die.
const BARE_CONNECTION: &str = r#"
import os, socket, subprocess, sys

parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
parent.settimeout(20)
env = dict(os.environ, FORKPOOL_DISPATCH="handoff", FORKPOOL_PROTOCOL="1",
           FORKPOOL_CHANNEL_FD="3", FORKPOOL_SLOT="0", FORKPOOL_GENERATION="1")
env.pop("LISTEN_FDS", None)
worker = subprocess.Popen(["perl", sys.argv[1]], env=env, stderr=subprocess.PIPE,
                          close_fds=False, preexec_fn=lambda: os.dup2(child.fileno(), 3))
child.close()
ready = parent.recv(16)
assert ready[:2] == b"\x01R", ready
parent.send(b"\x01C\x00\x00")
status = worker.wait(10)
print(f"status {status}: {worker.stderr.read().decode()}", flush=True)
"#;

#[test]
fn perl_worker_in_handoff_exits_on_a_connection_without_a_descriptor() {
    let scratch = Scratch::new("bare-connection");
    let script = scratch.write("bare_connection.py", BARE_CONNECTION);
    let out = Command::new("python3")
        .args([&script, PERL_WORKER])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!stdout.starts_with("status 0:"), "{stdout}");
    assert!(
        stdout.contains(
            "back-channel protocol error: a connection message 'C' came with 0 \
             descriptors instead of exactly one"
        ),
        "{stdout}"
    );
}

/// Killing a worker gets it replaced; the pool keeps serving.
fn killed_worker_is_replaced(dispatch: &str, cmd: &[&str]) {
    let pool = start_run(&["--dispatch", dispatch, "--min-children", "2"], cmd);
    assert!(pool.wait_children(START, |n| n == 2));
    assert!(pool.wait_idle(2, START), "{}", pool.stderr.dump());
    let before = pool.children();
    kill9(before[0]);
    assert!(
        pool.wait_total("died", 1, Duration::from_secs(5)),
        "{}",
        pool.stderr.dump()
    );
    assert!(
        pool.wait_child_pids(START, |pids| {
            pids.len() == 2 && !pids.contains(&before[0])
        }),
        "{}",
        pool.stderr.dump()
    );
    for _ in 0..3 {
        let r = pool.get("/").unwrap();
        assert_eq!(r.status, 200);
        assert_ne!(r.pid, Some(before[0]));
    }
}

#[test]
fn killed_python_worker_is_replaced() {
    killed_worker_is_replaced("handoff", &python(&[]));
}

#[test]
fn killed_perl_worker_is_replaced() {
    killed_worker_is_replaced("handoff", &perl(&[]));
    killed_worker_is_replaced("order", &perl(&[]));
}

/// A worker that writes garbage on its back-channel is killed and
/// replaced; the supervisor carries on serving.
fn garbage_writer_is_killed(dispatch: &str, cmd: &[&str]) {
    let pool = start_run(&["--dispatch", dispatch, "--min-children", "2"], cmd);
    assert!(pool.wait_idle(2, START), "{}", pool.stderr.dump());
    let r = pool.get("/?chaos=garbage").unwrap();
    assert_eq!(r.status, 200);
    let victim = r.pid.unwrap();
    assert!(
        pool.wait_status(Duration::from_secs(5), |s| killed_by(s, "misbehaved") == 1)
            .is_some(),
        "{}",
        pool.stderr.dump()
    );
    // Saying what the worker sent wrong is the feature: checked second.
    assert!(
        pool.stderr.wait_for(
            "sent a malformed message: unknown message kind 'Z'",
            Duration::from_secs(5)
        ),
        "{}",
        pool.stderr.dump()
    );
    assert!(pool.wait_child_pids(START, |pids| { pids.len() == 2 && !pids.contains(&victim) }));
    for _ in 0..4 {
        let r = pool.get("/").unwrap();
        assert_eq!(r.status, 200);
        assert_ne!(r.pid, Some(victim));
    }
}

#[test]
fn python_worker_writing_garbage_is_killed_and_the_supervisor_survives() {
    garbage_writer_is_killed("handoff", &python(&["--chaos"]));
}

#[test]
fn perl_worker_writing_garbage_is_killed_and_the_supervisor_survives() {
    garbage_writer_is_killed("handoff", &perl(&["--chaos"]));
    garbage_writer_is_killed("order", &perl(&["--chaos"]));
}

/// An unmodified program that only knows socket activation: no helper,
/// no protocol. It crashes on `GET /crash`, and ignores SIGTERM in slot 1
/// when asked to.
const SOCKET_ACTIVATED: &str = r#"
import os, signal, socket, sys

assert int(os.environ["LISTEN_PID"]) == os.getpid(), "LISTEN_PID is not mine"
assert os.environ["LISTEN_FDS"] == "1"
slot = os.environ["FORKPOOL_SLOT"]
if "--stubborn" in sys.argv and slot == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
listener = socket.socket(fileno=3)
print(f"socket-activated worker up in slot {slot}", file=sys.stderr, flush=True)
while True:
    conn, _ = listener.accept()
    with conn:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(4096)
            if not chunk:
                break
            head += chunk
        if head.startswith(b"GET /crash "):
            os._exit(7)
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n"
            b"X-Forkpool-Pid: %d\r\nX-Forkpool-Slot: %s\r\n\r\nhello\n"
            % (os.getpid(), slot.encode())
        )
"#;

#[test]
fn dispatch_none_serves_an_unmodified_program_and_restarts_a_crash() {
    let scratch = Scratch::new("none-serve");
    let script = scratch.write("activated.py", SOCKET_ACTIVATED);
    let pool = DemoPool::start_run(
        &["--dispatch", "none", "--min-children", "2"],
        &["python3", &script],
    );
    // The supervisor cannot tell idle from busy: both count as busy.
    assert!(
        pool.wait_status(START, |s| s["busy"] == 2).is_some(),
        "{}",
        pool.stderr.dump()
    );
    let results = concurrent_gets(pool.addr, "/", 8);
    assert!(results
        .iter()
        .all(|r| r.as_ref().is_ok_and(|r| r.status == 200)));
    // A fixed pool: the load did not grow it.
    assert_eq!(pool.children().len(), 2);
    assert_eq!(total(&pool.status(), "spawned"), 2);

    let before = pool.children();
    assert!(pool.get("/crash").is_err(), "the crash takes the request");
    assert!(
        pool.wait_total("died", 1, Duration::from_secs(5)),
        "{}",
        pool.stderr.dump()
    );
    assert!(
        pool.wait_child_pids(START, |pids| {
            pids.len() == 2 && pids.iter().any(|p| !before.contains(p))
        }),
        "{}",
        pool.stderr.dump()
    );
    assert!(
        pool.wait_status(START, |s| total(s, "spawned") == 3 && s["busy"] == 2)
            .is_some(),
        "{}",
        pool.stderr.dump()
    );
    for _ in 0..4 {
        assert_eq!(pool.get("/").unwrap().status, 200);
    }
}

#[test]
fn dispatch_none_stops_with_sigterm_then_sigkill_after_the_timeout() {
    let scratch = Scratch::new("none-stop");
    let script = scratch.write("activated.py", SOCKET_ACTIVATED);
    let mut pool = DemoPool::start_run(
        &[
            "--dispatch",
            "none",
            "--min-children",
            "2",
            "--shutdown-timeout",
            "700ms",
        ],
        &["python3", &script, "--stubborn"],
    );
    assert!(
        pool.wait_status(START, |s| s["busy"] == 2).is_some(),
        "{}",
        pool.stderr.dump()
    );
    // The stubborn one is in slot 1; it must ignore SIGTERM before we ask.
    let stubborn = |s: &serde_json::Value| {
        let pid = s["slots"][1]["pid"].as_i64().unwrap_or(0) as i32;
        (pid > 0 && common::ignores_signal(pid, libc::SIGTERM)).then_some(pid)
    };
    let status = pool
        .wait_status(START, |s| stubborn(s).is_some())
        .unwrap_or_else(|| panic!("slot 1 never ignored SIGTERM\n{}", pool.stderr.dump()));
    let stubborn = stubborn(&status).unwrap();
    let asked = Instant::now();
    pool.signal(15);
    let status = pool
        .wait_exit(Duration::from_secs(5))
        .expect("supervisor exits");
    assert!(status.success());
    assert!(asked.elapsed() >= Duration::from_millis(700));
    // Slot 0 obeyed SIGTERM; slot 1 ignored it and was killed at the deadline.
    let totals = final_totals(&pool);
    assert_eq!(killed_by(&totals, "stop_timeout"), 1, "{totals}");
    assert_eq!(total(&totals, "killed"), 1, "{totals}");
    assert_eq!(total(&totals, "retired"), 2, "{totals}");
    assert!(!common::alive(stubborn));
}

/// A worker that can never start is retried with a growing delay: a
/// handful of attempts in 3 s, never a fork loop, and a clear error.
fn backs_off(args: &[&str], cmd: &[&str], status: &str) -> DemoPool {
    let pool = DemoPool::start_run_unready(args, cmd);
    // Without back-off this would be hundreds within the 3 s.
    assert!(!pool.wait_total("spawned", 16, Duration::from_secs(3)));
    let spawned = total(&pool.status(), "spawned");
    assert!(
        (3..=10).contains(&spawned),
        "{spawned} children spawned in 3 s:\n{}",
        pool.stderr.dump()
    );
    // The operator is told why and when it retries: the message is the
    // feature, checked after the count.
    for line in [
        format!("worker exited during start-up ({status}); check the command and its stderr: retrying in 100ms"),
        "retrying in 200ms".to_string(),
        "retrying in 400ms".to_string(),
    ] {
        assert!(pool.stderr.count(&line) >= 1, "no '{line}' in:\n{}", pool.stderr.dump());
    }
    pool
}

#[test]
fn a_command_that_cannot_be_executed_backs_off_with_a_clear_error() {
    let mut pool = backs_off(
        &["--min-children", "2"],
        &["/nonexistent/forkpool-worker", "--flag"],
        "exit status 127",
    );
    assert!(
        pool.stderr.count(
            "worker stderr: forkpool: slot 0: cannot run `/nonexistent/forkpool-worker --flag`: \
         No such file or directory (os error 2)"
        ) >= 1
    );
    // The supervisor itself is fine and stops cleanly.
    pool.signal(15);
    let status = pool
        .wait_exit(Duration::from_secs(5))
        .expect("supervisor exits");
    assert!(status.success());
}

#[test]
fn a_command_that_exits_at_once_backs_off_in_none_mode_too() {
    backs_off(
        &["--dispatch", "none", "--min-children", "2"],
        &["sh", "-c", "echo giving up >&2; exit 3"],
        "exit status 3",
    );
}

/// Reports what the worker process holds: every open descriptor (what it
/// points to, socket type, listening or not, non-blocking or not) and the
/// environment forkpool sets. On stderr, so the supervisor logs it with
/// the slot, and a line on stdout, which must come through as well.
const FD_REPORT: &str = r#"
import fcntl, json, os, socket, sys, time

fds = {}
for name in os.listdir("/proc/self/fd"):
    fd = int(name)
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        continue  # the listing's own descriptor, closed by now
    entry = {"target": target}
    if target.startswith("socket:"):
        s = socket.socket(fileno=fd)
        entry["type"] = s.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE)
        entry["listening"] = bool(s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
        s.detach()
    entry["nonblocking"] = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK)
    fds[fd] = entry
names = ["LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES", "FORKPOOL_CHANNEL_FD",
         "FORKPOOL_PROTOCOL", "FORKPOOL_SLOT", "FORKPOOL_GENERATION", "FORKPOOL_DISPATCH",
         "FORKPOOL_OVERFLOW_FD", "FORKPOOL_BOARD_FD", "FORKPOOL_MAX_REQUESTS",
         "FORKPOOL_KERNEL_DISPATCH", "FORKPOOL_BACKLOG"]
report = {"pid": os.getpid(), "fds": fds, "env": {n: os.environ.get(n) for n in names}}
print("FDREPORT " + json.dumps(report), file=sys.stderr, flush=True)
print(f"stdout of worker {os.getpid()}", flush=True)
time.sleep(60)
"#;

struct FdReport {
    pid: i64,
    fds: BTreeMap<i32, serde_json::Value>,
    env: serde_json::Map<String, serde_json::Value>,
}

/// Runs the report script as the worker of `forkpool ARGS` (started
/// through `sh` so the supervisor inherits stray descriptors 7 and 9
/// without close-on-exec, which must not reach the worker either).
fn fd_report(name: &str, args: &[&str]) -> (DemoPool, FdReport) {
    let scratch = Scratch::new(name);
    let script = scratch.write("report.py", FD_REPORT);
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(r#"exec 7</dev/null 9</dev/null; exec "$0" "$@""#)
        .arg(forkpool_bin())
        .args(["run", "--min-children", "1"])
        .args(["--min-spare", "0", "--max-spare", "0"]);
    // The script never says ready; in `none` mode there is nothing to say.
    let none = args.contains(&"none");
    let pool = DemoPool::launch(command, args, &["python3", &script], none);
    assert!(
        pool.stderr.wait_for("worker stderr: FDREPORT ", START),
        "{}",
        pool.stderr.dump()
    );
    let line = pool
        .stderr
        .dump()
        .lines()
        .find(|l| l.contains("worker stderr: FDREPORT "))
        .unwrap()
        .to_string();
    // The log line is `... worker stderr: FDREPORT {json} slot=0 pid=N`.
    let json = line.split_once("FDREPORT ").unwrap().1;
    let json = json.rsplit_once(" slot=").unwrap().0;
    let value: serde_json::Value = serde_json::from_str(json).unwrap();
    let report = FdReport {
        pid: value["pid"].as_i64().unwrap(),
        fds: value["fds"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.parse().unwrap(), v.clone()))
            .collect(),
        env: value["env"].as_object().unwrap().clone(),
    };
    // Logged with the slot and pid of the worker that wrote it.
    let slot = env_of(&report, "FORKPOOL_SLOT").unwrap();
    assert!(
        line.ends_with(&format!(" slot={slot} pid={}", report.pid)),
        "{line}"
    );
    assert!(pool.stdout.wait_for(
        &format!("stdout of worker {}", report.pid),
        Duration::from_secs(5)
    ));
    (pool, report)
}

fn env_of(report: &FdReport, name: &str) -> Option<String> {
    report.env[name].as_str().map(str::to_string)
}

/// Standard streams: stdin is /dev/null, stderr the supervisor's pipe.
fn check_std_streams(report: &FdReport) {
    assert_eq!(report.fds[&0]["target"], "/dev/null");
    assert!(report.fds[&1]["target"]
        .as_str()
        .unwrap()
        .starts_with("pipe:"));
    assert!(report.fds[&2]["target"]
        .as_str()
        .unwrap()
        .starts_with("pipe:"));
    assert_ne!(report.fds[&1]["target"], report.fds[&2]["target"]);
}

const SOCK_STREAM: i64 = 1;
const SOCK_SEQPACKET: i64 = 5;

#[test]
fn fd_hygiene_handoff_worker_gets_the_listener_then_the_channel() {
    let (_pool, report) = fd_report("fds-handoff", &["--dispatch", "handoff"]);
    let fds: Vec<i32> = report.fds.keys().copied().collect();
    assert_eq!(fds, [0, 1, 2, 3, 4], "{:?}", report.fds);
    check_std_streams(&report);
    // The listener, to take the next waiting connection itself (`N`).
    assert_eq!(report.fds[&3]["type"], SOCK_STREAM);
    assert_eq!(report.fds[&3]["listening"], true);
    assert_eq!(report.fds[&3]["nonblocking"], true);
    assert_eq!(report.fds[&4]["type"], SOCK_SEQPACKET);
    assert_eq!(report.fds[&4]["listening"], false);
    assert_eq!(env_of(&report, "FORKPOOL_CHANNEL_FD").as_deref(), Some("4"));
    assert_eq!(env_of(&report, "FORKPOOL_PROTOCOL").as_deref(), Some("1"));
    assert_eq!(env_of(&report, "FORKPOOL_SLOT").as_deref(), Some("0"));
    assert_eq!(env_of(&report, "FORKPOOL_GENERATION").as_deref(), Some("1"));
    assert_eq!(
        env_of(&report, "FORKPOOL_DISPATCH").as_deref(),
        Some("handoff")
    );
    // The pool's backlog, the default here, for a runtime that must pass
    // it to `listen` (`none` below sets its own).
    assert_eq!(env_of(&report, "FORKPOOL_BACKLOG").as_deref(), Some("1024"));
    assert_eq!(env_of(&report, "LISTEN_FDS").as_deref(), Some("1"));
    assert_eq!(
        env_of(&report, "LISTEN_PID"),
        Some(report.pid.to_string()),
        "LISTEN_PID must be the worker's own pid"
    );
}

/// Kernel dispatch (docs/protocol.md, "What a kernel dispatch worker
/// finds"): its own sockets, the channel where it always is, the
/// overflow listeners, then the scoreboard.
#[test]
fn fd_hygiene_kernel_worker_gets_its_sockets_the_channel_the_overflow_and_the_board() {
    let (pool, report) = fd_report(
        "fds-kernel",
        &[
            "--dispatch",
            "kernel",
            "--listen",
            "127.0.0.1:0",
            "--listen",
            "127.0.0.1:0",
            "--max-requests-per-child",
            "50",
        ],
    );
    let status = pool.status();
    if !common::require(
        status["dispatch"] == "kernel",
        &format!("kernel dispatch ({})", status["dispatch_fallback"]),
        "run as root on Linux 5.12 or later (CAP_BPF)",
    ) {
        return;
    }
    let fds: Vec<i32> = report.fds.keys().copied().collect();
    assert_eq!(fds, [0, 1, 2, 3, 4, 5, 6, 7, 8], "{:?}", report.fds);
    check_std_streams(&report);
    // Own sockets, then (after the channel) the pool's listeners: all
    // listening, non-blocking, and eight distinct sockets.
    for listener in [3, 4, 6, 7] {
        assert_eq!(report.fds[&listener]["type"], SOCK_STREAM);
        assert_eq!(report.fds[&listener]["listening"], true);
        assert_eq!(report.fds[&listener]["nonblocking"], true);
    }
    let targets: BTreeSet<_> = [3, 4, 6, 7]
        .iter()
        .map(|fd| report.fds[fd]["target"].to_string())
        .collect();
    assert_eq!(targets.len(), 4, "{:?}", report.fds);
    assert_eq!(report.fds[&5]["type"], SOCK_SEQPACKET);
    assert_eq!(report.fds[&8]["target"], "anon_inode:bpf-map");
    for (var, value) in [
        ("LISTEN_FDS", "2"),
        ("FORKPOOL_CHANNEL_FD", "5"),
        ("FORKPOOL_OVERFLOW_FD", "6"),
        ("FORKPOOL_BOARD_FD", "8"),
        // Kernel dispatch is handoff to a worker that does not know it.
        ("FORKPOOL_DISPATCH", "handoff"),
        ("FORKPOOL_KERNEL_DISPATCH", "1"),
    ] {
        assert_eq!(env_of(&report, var).as_deref(), Some(value), "{var}");
    }
    let share: u64 = env_of(&report, "FORKPOOL_MAX_REQUESTS")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(share, 50, "no jitter asked for");
}

#[test]
fn fd_hygiene_order_worker_gets_the_listeners_then_the_channel() {
    let dir = Scratch::new("fds-unix");
    let unix = format!("unix:{}", dir.0.join("second.sock").display());
    let (_pool, report) = fd_report(
        "fds-order",
        &[
            "--dispatch",
            "order",
            "--listen",
            "public=127.0.0.1:0",
            "--listen",
            &unix,
        ],
    );
    let fds: Vec<i32> = report.fds.keys().copied().collect();
    assert_eq!(fds, [0, 1, 2, 3, 4, 5], "{:?}", report.fds);
    check_std_streams(&report);
    for listener in [3, 4] {
        assert_eq!(report.fds[&listener]["type"], SOCK_STREAM);
        assert_eq!(report.fds[&listener]["listening"], true);
        // Shared with the supervisor, which must never block on it.
        assert_eq!(report.fds[&listener]["nonblocking"], true);
    }
    assert_eq!(report.fds[&5]["type"], SOCK_SEQPACKET);
    assert_eq!(env_of(&report, "LISTEN_FDS").as_deref(), Some("2"));
    assert_eq!(
        env_of(&report, "LISTEN_PID"),
        Some(report.pid.to_string()),
        "LISTEN_PID must be the worker's own pid"
    );
    assert_eq!(
        env_of(&report, "LISTEN_FDNAMES").as_deref(),
        Some("public:listener1")
    );
    assert_eq!(env_of(&report, "FORKPOOL_CHANNEL_FD").as_deref(), Some("5"));
    assert_eq!(
        env_of(&report, "FORKPOOL_DISPATCH").as_deref(),
        Some("order")
    );
}

#[test]
fn fd_hygiene_none_worker_gets_blocking_listeners_and_no_channel() {
    let (_pool, report) = fd_report(
        "fds-none",
        &[
            "--dispatch",
            "none",
            "--listen",
            "127.0.0.1:0",
            "--listen",
            "127.0.0.1:0",
            "--backlog",
            "77",
        ],
    );
    let fds: Vec<i32> = report.fds.keys().copied().collect();
    assert_eq!(fds, [0, 1, 2, 3, 4], "{:?}", report.fds);
    check_std_streams(&report);
    for listener in [3, 4] {
        assert_eq!(report.fds[&listener]["listening"], true);
        // As systemd passes them: plain programs accept in blocking mode.
        assert_eq!(report.fds[&listener]["nonblocking"], false);
    }
    assert_eq!(env_of(&report, "LISTEN_FDS").as_deref(), Some("2"));
    assert_eq!(env_of(&report, "LISTEN_PID"), Some(report.pid.to_string()));
    assert_eq!(env_of(&report, "FORKPOOL_CHANNEL_FD"), None);
    assert_eq!(env_of(&report, "FORKPOOL_PROTOCOL"), None);
    assert_eq!(
        env_of(&report, "FORKPOOL_DISPATCH").as_deref(),
        Some("none")
    );
    assert_eq!(env_of(&report, "FORKPOOL_BACKLOG").as_deref(), Some("77"));
}

#[test]
fn run_without_a_command_is_a_usage_error() {
    let out = Command::new(forkpool_bin())
        .args(["run", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no command to run: put it after `--`"),
        "{stderr}"
    );
}

#[test]
fn the_command_can_come_from_the_config_file() {
    let scratch = Scratch::new("config-command");
    let config = scratch.write(
        "pool.toml",
        &format!(
            "command = [\"python3\", \"{PYTHON_WORKER}\"]\n\n[pool]\nmin_children = 1\n\
             ping_timeout = \"20s\"\n"
        ),
    );
    let mut command = Command::new(forkpool_bin());
    command.arg("run");
    let pool = DemoPool::launch(command, &["--config", &config], &[], true);
    let r = pool.get("/").unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body, "hello\n");
}
