//! `forkpool run --preload`: the real supervisor with the Python, Perl and
//! Rust helpers as templates. Every worker is forked from the template and
//! reparented to the supervisor; the template is supervised (restarted
//! when killed or failing, replaced on reload); nothing outlives a killed
//! supervisor. Everything is asserted on `forkpool status` and `/proc`.

#[path = "common/bench_bins.rs"]
mod bench_bins;
mod common;
#[path = "common/example_workers.rs"]
mod example_workers;
#[path = "common/psgi_support.rs"]
mod psgi_support;
#[path = "common/worker_files.rs"]
mod worker_files;
#[path = "common/wsgi_support.rs"]
mod wsgi_support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{concurrent_gets, continuous_load, kill9, DemoPool};
use example_workers::{rust_worker, PERL_WORKER, PYTHON_WORKER};
use serde_json::Value;
use worker_files::{good_app, Scratch};

/// Generous: these tests share a small machine with builds.
const PATIENCE: Duration = Duration::from_secs(30);

const SCALING: [&str; 8] = [
    "--max-children",
    "8",
    "--min-spare",
    "1",
    "--max-spare",
    "1",
    "--retire-grace",
    "200ms",
];

/// `forkpool run --preload --dispatch MODE [SCALING] EXTRA -- CMD`, with a
/// start deadline long enough for a loaded machine and one child at rest
/// unless EXTRA says `--min-children`.
fn start(mode: &str, extra: &[&str], cmd: &[&str]) -> DemoPool {
    let mut args = vec!["--preload", "--dispatch", mode, "--ping-timeout", "20s"];
    args.extend_from_slice(&SCALING);
    if !extra.contains(&"--min-children") {
        args.extend(["--min-children", "1"]);
    }
    args.extend_from_slice(extra);
    DemoPool::start_run(&args, cmd)
}

/// The newest generation's template: while a reload rolls, the old one is
/// listed too (first, until it has exited).
fn template(status: &Value) -> &Value {
    status["templates"]
        .as_array()
        .and_then(|all| all.iter().max_by_key(|t| t["generation"].as_u64()))
        .unwrap_or(&Value::Null)
}

fn template_pid(status: &Value) -> i32 {
    template(status)["pid"].as_i64().unwrap_or(0) as i32
}

fn idle_workers(status: &Value) -> usize {
    status["idle"].as_u64().unwrap_or(0) as usize
}

fn worker_pids(status: &Value) -> Vec<i32> {
    status["slots"]
        .as_array()
        .map(|slots| {
            slots
                .iter()
                .filter_map(|s| s["pid"].as_i64())
                .map(|p| p as i32)
                .collect()
        })
        .unwrap_or_default()
}

/// The parent of `pid`, from `/proc`.
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The descriptors `pid` has open.
fn open_fds(pid: i32) -> BTreeSet<i32> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The children of `pid` that are zombies (exited, not reaped).
fn zombie_children(pid: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            let fields: Vec<&str> = stat
                .rsplit_once(')')
                .map(|(_, rest)| rest.split_whitespace().collect())
                .unwrap_or_default();
            fields.first() == Some(&"Z") && fields.get(1) == Some(&pid.to_string().as_str())
        })
        .collect()
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let (_, rest) = s.rsplit_once(')')?;
            rest.split_whitespace().next().map(|st| st != "Z")
        })
        .unwrap_or(false)
}

/// Requests on two threads until stopped: (served, failures).
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicUsize>,
    threads: Vec<std::thread::JoinHandle<Vec<String>>>,
}

impl Load {
    fn start(pool: &DemoPool) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let (ok, threads) = continuous_load(pool.addr, 2, Arc::clone(&stop));
        Load { stop, ok, threads }
    }

    fn served(&self) -> usize {
        self.ok.load(Ordering::SeqCst)
    }

    fn finish(self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        let failures = self
            .threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        (self.ok.load(Ordering::SeqCst), failures)
    }
}

/// Waits until `load` has served `more` requests beyond now.
fn wait_served(load: &Load, more: usize) {
    let target = load.served() + more;
    let deadline = Instant::now() + PATIENCE;
    while load.served() < target && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(load.served() >= target, "the load made no progress");
}

/// Waits until the template is ready and `n` workers are idle.
fn ready(pool: &DemoPool, n: usize) -> Value {
    pool.wait_status(PATIENCE, |s| {
        template(s)["state"] == "ready" && idle_workers(s) >= n && s["starting"] == 0
    })
    .unwrap_or_else(|| panic!("never ready: {}\n{}", pool.status(), pool.stderr.dump()))
}

/// Serves, grows under six slow requests at once, shrinks back, and every
/// worker on the way was forked by the one template and is the
/// supervisor's child, with only its own descriptors.
fn serves_grows_and_shrinks(mode: &str, cmd: &[&str]) {
    let pool = start(mode, &[], cmd);
    let first = ready(&pool, 1);
    let template_pid = template_pid(&first);
    assert!(template_pid > 0);
    let addr = pool.addr;
    let load = std::thread::spawn(move || concurrent_gets(addr, "/?work_ms=1500", 6));
    let grown = pool.wait_status(PATIENCE, |s| worker_pids(s).len() >= 4);
    // Look at the workers while they exist.
    let during = pool.status();
    let results = load.join().unwrap();
    assert!(grown.is_some(), "did not grow: {during}");
    for pid in worker_pids(&during).into_iter().filter(|p| *p > 0) {
        if !alive(pid) {
            continue;
        }
        assert_eq!(
            parent_of(pid),
            Some(pool.pid),
            "worker {pid} is not the supervisor's child"
        );
        let fds = open_fds(pid);
        // 0-2, the listener at 3 (every mode holds it: `handoff` to take
        // the next waiting connection itself) and the channel at 4.
        let allowed: BTreeSet<i32> = [0, 1, 2, 3, 4].into();
        // A worker busy on a connection holds it too: one more.
        let extra = fds.difference(&allowed).count();
        assert!(
            extra <= 1,
            "worker {pid} holds descriptors it should not: {fds:?}"
        );
        // The template ignores SIGCHLD so the kernel reaps its
        // intermediates; a worker's own children must stay waitable.
        assert!(
            !common::ignores_signal(pid, libc::SIGCHLD),
            "worker {pid} ignores SIGCHLD"
        );
    }
    assert_eq!(
        zombie_children(template_pid),
        Vec::<i32>::new(),
        "the template left intermediates unreaped"
    );
    let mut slots = BTreeSet::new();
    for r in &results {
        let r = r
            .as_ref()
            .unwrap_or_else(|e| panic!("{e}\n{}", pool.stderr.dump()));
        assert_eq!(r.status, 200);
        slots.insert(r.slot.expect("X-Forkpool-Slot"));
    }
    assert!(slots.len() >= 3, "slots used: {slots:?}");
    let after = pool
        .wait_status(PATIENCE, |s| worker_pids(s).len() <= 2)
        .unwrap_or_else(|| panic!("did not shrink: {}", pool.status()));
    let t = template(&after);
    assert_eq!(
        template_pid,
        t["pid"].as_i64().unwrap() as i32,
        "the template changed: {after}\n{}",
        pool.stderr.dump()
    );
    assert_eq!(
        t["forks"], after["totals"]["spawned"],
        "every worker came from the template: {after}"
    );
    assert_eq!(after["totals"]["died"], 0, "{after}");
    assert_eq!(after["totals"]["template_restarts"], 0, "{after}");
    assert!(after["totals"]["retired"].as_u64().unwrap() >= 2, "{after}");
}

#[test]
fn python_in_handoff_serves_grows_and_shrinks_from_the_template() {
    serves_grows_and_shrinks("handoff", &["python3", PYTHON_WORKER]);
}

#[test]
fn python_in_order_serves_grows_and_shrinks_from_the_template() {
    serves_grows_and_shrinks("order", &["python3", PYTHON_WORKER]);
}

#[test]
fn python_in_shared_serves_grows_and_shrinks_from_the_template() {
    serves_grows_and_shrinks("shared", &["python3", PYTHON_WORKER]);
}

#[test]
fn perl_in_handoff_serves_grows_and_shrinks_from_the_template() {
    serves_grows_and_shrinks("handoff", &["perl", PERL_WORKER]);
}

#[test]
fn perl_in_order_serves_grows_and_shrinks_from_the_template() {
    serves_grows_and_shrinks("order", &["perl", PERL_WORKER]);
}

#[test]
fn perl_in_shared_serves_grows_and_shrinks_from_the_template() {
    serves_grows_and_shrinks("shared", &["perl", PERL_WORKER]);
}

#[test]
fn rust_in_handoff_serves_grows_and_shrinks_from_the_template() {
    serves_grows_and_shrinks("handoff", &[rust_worker()]);
}

#[test]
fn rust_in_order_serves_grows_and_shrinks_from_the_template() {
    serves_grows_and_shrinks("order", &[rust_worker()]);
}

#[test]
fn rust_in_shared_serves_grows_and_shrinks_from_the_template() {
    serves_grows_and_shrinks("shared", &[rust_worker()]);
}

/// A SIGKILLed template: the workers keep serving throughout, a new
/// template takes over, and the pool grows from it.
#[test]
fn a_killed_template_is_replaced_while_its_workers_keep_serving() {
    let pool = start(
        "handoff",
        &["--metrics", "127.0.0.1:0"],
        &["python3", PYTHON_WORKER],
    );
    let before = ready(&pool, 1);
    let old = template_pid(&before);
    let workers = worker_pids(&before);
    let load = Load::start(&pool);
    wait_served(&load, 5);
    kill9(old);
    let after = pool
        .wait_status(PATIENCE, |s| {
            template(s)["state"] == "ready" && template_pid(s) != old
        })
        .unwrap_or_else(|| panic!("no new template: {}", pool.status()));
    assert_eq!(after["totals"]["template_restarts"], 1, "{after}");
    let metrics = common::scrape_metrics(&pool);
    assert!(
        metrics
            .lines()
            .any(|l| l == "forkpool_template_restarts_total 1"),
        "{metrics}"
    );
    wait_served(&load, 5);
    let (_, failures) = load.finish();
    assert!(
        failures.is_empty(),
        "requests failed while the template was replaced: {failures:?}"
    );
    for pid in &workers {
        assert!(alive(*pid), "worker {pid} died with its template");
    }
    // The pool still grows, from the new template.
    let new = template_pid(&after);
    let addr = pool.addr;
    let burst = std::thread::spawn(move || concurrent_gets(addr, "/?work_ms=1000", 3));
    let grown = pool.wait_status(PATIENCE, |s| {
        template_pid(s) == new && template(s)["forks"].as_u64().unwrap_or(0) >= 1
    });
    assert!(burst.join().unwrap().iter().all(|r| r.is_ok()));
    assert!(
        grown.is_some(),
        "nothing forked from the new template: {}",
        pool.status()
    );
}

/// A worker forked from the template that is SIGKILLed is replaced from
/// the same template.
#[test]
fn a_killed_worker_is_replaced_from_the_template() {
    let pool = start("handoff", &[], &["python3", PYTHON_WORKER]);
    let before = ready(&pool, 1);
    let forks = template(&before)["forks"].as_u64().unwrap();
    let victim = worker_pids(&before)[0];
    kill9(victim);
    let after = pool
        .wait_status(PATIENCE, |s| {
            s["totals"]["died"] == 1
                && !worker_pids(s).contains(&victim)
                && idle_workers(s) >= 1
                && template(s)["forks"].as_u64().unwrap_or(0) > forks
        })
        .unwrap_or_else(|| panic!("no replacement: {}", pool.status()));
    assert_eq!(template_pid(&after), template_pid(&before));
    assert_eq!(after["totals"]["template_restarts"], 0);
    assert_eq!(pool.get("/").map(|r| r.status), Ok(200));
}

/// A program that never once becomes a template (it fails at start, or is
/// an ordinary worker that does not speak protocol version 2) is tried a
/// few times with back-off, then the supervisor exits non-zero with one
/// error that names the fix; its listener is closed, so connections are
/// refused instead of waiting unserved.
fn never_a_template_stops_the_pool(
    cmd: &[&str],
    extra: &[&str],
    min_took: Duration,
    meanwhile: impl Fn(&DemoPool),
) -> String {
    let mut args = vec!["--preload", "--ping-timeout", "20s", "--min-children", "1"];
    args.extend_from_slice(&SCALING);
    args.extend_from_slice(extra);
    let mut command = std::process::Command::new(common::forkpool_bin());
    command.arg("run");
    let started = Instant::now();
    let mut pool = DemoPool::launch(command, &args, cmd, false);
    meanwhile(&pool);
    let status = pool
        .wait_exit(PATIENCE)
        .unwrap_or_else(|| panic!("still running: {}", pool.status()));
    let took = started.elapsed();
    assert!(!status.success(), "exited {status}");
    assert!(took >= min_took, "gave up after {took:?}: no back-off");
    match std::net::TcpStream::connect_timeout(&pool.addr, Duration::from_secs(2)) {
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}"),
        Ok(_) => panic!("a connection to {} was accepted after the exit", pool.addr),
    }
    let log = pool.stderr.dump();
    // The fix is named once, in the exit error (the message is the feature).
    assert_eq!(pool.stderr.count("without --preload"), 1, "{log}");
    log
}

#[test]
fn a_template_failing_at_start_backs_off_then_stops_the_pool() {
    let dir = Scratch::new("preload-failing");
    dir.deploy("app.py", "import sys\nsys.exit('cannot load the model')\n");
    let app = dir.path("app.py");
    // 100 ms, then 200 ms between the three starts.
    let log = never_a_template_stops_the_pool(
        &["python3", &app],
        &[],
        Duration::from_millis(300),
        |_| {},
    );
    // What the program said is in the error too.
    assert!(log.contains("cannot load the model"), "{log}");
}

#[test]
fn a_program_that_ignores_the_template_channel_stops_the_pool() {
    // Like `node worker.js`: it runs, but never says R as a template.
    // Meanwhile status says the pool is not ready, and why.
    let says_why = |pool: &DemoPool| {
        let status = pool.wait_status(PATIENCE, |s| {
            s["totals"]["template_restarts"].as_u64() >= Some(1)
                && s["not_ready_because"]
                    .as_str()
                    .is_some_and(|why| why.contains("run it without --preload"))
        });
        let status = status.unwrap_or_else(|| panic!("{}", pool.status()));
        assert_eq!(status["ready"], false, "{status}");
    };
    let log = never_a_template_stops_the_pool(
        &["sleep", "60"],
        &["--start-timeout", "1s"],
        Duration::from_secs(3),
        says_why,
    );
    assert!(log.contains("did not say Ready"), "{log}");
}

/// SIGKILL the supervisor: within 2 s no worker (not even one busy on a
/// connection) and no template is left.
#[test]
fn nothing_outlives_a_killed_supervisor() {
    let pool = start(
        "handoff",
        &["--min-children", "3"],
        &["python3", PYTHON_WORKER],
    );
    ready(&pool, 3);
    // One worker busy in a long request: only its parent-death signal can
    // end it (the idle ones would also see their channel close).
    let addr = pool.addr;
    let _slow = std::thread::spawn(move || common::get(addr, "/?work_ms=20000"));
    let status = pool
        .wait_status(PATIENCE, |s| s["busy"] == 1)
        .unwrap_or_else(|| panic!("never busy: {}", pool.status()));
    let mut pids = worker_pids(&status);
    pids.push(template_pid(&status));
    kill9(pool.pid);
    let deadline = Instant::now() + Duration::from_secs(2);
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
    for p in &left {
        kill9(*p);
    }
    assert!(
        left.is_empty(),
        "left running after the supervisor died: {left:?}"
    );
}

/// HUP under load with `--preload`: a new template from the new code, the
/// pool rolls onto it, no request fails.
#[test]
fn reload_rolls_onto_a_new_template_without_a_failed_request() {
    let dir = Scratch::new("preload-reload");
    dir.deploy("app.py", &good_app());
    let app = dir.path("app.py");
    let pool = start("handoff", &["--min-children", "2"], &["python3", &app]);
    let before = ready(&pool, 2);
    let old = template_pid(&before);
    let load = Load::start(&pool);
    wait_served(&load, 5);
    pool.signal(1);
    let after = pool
        .wait_status(PATIENCE, |s| {
            s["serving_generation"] == 2
                && s["templates"].as_array().map(Vec::len) == Some(1)
                && template(s)["generation"] == 2
                && s["slots"]
                    .as_array()
                    .is_some_and(|v| v.iter().all(|x| x["generation"] == 2))
        })
        .unwrap_or_else(|| panic!("did not roll: {}", pool.status()));
    assert_ne!(template_pid(&after), old);
    wait_served(&load, 5);
    let (_, failures) = load.finish();
    assert!(
        failures.is_empty(),
        "failed during the reload: {failures:?}"
    );
    assert!(!alive(old), "the old template is still running");
}

/// HUP onto code whose template cannot start: the reload fails and the
/// old generation, with its template, keeps serving.
#[test]
fn a_reload_whose_template_fails_keeps_the_old_generation() {
    let dir = Scratch::new("preload-badreload");
    dir.deploy("app.py", &good_app());
    let app = dir.path("app.py");
    let pool = start("handoff", &["--min-children", "2"], &["python3", &app]);
    let before = ready(&pool, 2);
    dir.deploy(
        "app.py",
        "raise SystemExit('syntax of the new release is broken')\n",
    );
    pool.signal(1);
    let after = pool
        .wait_status(PATIENCE, |s| s["totals"]["reload_failures"] == 1)
        .unwrap_or_else(|| panic!("reload did not fail: {}", pool.status()));
    assert_eq!(after["serving_generation"], 1);
    let settled = pool
        .wait_status(PATIENCE, |s| {
            s["templates"].as_array().map(Vec::len) == Some(1) && s["generation"] == 1
        })
        .unwrap_or_else(|| panic!("{}", pool.status()));
    assert_eq!(template_pid(&settled), template_pid(&before));
    assert_eq!(worker_pids(&settled), worker_pids(&before));
    assert_eq!(pool.get("/").map(|r| r.status), Ok(200));
}

/// `--refork-after 20` under load: the lowest slot's worker becomes the
/// template (the template's pid becomes that worker's), the pool rolls
/// onto workers forked from it, and no request fails.
fn refork_under_load(cmd: &[&str]) {
    refork_under_load_in("handoff", cmd);
}

fn refork_under_load_in(mode: &str, cmd: &[&str]) {
    let pool = start(mode, &["--refork-after", "20"], cmd);
    assert_eq!(pool.status()["dispatch"], mode, "{}", pool.status());
    let before = ready(&pool, 1);
    let first_template = template_pid(&before);
    let warm = before["slots"][0]["pid"].as_i64().unwrap() as i32;
    let load = Load::start(&pool);
    let after = pool
        .wait_status(PATIENCE, |s| {
            s["totals"]["reforks"] == 1
                && s["serving_generation"] == 2
                && s["templates"].as_array().map(Vec::len) == Some(1)
                && template(s)["state"] == "ready"
                && s["slots"]
                    .as_array()
                    .is_some_and(|v| !v.is_empty() && v.iter().all(|x| x["generation"] == 2))
        })
        .unwrap_or_else(|| panic!("no refork: {}\n{}", pool.status(), pool.stderr.dump()));
    wait_served(&load, 10);
    let (_, failures) = load.finish();
    assert!(
        failures.is_empty(),
        "failed during the refork: {failures:?}"
    );
    assert_eq!(
        template_pid(&after),
        warm,
        "the warm worker should be the template: {after}\n{}",
        pool.stderr.dump()
    );
    assert!(
        !alive(first_template),
        "the first template is still running"
    );
    assert!(template(&after)["forks"].as_u64().unwrap() >= 1);
    assert_eq!(after["totals"]["died"], 0, "{after}");
}

#[test]
fn python_refork_makes_the_warm_worker_the_template_under_load() {
    refork_under_load(&["python3", PYTHON_WORKER]);
}

#[test]
fn perl_refork_makes_the_warm_worker_the_template_under_load() {
    refork_under_load(&["perl", PERL_WORKER]);
}

#[test]
fn rust_refork_makes_the_warm_worker_the_template_under_load() {
    refork_under_load(&[rust_worker()]);
}

/// Kernel dispatch: the warm worker gives up its slot's socket and the
/// scoreboard when it becomes the template, and the workers forked from
/// it are sent theirs (`S`).
#[test]
fn rust_refork_in_kernel_dispatch() {
    refork_under_load_in("kernel", &[rust_worker()]);
}

#[test]
fn perl_refork_in_kernel_dispatch() {
    refork_under_load_in("kernel", &["perl", PERL_WORKER]);
}

#[test]
fn python_refork_in_kernel_dispatch() {
    refork_under_load_in("kernel", &["python3", PYTHON_WORKER]);
}

/// A template that answers a fork order never given is killed and
/// replaced (with back-off), and no slot is taken on its word.
#[test]
fn a_template_breaking_the_protocol_is_killed_and_replaced() {
    let dir = Scratch::new("preload-hostile");
    dir.deploy(
        "liar.py",
        "import os, socket, struct\n\
         ch = socket.socket(fileno=int(os.environ['FORKPOOL_TEMPLATE_FD']))\n\
         ch.send(b'\\x02R' + struct.pack('>I', os.getpid()))\n\
         ch.send(b'\\x02W' + struct.pack('>II', 7, 1))\n\
         ch.recv(16)\n",
    );
    let liar = dir.path("liar.py");
    let mut args = vec!["--preload", "--ping-timeout", "20s", "--min-children", "1"];
    args.extend_from_slice(&SCALING);
    let mut command = std::process::Command::new(common::forkpool_bin());
    command.arg("run");
    let pool = DemoPool::launch(command, &args, &["python3", &liar], false);
    let status = pool
        .wait_status(PATIENCE, |s| {
            s["totals"]["template_restarts"].as_u64() >= Some(2)
        })
        .unwrap_or_else(|| panic!("not replaced: {}", pool.status()));
    // A fork order it got before lying is never answered: that slot is
    // freed with the template, and no slot 7 is ever taken.
    assert!(
        status["slots"]
            .as_array()
            .is_some_and(|v| v.iter().all(|x| x["slot"] != 7)),
        "{status}"
    );
}

/// An app server under `--preload`, in every dispatch mode: the app is
/// loaded once in the template, and each worker forked from it serves it.
fn app_server_serves_from_the_template(command: impl Fn() -> std::process::Command, cmd: &[&str]) {
    for mode in ["handoff", "order", "shared"] {
        let mut args = vec!["--preload", "--dispatch", mode, "--ping-timeout", "20s"];
        args.extend_from_slice(&SCALING);
        args.extend(["--min-children", "2"]);
        let pool = DemoPool::launch(command(), &args, cmd, true);
        let status = ready(&pool, 2);
        for _ in 0..3 {
            let r = pool
                .get("/")
                .unwrap_or_else(|e| panic!("{mode}: {e}\n{}", pool.stderr.dump()));
            assert_eq!(r.status, 200, "{mode}: {r:?}");
        }
        let after = pool.status();
        assert_eq!(
            template(&after)["forks"],
            after["totals"]["spawned"],
            "{mode}: every worker came from the template: {after}"
        );
        assert_eq!(template_pid(&after), template_pid(&status));
        assert_eq!(after["totals"]["died"], 0, "{mode}: {after}");
    }
}

#[test]
fn flask_under_forkpool_wsgi_is_loaded_once_and_served_in_every_mode() {
    let Some(python) = wsgi_support::venv_python() else {
        return;
    };
    let command = || {
        let mut c = std::process::Command::new(common::forkpool_bin());
        c.arg("run")
            .current_dir(wsgi_support::apps_dir())
            .env("PYTHONPATH", wsgi_support::clients_dir());
        c
    };
    app_server_serves_from_the_template(
        command,
        &[&python, "-m", "forkpool_wsgi", "flask_app:app"],
    );
}

#[test]
fn a_psgi_app_under_forkpool_psgi_is_loaded_once_and_served_in_every_mode() {
    if !psgi_support::require_plack() {
        return;
    }
    let command = || {
        let mut c = std::process::Command::new(common::forkpool_bin());
        c.arg("run");
        c
    };
    app_server_serves_from_the_template(
        command,
        &["perl", psgi_support::PSGI_SERVER, psgi_support::TEST_APP],
    );
}

/// A template that says Ready and then never reads its channel (hung) is
/// killed when it misses a ping, and replaced.
#[test]
fn a_hung_template_is_killed_when_it_misses_a_ping() {
    let dir = Scratch::new("preload-hung");
    dir.deploy(
        "hung.py",
        "import os, socket, struct, time\n\
         ch = socket.socket(fileno=int(os.environ['FORKPOOL_TEMPLATE_FD']))\n\
         ch.send(b'\\x02R' + struct.pack('>I', os.getpid()))\n\
         time.sleep(3600)\n",
    );
    let hung = dir.path("hung.py");
    // No workers wanted, so the only thing it is asked is a ping.
    let args = [
        "--preload",
        "--min-children",
        "0",
        "--min-spare",
        "0",
        "--ping-interval",
        "200ms",
        "--ping-timeout",
        "300ms",
    ];
    let mut command = std::process::Command::new(common::forkpool_bin());
    command.arg("run");
    let pool = DemoPool::launch(command, &args, &["python3", &hung], false);
    let first = pool
        .wait_status(PATIENCE, |s| template(s)["state"] == "ready")
        .unwrap_or_else(|| panic!("never ready: {}", pool.status()));
    let hung_pid = template_pid(&first);
    let later = pool
        .wait_status(PATIENCE, |s| {
            s["totals"]["template_restarts"].as_u64() >= Some(1) && template_pid(s) != hung_pid
        })
        .unwrap_or_else(|| panic!("not replaced: {}", pool.status()));
    assert_eq!(later["totals"]["spawned"], 0, "{later}");
    let deadline = Instant::now() + PATIENCE;
    while alive(hung_pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!alive(hung_pid), "the hung template is still running");
}
