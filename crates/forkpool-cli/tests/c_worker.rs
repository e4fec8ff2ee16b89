//! The C worker in `clients/c/forkpool_worker.c`, compiled with `cc` and run
//! under the real `forkpool run` in `handoff`, `order` and `shared` dispatch:
//! several slots answer, the pool grows under concurrent slow requests, a
//! SIGKILLed worker is replaced, and SIGTERM stops the pool with no process
//! left.

#[path = "common/c_worker_build.rs"]
mod c_worker_build;
mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use c_worker_build::build_worker;
use common::alive;

/// A running `forkpool run` pool of the C worker, killed (with its workers)
/// on Drop.
struct Pool {
    sup: Child,
    control: PathBuf,
    addr: SocketAddr,
    /// The supervisor's stdout, kept open for what it prints at exit.
    _stdout: BufReader<ChildStdout>,
    _dir: tempfile_dir::Dir,
}

mod tempfile_dir {
    use std::path::{Path, PathBuf};

    /// A fresh directory under the system temp dir, removed on Drop.
    pub struct Dir(PathBuf);

    impl Dir {
        pub fn new(tag: &str) -> Dir {
            let p = std::env::temp_dir().join(format!(
                "forkpool-c-worker-{tag}-{}-{:?}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos()
            ));
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// The address the supervisor says it listens on (`forkpool: listening on
/// ADDR`, its first line): the port is the kernel's choice, so no other
/// test's connection can take it between a probe and the bind.
fn listening_address(stdout: &mut BufReader<ChildStdout>) -> SocketAddr {
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read forkpool's stdout");
    line.trim()
        .strip_prefix("forkpool: listening on ")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("forkpool did not say where it listens: {line:?}"))
}

impl Pool {
    fn start(mode: &str, extra: &[&str]) -> Option<Pool> {
        let dir = tempfile_dir::Dir::new(mode);
        let worker = build_worker(dir.path())?;
        let control = dir.path().join("control.sock");
        let mut sup = Command::new(env!("CARGO_BIN_EXE_forkpool"))
            .arg("run")
            .args(["--dispatch", mode, "--listen", "127.0.0.1:0"])
            .arg("--control")
            .arg(&control)
            .args(["--ping-interval", "300ms", "--ping-timeout", "1s"])
            .args(["--shutdown-timeout", "5s"])
            .args(extra)
            .arg("--")
            .arg(&worker)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start forkpool run");
        let mut stdout = BufReader::new(sup.stdout.take().expect("piped stdout"));
        let addr = listening_address(&mut stdout);
        let pool = Pool {
            sup,
            control,
            addr,
            _stdout: stdout,
            _dir: dir,
        };
        pool.wait_for("the pool to come up with idle workers", |s| {
            s["idle"].as_u64().unwrap_or(0) >= 1
        });
        Some(pool)
    }

    fn status(&self) -> Option<Value> {
        let out = Command::new(env!("CARGO_BIN_EXE_forkpool"))
            .args(["status", "--json", "--control"])
            .arg(&self.control)
            .output()
            .ok()?;
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Polls the status until `ok` holds, for at most 20 s.
    fn wait_for(&self, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut last = None;
        while Instant::now() < deadline {
            if let Some(s) = self.status() {
                if ok(&s) {
                    return s;
                }
                last = Some(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("timed out waiting for {what}; last status: {last:?}");
    }

    fn worker_pids(status: &Value) -> Vec<i32> {
        status["slots"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|s| s["pid"].as_i64())
            .map(|p| p as i32)
            .collect()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Some(s) = self.status() {
            for pid in Pool::worker_pids(&s) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        let _ = self.sup.kill();
        let _ = self.sup.wait();
    }
}

/// One GET; returns the status code and the X-Forkpool-Slot value.
fn get(addr: SocketAddr, work_ms: u64) -> (u16, String) {
    let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(c, "GET /?work_ms={work_ms} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut resp = String::new();
    c.read_to_string(&mut resp).unwrap();
    let code = resp.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let slot = resp
        .lines()
        .find_map(|l| l.strip_prefix("X-Forkpool-Slot: "))
        .unwrap_or("")
        .trim()
        .to_string();
    assert!(
        resp.ends_with("hello\n") || code != 200,
        "unexpected answer: {resp}"
    );
    (code, slot)
}

fn grows_and_several_slots_answer(mode: &str) {
    let Some(pool) = Pool::start(
        mode,
        &[
            "--min-children",
            "1",
            "--min-spare",
            "1",
            "--max-spare",
            "8",
            "--max-children",
            "6",
        ],
    ) else {
        return;
    };
    let before = pool.status().unwrap()["slots"].as_array().unwrap().len();
    let addr = pool.addr;
    let clients: Vec<_> = (0..4)
        .map(|_| std::thread::spawn(move || get(addr, 1500)))
        .collect();
    pool.wait_for("at least 3 busy workers", |s| {
        s["busy"].as_u64().unwrap_or(0) >= 3
    });
    let slots: std::collections::BTreeSet<String> = clients
        .into_iter()
        .map(|t| {
            let (code, slot) = t.join().unwrap();
            assert_eq!(code, 200);
            slot
        })
        .collect();
    let after = pool.status().unwrap()["slots"].as_array().unwrap().len();
    assert!(after > before, "the pool did not grow: {before} -> {after}");
    assert!(slots.len() >= 2, "only slots {slots:?} answered");
}

fn sigkilled_worker_is_replaced(mode: &str) {
    let Some(pool) = Pool::start(mode, &["--min-children", "2"]) else {
        return;
    };
    let first = pool.wait_for("two idle workers", |s| s["idle"].as_u64().unwrap_or(0) >= 2);
    let first = Pool::worker_pids(&first);
    // Watch the pool through several pings (every 300 ms, 1 s to answer): a
    // worker that did not answer them would be killed and replaced.
    let watch = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < watch {
        let now = Pool::worker_pids(&pool.status().unwrap());
        for pid in &first {
            assert!(
                now.contains(pid),
                "worker {pid} was replaced without cause: {now:?}"
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(get(pool.addr, 0).0, 200);
    // The answer can reach the client before the worker reports Idle, and
    // the pool may have grown a spare meanwhile: wait for slot 0 itself.
    let s = pool.wait_for("two idle workers, slot 0 among them", |s| {
        s["idle"].as_u64().unwrap_or(0) >= 2 && s["slots"][0]["state"] == "idle"
    });
    let victim = s["slots"][0]["pid"].as_i64().unwrap() as i32;
    let others = Pool::worker_pids(&s);
    assert!(alive(victim));
    // handoff and order give the request to the lowest idle worker; in
    // shared mode the kernel wakes whichever worker it likes.
    if mode != "shared" {
        let served0 = s["slots"][0]["served"].as_u64().unwrap();
        assert!(served0 >= 1, "slot 0 served nothing: {s}");
    }
    kill(Pid::from_raw(victim), Signal::SIGKILL).unwrap();
    pool.wait_for("slot 0 replaced by an idle worker", |s| {
        s["slots"][0]["pid"].as_i64().map(|p| p as i32) != Some(victim)
            && s["slots"][0]["state"] == "idle"
    });
    assert_eq!(get(pool.addr, 0).0, 200);
    let now = pool.status().unwrap();
    for pid in others.iter().filter(|&&p| p != victim) {
        assert!(
            Pool::worker_pids(&now).contains(pid),
            "worker {pid} was replaced too: {now}"
        );
    }
}

fn term_stops_everything(mode: &str) {
    let Some(mut pool) = Pool::start(mode, &["--min-children", "3"]) else {
        return;
    };
    let s = pool.wait_for("three idle workers", |s| {
        s["idle"].as_u64().unwrap_or(0) >= 3
    });
    let pids = Pool::worker_pids(&s);
    assert_eq!(get(pool.addr, 0).0, 200);
    let sup = pool.sup.id() as i32;
    kill(Pid::from_raw(sup), Signal::SIGTERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(st) = pool.sup.try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "the supervisor did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "supervisor exit: {status}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|&p| alive(p)) {
        assert!(
            Instant::now() < deadline,
            "workers still running after TERM: {pids:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

macro_rules! per_mode {
    ($($mode:ident),*) => {$(
        mod $mode {
            #[test]
            fn grows_and_several_slots_answer() {
                super::grows_and_several_slots_answer(stringify!($mode));
            }
            #[test]
            fn sigkilled_worker_is_replaced() {
                super::sigkilled_worker_is_replaced(stringify!($mode));
            }
            #[test]
            fn term_stops_everything() {
                super::term_stops_everything(stringify!($mode));
            }
        }
    )*};
}

per_mode!(handoff, order, shared);
