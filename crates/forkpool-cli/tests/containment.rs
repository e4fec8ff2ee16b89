//! Workers that stall or escape in `order` mode: a child sitting on an
//! accept order is hung; what a worker leaves behind goes with it.

mod common;
#[path = "common/worker_files.rs"]
mod worker_files;

use std::time::{Duration, Instant};

use common::DemoPool;
use worker_files::{good_app, wait_status, Scratch};

/// `forkpool run` of the Python file `app` in `order` mode with exactly
/// two children, and `extra` arguments.
fn two_children_in_order_mode(app: &str, extra: &[&str]) -> DemoPool {
    let mut args = vec!["--dispatch", "order", "--min-children", "2"];
    args.extend_from_slice(&["--max-children", "2"]);
    args.extend_from_slice(extra);
    DemoPool::start_run(&args, &["python3", app])
}

/// Slot 0's first child takes accept orders and never acts on them (it
/// still answers pings); every other child is the example worker.
fn app_with_a_stalling_first_child(flag: &str) -> String {
    format!(
        "import os, socket, struct, sys\n\
         def stall():\n    \
             ch = socket.socket(fileno=int(os.environ['FORKPOOL_CHANNEL_FD']))\n    \
             ch.setblocking(True)\n    \
             ch.send(b'\\x01R' + struct.pack('>I', os.getpid()))\n    \
             while True:\n        \
                 m = ch.recv(16)\n        \
                 if not m:\n            sys.exit(0)\n        \
                 if m[1:2] == b'p':\n            ch.send(b'\\x01P' + m[2:6])\n\
         if os.environ.get('FORKPOOL_SLOT') == '0':\n    \
             try:\n        os.close(os.open({flag:?}, os.O_CREAT | os.O_EXCL))\n    \
             except FileExistsError:\n        pass\n    \
             else:\n        stall()\n{}",
        good_app()
    )
}

/// Item 7: the connection the stalling child was ordered to take stays in
/// the backlog; the child is killed as hung after `ping_timeout` and the
/// connection is served by another.
#[test]
fn a_child_sitting_on_an_accept_order_is_killed_and_the_connection_served() {
    let dir = Scratch::new("order-stall");
    let flag = dir.path("stalled");
    dir.deploy("app.py", &app_with_a_stalling_first_child(&flag));
    let app = dir.path("app.py");
    let pool = two_children_in_order_mode(&app, &["--ping-timeout", "1s"]);
    assert!(pool.wait_children(Duration::from_secs(30), |n| n == 2));
    wait_status(&pool, Duration::from_secs(30), |s| s["idle"] == 2);
    let t0 = Instant::now();
    let answer = pool.get("/");
    let took = t0.elapsed();
    assert!(
        answer.as_ref().is_ok_and(|r| r.status == 200),
        "the connection was lost: {answer:?}\n{}",
        pool.stderr.dump()
    );
    let status = wait_status(&pool, Duration::from_secs(10), |s| {
        s["totals"]["killed_by"]["ping_timeout"] == 1
    });
    assert!(took < Duration::from_secs(10), "took {took:?}: {status}");
}

/// Every worker first forks a helper that keeps all it inherited (the
/// listener too) and sleeps; the helper records its pid in `dir`.
fn app_leaving_a_helper_behind(dir: &str) -> String {
    format!(
        "import os, sys, time\n\
         if os.fork() == 0:\n    \
             open(os.path.join({dir:?}, 'stray-%d' % os.getpid()), 'w').close()\n    \
             time.sleep(3600)\n    \
             os._exit(0)\n{}",
        good_app()
    )
}

/// The helpers' pids, from the files they left.
fn strays(dir: &Scratch) -> Vec<i32> {
    std::fs::read_dir(&dir.0)
        .unwrap()
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .to_str()?
                .strip_prefix("stray-")?
                .parse()
                .ok()
        })
        .collect()
}

fn running(pid: i32) -> bool {
    // A zombie no longer holds anything; count only live processes.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(')')
            .next()
            .is_some_and(|r| !r.starts_with(" Z"))
    })
}

/// Kills the helpers on the way out if the pool did not.
struct KillStrays<'a>(&'a Scratch);

impl Drop for KillStrays<'_> {
    fn drop(&mut self) {
        for pid in strays(self.0) {
            if running(pid) {
                common::kill9(pid);
            }
        }
    }
}

/// Item 9: after a graceful stop nothing the pool started still runs or
/// holds the listening port, even a process a worker forked with the
/// inherited listener.
#[test]
fn after_a_stop_no_process_the_pool_started_holds_the_port() {
    let dir = Scratch::new("strays");
    let _cleanup = KillStrays(&dir);
    dir.deploy("app.py", &app_leaving_a_helper_behind(&dir.path("")));
    let app = dir.path("app.py");
    let mut pool = two_children_in_order_mode(&app, &[]);
    assert!(pool.wait_children(Duration::from_secs(30), |n| n == 2));
    let deadline = Instant::now() + Duration::from_secs(30);
    while strays(&dir).len() < 2 {
        assert!(
            Instant::now() < deadline,
            "the workers' helpers never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let helpers = strays(&dir);
    pool.signal(libc::SIGTERM);
    assert!(
        pool.wait_exit(Duration::from_secs(30)).is_some(),
        "the pool did not stop"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<i32> = helpers.iter().copied().filter(|p| running(*p)).collect();
        let port_free = std::net::TcpListener::bind(pool.addr).is_ok();
        if left.is_empty() && port_free {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after the stop: helpers {left:?} still run, port free: {port_free}\n{}",
            pool.stderr.dump()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
