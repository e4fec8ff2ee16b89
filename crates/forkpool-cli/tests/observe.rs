//! Observability wired into the supervisor: the systemd watchdog, per-child
//! resources and queue figures in status and metrics, memory-aware
//! recycling and slow-request captures.

mod common;

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use common::{temp_path, DemoPool};

/// With `NOTIFY_SOCKET` and `WATCHDOG_USEC` set, the supervisor sends
/// `WATCHDOG=1` over and over, at about half the interval.
#[test]
fn watchdog_keepalives_reach_the_notify_socket() {
    let path = temp_path("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let notify = path.to_str().unwrap().to_string();
    // 600 ms: a keep-alive every 300 ms.
    let pool = DemoPool::start_with(
        &["--min-children", "1"],
        &[("NOTIFY_SOCKET", &notify), ("WATCHDOG_USEC", "600000")],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut keepalives = Vec::new();
    let mut buf = [0u8; 4096];
    while keepalives.len() < 4 && Instant::now() < deadline {
        if let Ok(n) = socket.recv(&mut buf) {
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            if text.lines().any(|l| l == "WATCHDOG=1") {
                keepalives.push(Instant::now());
            }
        }
    }
    drop(pool);
    let _ = std::fs::remove_file(&path);
    assert!(
        keepalives.len() >= 4,
        "only {} WATCHDOG=1 in 20 s",
        keepalives.len()
    );
    // Spaced by the schedule, not sent on every turn of the loop.
    let first_to_last = keepalives[keepalives.len() - 1] - keepalives[0];
    assert!(
        first_to_last >= Duration::from_millis(3 * 300 - 100),
        "4 keep-alives within {first_to_last:?}: not at half the watchdog interval"
    );
}

/// RSS, PSS and USS in bytes and CPU seconds of `pid`, read from /proc
/// here, independently of the supervisor's reader.
fn proc_figures(pid: u64) -> (u64, u64, u64, f64) {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    let kb = |key: &str| -> u64 {
        rollup
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {key} in smaps_rollup"))
            * 1024
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .unwrap()
        .unwrap();
    let cpu = ticks as f64 / hz as f64;
    (
        kb("Rss"),
        kb("Pss"),
        kb("Private_Clean") + kb("Private_Dirty"),
        cpu,
    )
}

fn within_10_percent(name: &str, reported: f64, actual: f64, slack: f64) -> Result<(), String> {
    if (reported - actual).abs() <= actual.abs() * 0.10 + slack {
        Ok(())
    } else {
        Err(format!(
            "{name}: the pool says {reported}, /proc says {actual}"
        ))
    }
}

/// Retries `compare` (the pool's figures against /proc read right after)
/// for up to 10 s: the pool samples once a second, so a child whose
/// memory moved by a few pages since the last sample agrees on the next.
fn agree(mut compare: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match compare() {
            Ok(()) => return,
            Err(e) if Instant::now() >= deadline => panic!("{e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// The value of the metric line starting with `prefix` (name and labels).
fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix)?.trim().parse().ok())
}

/// Polls `forkpool status --json` until `cond` holds, for at most 30 s.
fn status_until(
    pool: &DemoPool,
    what: &str,
    cond: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = pool.status();
        if cond(&status) {
            return status;
        }
        assert!(Instant::now() < deadline, "never {what}: {status}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One child held busy, three connections waiting behind it: status and
/// metrics give the child's CPU and memory, its client, and the queue as
/// /proc and sock_diag see them.
#[test]
fn status_and_metrics_report_children_and_queue_as_proc_does() {
    // `handoff`: in kernel dispatch every slot has a listening socket on
    // the same address, and sock_diag cannot tell which is the pool's
    // (kernel_dispatch.rs checks a busy child's client there).
    let pool = DemoPool::start(
        &[
            &common::ONE_CHILD[..],
            &["--metrics", "127.0.0.1:0", "--dispatch", "handoff"],
        ]
        .concat(),
    );
    let busy = common::send(pool.addr, "/?work_ms=20000");
    let client = busy.local_addr().unwrap().to_string();
    let waiting: Vec<_> = (0..3)
        .map(|_| std::net::TcpStream::connect(pool.addr).unwrap())
        .collect();
    let status = status_until(&pool, "saw the queue and the busy child's figures", |s| {
        s["queues"][0]["waiting"] == 3
            && s["slots"][0]["peer"].as_str().is_some()
            && s["slots"][0]["rss_bytes"].as_u64().is_some()
    });
    let slot = &status["slots"][0];
    let pid = slot["pid"].as_u64().unwrap();
    agree(|| {
        let status = pool.status();
        let slot = &status["slots"][0];
        let (rss, pss, uss, cpu) = proc_figures(pid);
        let field = |k: &str| slot[k].as_f64().ok_or(format!("no {k}: {status}"));
        within_10_percent("rss", field("rss_bytes")?, rss as f64, 0.0)?;
        within_10_percent("pss", field("pss_bytes")?, pss as f64, 0.0)?;
        within_10_percent("uss", field("uss_bytes")?, uss as f64, 0.0)?;
        within_10_percent("cpu", field("cpu_seconds")?, cpu, 0.02)
    });
    assert_eq!(slot["peer"].as_str(), Some(client.as_str()), "{status}");
    // The queue as sock_diag sees it from outside.
    let outside = forkpool::observe::listen_queues_of_process(pool.pid).unwrap();
    let listener = status["queues"][0]["listener"].as_str().unwrap();
    let seen = outside
        .iter()
        .find(|l| l.address == listener)
        .unwrap_or_else(|| panic!("{listener} not among {outside:?}"));
    assert_eq!(seen.queue.waiting, 3);
    assert!(status["queues"][0]["max_waiting"].as_u64().unwrap() >= 3);

    let text = common::scrape_metrics(&pool);
    let label = format!("{{listener=\"{listener}\"}}");
    assert_eq!(
        metric(&text, &format!("forkpool_listen_queue{label}")),
        Some(3.0),
        "{text}"
    );
    assert!(metric(&text, &format!("forkpool_listen_queue_max{label}")).unwrap() >= 3.0);
    agree(|| {
        let text = common::scrape_metrics(&pool);
        let (_, pss_now, uss_now, _) = proc_figures(pid);
        let value = |k: &str| metric(&text, k).ok_or(format!("no {k}: {text}"));
        within_10_percent(
            "children_pss_bytes",
            value("forkpool_children_pss_bytes")?,
            pss_now as f64,
            0.0,
        )?;
        within_10_percent(
            "child_uss_bytes_max",
            value("forkpool_child_uss_bytes_max")?,
            uss_now as f64,
            0.0,
        )
    });
    assert!(
        metric(&text, "forkpool_children_cpu_seconds").is_some(),
        "{text}"
    );

    // Once the slow connection ends, its service time is in the histogram.
    drop(waiting);
    let mut busy = busy;
    let mut reply = String::new();
    use std::io::Read;
    busy.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    busy.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = common::scrape_metrics(&pool);
        let sum = metric(&text, "forkpool_service_time_seconds_sum").unwrap_or(0.0);
        if sum >= 20.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "slow connection not in the service time: {text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

const PYTHON_CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../clients/python");

/// A Python worker that keeps `grow_mb` MiB more of its own memory on each
/// request that asks, and answers with its pid.
const GROWING_WORKER: &str = r#"
import os, sys
sys.path.insert(0, os.environ["FORKPOOL_TEST_CLIENTS"])
import forkpool_worker

kept = []

def handle(conn, _listener):
    conn.settimeout(5)
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = conn.recv(2048)
        if not chunk:
            return
        head += chunk
    if b"grow_mb=" in head:
        mb = int(head.split(b"grow_mb=", 1)[1].split(b" ", 1)[0])
        # Written, so every page is this process's own.
        kept.append(b"x" * (mb << 20))
    body = b"%d\n" % os.getpid()
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)

forkpool_worker.Worker.from_env().serve(handle)
"#;

/// Writes `text` to a temp file that is removed on drop.
struct Script(std::path::PathBuf);

impl Script {
    fn new(name: &str, text: &str) -> Script {
        let path = temp_path(name);
        std::fs::write(&path, text).unwrap();
        Script(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A worker that grows past `--max-child-memory` is replaced after the
/// connection that took it over the limit, and no request fails.
#[test]
fn a_worker_over_max_child_memory_is_recycled_after_its_connection() {
    let script = Script::new("grow.py", GROWING_WORKER);
    let mut command = std::process::Command::new(common::forkpool_bin());
    command
        .arg("run")
        .env("FORKPOOL_TEST_CLIENTS", PYTHON_CLIENT);
    let pool = DemoPool::launch(
        command,
        &[
            "--min-children",
            "1",
            "--max-children",
            "2",
            "--min-spare",
            "1",
            "--max-spare",
            "2",
            "--ping-timeout",
            "20s",
            "--max-child-memory",
            "48MiB",
            // Handoff: the limit is checked as each connection ends; in
            // kernel dispatch, at the supervisor's readings of the board
            // (every 100 ms), so a fast worker serves a few more first
            // (operations.md).
            "--dispatch",
            "handoff",
        ],
        &["python3", script.path()],
        true,
    );
    let mut pids = Vec::new();
    // 16 MiB a request: the worker that served four is past 48 MiB.
    for i in 0..12 {
        let response = pool
            .get("/?grow_mb=16")
            .unwrap_or_else(|e| panic!("request {i} failed: {e}\n{}", pool.stderr.dump()));
        assert_eq!(response.status, 200, "request {i}");
        pids.push(response.body.trim().to_string());
    }
    let status = status_until(&pool, "counted a memory recycling", |s| {
        s["totals"]["recycled_memory"].as_u64() >= Some(1)
    });
    assert_eq!(status["totals"]["died"], 0, "{status}");
    assert_eq!(status["totals"]["killed"], 0, "{status}");
    // No worker served more than the requests it took to pass the limit
    // (+1: the sample may be a tick old when it is only checked on it).
    let mut per_pid = std::collections::BTreeMap::new();
    for p in &pids {
        *per_pid.entry(p.clone()).or_insert(0) += 1;
    }
    assert!(
        per_pid.len() >= 2,
        "one worker served everything: {per_pid:?}"
    );
    assert!(per_pid.values().all(|&n| n <= 4), "{per_pid:?}");
}

const PERL_CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../clients/perl");

/// A Python worker whose handler is stuck in `crunch_the_numbers` (for
/// 30 s at most).
const STUCK_PYTHON: &str = r#"
import os, sys, time
sys.path.insert(0, os.environ["FORKPOOL_TEST_CLIENTS"])
import forkpool_worker

def crunch_the_numbers(until):
    while time.time() < until:
        time.sleep(0.05)

def handle(conn, _listener):
    crunch_the_numbers(time.time() + 30)

forkpool_worker.Worker.from_env().serve(handle)
"#;

/// The same in Perl.
const STUCK_PERL: &str = r#"
use strict;
use warnings;
use lib $ENV{FORKPOOL_TEST_CLIENTS};
use Forkpool::Worker;

sub crunch_the_numbers {
    my $until = time + 30;
    select(undef, undef, undef, 0.05) while time < $until;
}

my $worker = Forkpool::Worker->from_env or die $@;
$worker->serve(sub { crunch_the_numbers() });
"#;

/// Starts `forkpool run` with a slow threshold on `program script`.
fn run_stuck(program: &str, script: &Script, clients: &str, extra: &[&str]) -> DemoPool {
    let mut command = std::process::Command::new(common::forkpool_bin());
    command.arg("run").env("FORKPOOL_TEST_CLIENTS", clients);
    let mut args = vec![
        "--min-children",
        "1",
        "--max-children",
        "2",
        "--min-spare",
        "1",
        "--max-spare",
        "2",
        "--ping-timeout",
        "20s",
    ];
    args.extend_from_slice(extra);
    DemoPool::launch(command, &args, &[program, script.path()], true)
}

/// Sends one request and waits until status shows a capture of the busy
/// child; returns that slot's status and the totals.
fn captured_slot(pool: &DemoPool) -> (serde_json::Value, serde_json::Value) {
    let _client = common::send(pool.addr, "/");
    let status = status_until(pool, "showed a slow-request capture", |s| {
        s["slots"]
            .as_array()
            .unwrap()
            .iter()
            .any(|slot| slot["last_capture"].is_string())
    });
    let slot = status["slots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|slot| slot["last_capture"].is_string())
        .unwrap()
        .clone();
    (slot, status["totals"].clone())
}

#[test]
fn a_slow_python_worker_is_captured_with_its_stack() {
    let script = Script::new("stuck.py", STUCK_PYTHON);
    let pool = run_stuck(
        "python3",
        &script,
        PYTHON_CLIENT,
        &["--slow-threshold", "300ms"],
    );
    let (slot, totals) = captured_slot(&pool);
    let record = slot["last_capture"].as_str().unwrap();
    assert!(record.contains("crunch_the_numbers"), "{record}");
    assert!(record.contains(&format!("pid={}", slot["pid"])), "{record}");
    assert_eq!(totals["slow_captures"], 1, "{totals}");
    // Captured, not stopped.
    assert_eq!(slot["state"], "busy");
    assert_eq!(totals["killed"], 0);
}

#[test]
fn a_slow_perl_worker_is_captured_with_its_stack() {
    let script = Script::new("stuck.pl", STUCK_PERL);
    let pool = run_stuck("perl", &script, PERL_CLIENT, &["--slow-threshold", "300ms"]);
    let (slot, totals) = captured_slot(&pool);
    let record = slot["last_capture"].as_str().unwrap();
    assert!(record.contains("crunch_the_numbers"), "{record}");
    assert_eq!(totals["slow_captures"], 1, "{totals}");
    assert_eq!(slot["state"], "busy");
}

/// A forked Rust child has no stack to give, but /proc says where it
/// waits: the record carries the pid's wchan.
#[test]
fn a_slow_rust_child_is_captured_with_its_wchan() {
    let pool = DemoPool::start(&["--min-children", "1", "--slow-threshold", "300ms"]);
    let _client = common::send(pool.addr, "/?work_ms=20000");
    let status = status_until(&pool, "showed a slow-request capture", |s| {
        s["slots"][0]["last_capture"].is_string()
    });
    let slot = &status["slots"][0];
    let pid = slot["pid"].as_u64().unwrap();
    let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap();
    let record = slot["last_capture"].as_str().unwrap();
    assert!(
        wchan != "0" && record.contains(&format!("wchan={wchan} ")),
        "/proc/{pid}/wchan says {wchan:?}; the record: {record}"
    );
    assert_eq!(status["totals"]["slow_captures"], 1);
}

/// Before `busy_timeout` kills a Python worker, its stack is captured:
/// the kill and the capture are both counted, and the record, logged
/// before the kill, names the function.
#[test]
fn a_busy_timeout_kill_is_captured_first() {
    let script = Script::new("stuck.py", STUCK_PYTHON);
    let pool = run_stuck("python3", &script, PYTHON_CLIENT, &["--busy-timeout", "1s"]);
    let _client = common::send(pool.addr, "/");
    let status = status_until(&pool, "killed the stuck worker", |s| {
        s["totals"]["killed_by"]["busy_timeout"] == 1
    });
    assert_eq!(status["totals"]["slow_captures"], 1, "{status}");
    // The logged capture naming the function is the feature: checked second.
    assert!(
        pool.stderr.count("crunch_the_numbers") > 0,
        "{}",
        pool.stderr.dump()
    );
}

/// The new options are config-file keys too, and a bad size is refused
/// with the fix.
#[test]
fn memory_and_slow_options_come_from_the_config_file() {
    let good = Script::new(
        "good.toml",
        "[pool]\nmax_requests_per_child = 100\nmax_requests_jitter = 10\n\
         max_child_memory = \"512MiB\"\nmax_child_lifetime = \"1h\"\nslow_threshold = \"2s\"\n",
    );
    let out = std::process::Command::new(common::forkpool_bin())
        .args(["check", "--config", good.path()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bad = Script::new("bad.toml", "[pool]\nmax_child_memory = \"512 parsecs\"\n");
    let out = std::process::Command::new(common::forkpool_bin())
        .args(["check", "--config", bad.path()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("512MiB"), "{err}");
    let out = std::process::Command::new(common::forkpool_bin())
        .args(["check", "--max-child-memory", "100"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("max_child_memory"), "{err}");
}

/// A pool larger than one sampling group (eight children a turn) still
/// gets every child sampled, and sampled again each round.
#[test]
fn every_child_of_a_larger_pool_is_sampled() {
    let pool = DemoPool::start(&[
        "--min-children",
        "12",
        "--max-children",
        "12",
        "--max-spare",
        "12",
    ]);
    status_until(&pool, "had CPU% for all 12 children", |s| {
        let slots = s["slots"].as_array().unwrap();
        slots.len() == 12
            && slots
                .iter()
                .all(|slot| slot["cpu_percent"].is_number() && slot["uss_bytes"].is_number())
    });
}
