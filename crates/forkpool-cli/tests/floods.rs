//! Floods and lies from workers: reports a mode never sends, a stream of
//! reports past the message budget, and a stderr flood. The supervisor
//! kills the worker (`misbehaved`) or drops its output, and the others
//! keep serving.

mod common;
#[path = "common/worker_files.rs"]
mod worker_files;

use std::time::Duration;

use common::{killed_by, DemoPool};
use worker_files::{good_app, wait_status, Scratch};

/// Python that says Ready on the back-channel; `ch` is the channel.
const READY: &str = "import os, socket, struct, sys, time\n\
    ch = socket.socket(fileno=int(os.environ['FORKPOOL_CHANNEL_FD']))\n\
    ch.setblocking(True)\n\
    ch.send(b'\\x01R' + struct.pack('>I', os.getpid()))\n";

/// The first child ever started in slot 0 runs `hostile` (Python, after
/// [`READY`] unless `ready` is false); every other child is the example
/// worker.
fn app_with_a_hostile_first_child(flag: &str, hostile: &str, ready: bool) -> String {
    let body: String = [if ready { READY } else { "import sys, time\n" }, hostile]
        .concat()
        .lines()
        .map(|l| format!("    {l}\n"))
        .collect();
    format!(
        "import os\n\
         def hostile():\n{body}\
         if os.environ.get('FORKPOOL_SLOT') == '0':\n    \
             try:\n        os.close(os.open({flag:?}, os.O_CREAT | os.O_EXCL))\n    \
             except FileExistsError:\n        pass\n    \
             else:\n        hostile()\n        sys.exit(0)\n{}",
        good_app()
    )
}

/// A pool of two children where slot 0's first child runs `hostile`.
fn pool_with_hostile(name: &str, mode: &str, hostile: &str, ready: bool) -> (Scratch, DemoPool) {
    let dir = Scratch::new(name);
    let app_text = app_with_a_hostile_first_child(&dir.path("flag"), hostile, ready);
    dir.deploy("app.py", &app_text);
    let app = dir.path("app.py");
    let args = [
        "--dispatch",
        mode,
        "--min-children",
        "2",
        "--max-children",
        "2",
        "--ping-timeout",
        "20s",
    ];
    let pool = DemoPool::launch(
        {
            let mut c = std::process::Command::new(common::forkpool_bin());
            c.arg("run");
            c
        },
        &args,
        &["python3", &app],
        false,
    );
    (dir, pool)
}

/// The pool serves: a few requests in a row get 200.
fn serves(pool: &DemoPool) {
    for _ in 0..5 {
        let r = pool.get("/");
        assert!(
            r.as_ref().is_ok_and(|r| r.status == 200),
            "{r:?}\n{}",
            pool.stderr.dump()
        );
    }
}

/// `M` and `B` from a handoff child are lies: the child is killed, and
/// neither a futile wake-up nor a connection is counted.
#[test]
fn reports_a_handoff_child_never_sends_get_it_killed() {
    for (name, lie) in [("lie-m", "M"), ("lie-b", "B")] {
        let hostile =
            format!("for _ in range(100000):\n    ch.send(b'\\x01{lie}')\ntime.sleep(60)\n");
        let (_dir, pool) = pool_with_hostile(name, "handoff", &hostile, true);
        let status = wait_status(&pool, Duration::from_secs(30), |s| {
            killed_by(s, "misbehaved") >= 1
        });
        assert_eq!(status["totals"]["futile_wakeups"], 0, "{status}");
        assert_eq!(status["totals"]["accepted"], 0, "{status}");
        wait_status(&pool, Duration::from_secs(30), |s| s["idle"] == 2);
        serves(&pool);
    }
}

/// An `order` child may send `B` and `I`; one that sends them in a loop
/// (connections that never existed) runs past the message budget and is
/// killed before it can hold the supervisor busy.
#[test]
fn a_report_flood_past_the_budget_gets_the_child_killed() {
    let hostile = "while True:\n    ch.send(b'\\x01B')\n    ch.send(b'\\x01I')\n";
    let (_dir, pool) = pool_with_hostile("flood-bi", "order", hostile, true);
    let status = wait_status(&pool, Duration::from_secs(30), |s| {
        killed_by(s, "misbehaved") >= 1
    });
    // The budget is 20,000 messages a second: the lies it let through
    // stay within a second's worth.
    let accepted = status["totals"]["accepted"].as_u64().unwrap();
    assert!(accepted <= 20_000, "{status}");
    wait_status(&pool, Duration::from_secs(30), |s| s["idle"] == 2);
    serves(&pool);
}

/// A worker that writes stderr without pause (while still starting, so
/// it is never given a connection): its lines past the budget are
/// dropped, counted, and after 5 s of it the worker is killed.
#[test]
fn a_stderr_flood_is_dropped_then_the_worker_killed() {
    let hostile = "line = 'x' * 60 + '\\n'\n\
                   while True:\n    sys.stderr.write(line)\n";
    let (_dir, pool) = pool_with_hostile("flood-stderr", "handoff", hostile, false);
    let status = wait_status(&pool, Duration::from_secs(60), |s| {
        killed_by(s, "misbehaved") >= 1
    });
    let dropped = status["totals"]["stderr_lines_dropped"].as_u64().unwrap();
    assert!(dropped > 10_000, "{status}");
    // At most the burst and 10,000 lines a second were logged.
    let logged = pool.stderr.count("worker stderr: xxxx");
    assert!(logged <= 20_000 + 10_000 * 10, "{logged} lines logged");
    wait_status(&pool, Duration::from_secs(30), |s| s["idle"] == 2);
    serves(&pool);
}
