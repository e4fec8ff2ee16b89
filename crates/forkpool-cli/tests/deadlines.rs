//! Deadlines that do not punish healthy workers (issue 24, item 10): a
//! worker that has closed its back-channel and is only slow to exit (a
//! large heap being torn down) is left to finish within `exit_timeout`,
//! and when it does not make it, it is counted as `exit_timeout`, apart
//! from a worker that misbehaved.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{alive, killed_by, total, DemoPool, ONE_CHILD};

const CLIENTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../clients/python");

/// How long to wait for a pool to reach a state. Generous: these tests run
/// beside builds on a small machine; a quiet one never waits this long.
const PATIENCE: Duration = Duration::from_secs(30);

/// How long each worker below takes to exit after closing its channel.
/// Longer than the 500 ms a worker that closed its channel unasked had
/// before `exit_timeout`, and than the `--ping-timeout 1s` some tests set
/// (the old limit for a worker or template told to quit).
const TEAR_DOWN: &str = "1.5";

/// Whether python3 (3.9, for `socket.send_fds`) is here: under `CI=true`
/// its absence fails the test (`common::require`).
fn require_python() -> bool {
    let found = Command::new("python3")
        .args(["-c", "import socket; socket.send_fds"])
        .output()
        .is_ok_and(|o| o.status.success());
    common::require(
        found,
        "python3 (3.9+, for socket.send_fds)",
        "apt-get install -y python3",
    )
}

/// A worker (the Python helper) that serves until told to quit, closes its
/// channel when `serve` returns, then takes TEAR_DOWN seconds to exit, as a
/// large interpreter freeing its heap.
fn quitting_worker() -> String {
    format!(
        r#"
import sys, time
sys.path.insert(0, {CLIENTS:?})
import forkpool_worker
worker = forkpool_worker.Worker.from_env()
def handle(conn, listener):
    request = b""
    while b"\r\n\r\n" not in request:
        chunk = conn.recv(65536)
        if not chunk:
            return
        request += chunk
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
worker.serve(handle)
worker.channel.close()
time.sleep({TEAR_DOWN})
"#
    )
}

/// A worker (raw protocol) that says Ready, and a second later closes its
/// channel without a word, as a worker whose own loop ended would; then
/// it takes TEAR_DOWN seconds to exit.
fn closing_worker() -> String {
    format!(
        r#"
import os, socket, struct, time
ch = socket.socket(fileno=int(os.environ["FORKPOOL_CHANNEL_FD"]))
ch.setblocking(True)
ch.send(b"\x01R" + struct.pack(">I", os.getpid()))
time.sleep(1.2)
ch.close()
time.sleep({TEAR_DOWN})
"#
    )
}

/// The pid of slot 0 once it is serving (idle).
fn first_worker(pool: &DemoPool) -> i32 {
    let status = pool
        .wait_status(PATIENCE, |s| s["slots"][0]["pid"].as_i64().unwrap_or(0) > 0)
        .unwrap_or_else(|| panic!("no worker: {}\n{}", pool.status(), pool.stderr.dump()));
    status["slots"][0]["pid"].as_i64().unwrap() as i32
}

/// Waits (bounded) until process `pid` has exited and been reaped, then
/// until the supervisor has counted its end in `counted`.
fn wait_gone(pool: &DemoPool, pid: i32, counted: impl Fn(&serde_json::Value) -> bool) {
    let deadline = std::time::Instant::now() + PATIENCE;
    while alive(pid) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !alive(pid),
        "worker {pid} never exited\n{}",
        pool.stderr.dump()
    );
    assert!(
        pool.wait_status(PATIENCE, counted).is_some(),
        "its end was never counted: {}\n{}",
        pool.status(),
        pool.stderr.dump()
    );
}

/// Runs the quitting worker once under `extra` options: it serves one
/// request, is told to quit (`--max-requests-per-child 1`), closes its
/// channel and exits TEAR_DOWN seconds later (or is killed first). Returns
/// the status after its end is counted.
fn one_quitting_worker(
    extra: &[&str],
    counted: fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let dir = common::temp_path("deadlines-quitting");
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("worker.py");
    std::fs::write(&script, quitting_worker()).unwrap();
    let recycle = ["--max-requests-per-child", "1"];
    let args = [&ONE_CHILD[..], &recycle, extra].concat();
    let pool = DemoPool::start_run(&args, &["python3", script.to_str().unwrap()]);
    let pid = first_worker(&pool);
    let response = pool.get("/");
    assert!(
        response.as_ref().is_ok_and(|r| r.status == 200),
        "{response:?}\n{}",
        pool.stderr.dump()
    );
    wait_gone(&pool, pid, counted);
    let status = pool.status();
    let _ = std::fs::remove_dir_all(&dir);
    status
}

/// Runs the closing worker under `extra` options until the first one's
/// end is counted; returns that status.
fn one_closing_worker(
    extra: &[&str],
    counted: fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let args = [&ONE_CHILD[..], extra].concat();
    let pool = DemoPool::start_run_unready(&args, &["python3", "-c", &closing_worker()]);
    let pid = first_worker(&pool);
    wait_gone(&pool, pid, counted);
    pool.status()
}

fn no_misbehaviour(status: &serde_json::Value) {
    for reason in [
        "channel_failed",
        "misbehaved",
        "stop_timeout",
        "ping_timeout",
    ] {
        assert_eq!(killed_by(status, reason), 0, "{reason}: {status}");
    }
}

#[test]
fn a_worker_slow_to_exit_after_quitting_is_not_killed_by_default() {
    if !require_python() {
        return;
    }
    // The old limit for a worker told to quit was `ping_timeout`.
    let status = one_quitting_worker(&["--ping-timeout", "1s"], |s| total(s, "retired") >= 1);
    assert_eq!(total(&status, "killed"), 0, "{status}");
    assert_eq!(total(&status, "died"), 0, "a normal exit: {status}");
    no_misbehaviour(&status);
}

#[test]
fn a_worker_past_exit_timeout_after_quitting_counts_as_a_slow_exit() {
    if !require_python() {
        return;
    }
    // A long ping timeout: the kill is exit_timeout's doing.
    let long_ping = ["--ping-timeout", "20s", "--exit-timeout", "200ms"];
    let status = one_quitting_worker(&long_ping, |s| killed_by(s, "exit_timeout") >= 1);
    assert_eq!(killed_by(&status, "exit_timeout"), 1, "{status}");
    assert_eq!(total(&status, "killed"), 1, "{status}");
    no_misbehaviour(&status);
}

#[test]
fn a_worker_that_closes_its_channel_unasked_has_exit_timeout_to_exit() {
    if !require_python() {
        return;
    }
    let status = one_closing_worker(&[], |s| total(s, "died") >= 1);
    assert_eq!(total(&status, "killed"), 0, "{status}");
    no_misbehaviour(&status);
}

#[test]
fn a_worker_that_closes_its_channel_unasked_and_overstays_counts_as_a_slow_exit() {
    if !require_python() {
        return;
    }
    let status = one_closing_worker(&["--exit-timeout", "200ms"], |s| {
        killed_by(s, "exit_timeout") >= 1
    });
    assert!(killed_by(&status, "exit_timeout") >= 1, "{status}");
    no_misbehaviour(&status);
}

/// A program for `--preload`: the template, once told to quit, closes its
/// channel, takes TEAR_DOWN seconds (its preloaded heap), then leaves a
/// file named after its pid in the directory given as its argument, so the
/// test can tell an exit from a kill. Workers forked from it exit at once.
fn slow_template() -> String {
    format!(
        r#"
import os, sys, time
sys.path.insert(0, {CLIENTS:?})
import forkpool_worker
marks = sys.argv[1]
program = forkpool_worker.Worker.from_env()
template_pid = os.getpid()
program.serve(lambda conn, listener: None)
if os.getpid() == template_pid:
    program.channel.close()
    time.sleep({TEAR_DOWN})
    open(os.path.join(marks, str(template_pid)), "w").close()
"#
    )
}

/// Starts a preloaded pool with `extra`, stops it with TERM, and returns
/// the template's pid and whether it finished its tear-down (left its
/// file) rather than being killed.
fn stop_a_slow_template(extra: &[&str]) -> (i32, bool) {
    let dir = common::temp_path("deadlines-template");
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("app.py");
    std::fs::write(&script, slow_template()).unwrap();
    let args = [&["--preload"][..], &ONE_CHILD[..], extra].concat();
    let mut pool = DemoPool::start_run(
        &args,
        &["python3", script.to_str().unwrap(), dir.to_str().unwrap()],
    );
    let status = pool
        .wait_status(PATIENCE, |s| s["templates"][0]["state"] == "ready")
        .unwrap_or_else(|| panic!("no template: {}\n{}", pool.status(), pool.stderr.dump()));
    let pid = status["templates"][0]["pid"].as_i64().unwrap() as i32;
    pool.signal(libc::SIGTERM);
    assert!(
        pool.wait_exit(PATIENCE).is_some(),
        "the pool did not stop\n{}",
        pool.stderr.dump()
    );
    let deadline = std::time::Instant::now() + PATIENCE;
    while alive(pid) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!alive(pid), "the template outlived the pool");
    let finished = dir.join(pid.to_string()).exists();
    let _ = std::fs::remove_dir_all(&dir);
    (pid, finished)
}

#[test]
fn a_template_slow_to_exit_after_quit_is_left_to_finish_by_default() {
    if !require_python() {
        return;
    }
    // The old limit for a template told to quit was `ping_timeout`.
    let (pid, finished) = stop_a_slow_template(&["--ping-timeout", "1s"]);
    assert!(
        finished,
        "template {pid} was killed before it finished exiting"
    );
}

#[test]
fn a_template_past_exit_timeout_after_quit_is_killed() {
    if !require_python() {
        return;
    }
    let long_ping = ["--ping-timeout", "20s", "--exit-timeout", "200ms"];
    let (pid, finished) = stop_a_slow_template(&long_ping);
    assert!(
        !finished,
        "template {pid} was not held to --exit-timeout 200ms"
    );
}
