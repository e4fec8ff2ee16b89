//! clients/node: an existing Node request handler served by
//! `forkpool run -- node clients/node/forkpool-node.js APP.js`, in the
//! default mode (kernel dispatch, by the messages path: the worker says
//! `G`, then `B`, `N` and `I` as requests start and end) and in
//! `--dispatch none`; a graceful quit in both, a clear refusal of the
//! modes Node's public API cannot serve, the helper's own unit tests, and
//! a package that `npm pack` builds offline.

mod common;

#[path = "common/http_corpus.rs"]
mod http_corpus;
#[path = "common/kernel_helper_cases.rs"]
mod kernel_helper_cases;

use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{get, killed_by, send, total, DemoPool};

const INSTALL: &str = "bash .ci/deps/node.sh";

/// The longest wait for a state that should come at once.
const PATIENCE: Duration = Duration::from_secs(20);

fn clients() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients")
}

fn helper() -> String {
    clients()
        .join("node/forkpool-node.js")
        .display()
        .to_string()
}

fn app() -> String {
    clients().join("tests/hello_app.js").display().to_string()
}

/// `forkpool run --dispatch none` of two Node workers, with `extra`.
fn start(extra: &[&str]) -> Option<DemoPool> {
    let node = common::require_program("node", INSTALL)?;
    let mut args = vec!["--dispatch", "none", "--min-children", "2"];
    args.extend_from_slice(extra);
    let cmd = [node.to_str().unwrap(), &helper(), &app()];
    Some(DemoPool::start_run(&args, &cmd))
}

/// The command of a Node worker serving the test app.
fn node_cmd(node: &Path) -> [String; 3] {
    [node.display().to_string(), helper(), app()]
}

/// A pool of exactly `children` Node workers in kernel dispatch (the
/// default mode), with `extra`, once all are idle; None (under CI: a
/// failure) where Node is missing or the kernel refuses the eBPF program.
fn start_kernel(children: u64, extra: &[&str]) -> Option<DemoPool> {
    let node = common::require_program("node", INSTALL)?;
    let cmd = node_cmd(&node);
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    kernel_helper_cases::kernel_pool(children, extra, &cmd)
}

/// One `GET` on the kept-alive connection `conn`, and its answer.
fn ask(conn: &mut BufReader<TcpStream>) -> Result<http_corpus::Response, String> {
    conn.get_mut()
        .write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    http_corpus::read_response(conn, false)
}

/// A kept-alive connection to `pool`, read with a 10 s bound.
fn keep_alive(pool: &DemoPool) -> BufReader<TcpStream> {
    let conn = TcpStream::connect(pool.addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    BufReader::new(conn)
}

/// The pid of the one busy worker in `status`, if exactly one is busy.
fn busy_pid(status: &serde_json::Value) -> Option<i64> {
    let slots = status["slots"].as_array()?;
    let busy: Vec<i64> = slots
        .iter()
        .filter(|s| s["state"] == "busy")
        .filter_map(|s| s["pid"].as_i64())
        .collect();
    (busy.len() == 1).then(|| busy[0])
}

/// What the slots of `status` served, together.
fn served(status: &serde_json::Value) -> u64 {
    let slots = status["slots"].as_array().into_iter().flatten();
    slots.filter_map(|s| s["served"].as_u64()).sum()
}

/// Node calls listen(2) again on the socket it is given: it passes the
/// pool's backlog (`FORKPOOL_BACKLOG`), which the kernel then still shows.
#[test]
fn a_node_app_serves_and_keeps_the_pools_backlog() {
    let Some(pool) = start(&["--backlog", "77"]) else {
        return;
    };
    for _ in 0..5 {
        let r = get(pool.addr, "/").expect("request");
        assert_eq!((r.status, r.body.as_str()), (200, "hello\n"));
    }
    // Sampled by the supervisor from the kernel (inet_diag), once a second.
    let status = pool.wait_status(Duration::from_secs(10), |s| {
        s["queues"][0]["backlog"].as_u64().is_some()
    });
    let status = status.unwrap_or_else(|| panic!("no queue sampled: {}", pool.status()));
    assert_eq!(status["queues"][0]["backlog"], 77, "{status}");
}

/// SIGTERM to the supervisor with a request in progress: the request is
/// answered, and the pool exits cleanly.
fn assert_quits_gracefully(mut pool: DemoPool) {
    let mut slow = send(pool.addr, "/?sleep_ms=1500");
    // The app says on stderr when it has the request.
    assert!(
        pool.stderr.wait_for(
            "worker stderr: request /?sleep_ms=1500",
            Duration::from_secs(10)
        ),
        "{}",
        pool.stderr.dump()
    );
    pool.signal(libc::SIGTERM);
    let mut answer = String::new();
    slow.read_to_string(&mut answer).expect("read the answer");
    let r = common::parse_response(&answer).expect("a whole response");
    assert_eq!((r.status, r.body.as_str()), (200, "hello\n"));
    let exit = pool
        .wait_exit(Duration::from_secs(10))
        .expect("the pool exits");
    assert!(exit.success(), "{exit}\n{}", pool.stderr.dump());
}

#[test]
fn a_node_worker_quits_gracefully() {
    let Some(pool) = start(&["--shutdown-timeout", "10s"]) else {
        return;
    };
    assert_quits_gracefully(pool);
}

/// The same in the default mode, where the supervisor tells the worker to
/// quit with `Q` on its channel; the request it finished is counted.
#[test]
fn a_node_worker_quits_gracefully_in_the_default_mode() {
    let Some(pool) = start_kernel(2, &["--shutdown-timeout", "10s"]) else {
        return;
    };
    let stdout = std::sync::Arc::clone(&pool.stdout);
    let stderr = std::sync::Arc::clone(&pool.stderr);
    assert_quits_gracefully(pool);
    let lines = stdout.dump();
    let json = lines
        .lines()
        .find_map(|l| l.strip_prefix("forkpool: totals "))
        .unwrap_or_else(|| panic!("no totals line:\n{lines}\n{}", stderr.dump()));
    let totals: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(totals["accepted"], 1, "{totals}");
    assert_eq!(totals["died"], 0, "{totals}");
    assert_eq!(totals["killed"], 0, "{totals}");
}

/// With no --dispatch flag the pool runs kernel dispatch, and each Node
/// worker takes the messages path: status says so, every request is
/// answered, and the supervisor counts each one accepted and served, from
/// the worker's `B`, `N` and `I` alone.
#[test]
fn node_workers_serve_the_default_mode_by_messages_and_every_request_counts() {
    let Some(node) = common::require_program("node", INSTALL) else {
        return;
    };
    let cmd = node_cmd(&node);
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let pool = DemoPool::start_run(&["--min-children", "2"], &cmd);
    if !common::require_kernel_dispatch(&pool) {
        return;
    }
    let status = pool
        .wait_status(PATIENCE, |s| s["idle"] == 2 && s["starting"] == 0)
        .unwrap_or_else(|| panic!("{}\n{}", pool.status(), pool.stderr.dump()));
    let slots = status["slots"].as_array().expect("slots");
    assert_eq!(slots.len(), 2, "{status}");
    for slot in slots {
        assert_eq!(slot["path"], "messages", "{status}");
    }
    // 5 one after the other, then 3 rounds of 5 at once (more than the
    // workers: some overlap in one worker, which then says `N`).
    for _ in 0..5 {
        let r = get(pool.addr, "/").expect("request");
        assert_eq!((r.status, r.body.as_str()), (200, "hello\n"));
    }
    for _ in 0..3 {
        for r in common::concurrent_gets(pool.addr, "/?sleep_ms=50", 5) {
            assert_eq!(r.expect("request").status, 200);
        }
    }
    let made = 20;
    let counted = pool.wait_status(PATIENCE, |s| {
        total(s, "accepted") == made && served(s) == made && s["busy"] == 0
    });
    let status = pool.status();
    assert!(counted.is_some(), "{made} requests: {status}");
    assert_eq!(total(&status, "killed"), 0, "{status}");
    assert_eq!(total(&status, "died"), 0, "{status}");
}

/// A slow request holds one worker busy (its `B`), and a fast one sent
/// meanwhile is answered by the other worker; then both are idle again.
#[test]
fn a_slow_request_holds_one_node_worker_while_another_serves() {
    let Some(pool) = start_kernel(2, &[]) else {
        return;
    };
    let mut slow = send(pool.addr, "/?sleep_ms=3000");
    let busy = pool
        .wait_status(PATIENCE, |s| s["busy"] == 1 && busy_pid(s).is_some())
        .unwrap_or_else(|| panic!("no worker went busy: {}", pool.status()));
    let held_by = busy_pid(&busy).unwrap();
    let fast = get(pool.addr, "/").expect("the fast request");
    assert_eq!(fast.status, 200);
    assert_ne!(fast.pid.map(i64::from), Some(held_by), "{}", pool.status());
    let status = pool.status();
    assert_eq!(busy_pid(&status), Some(held_by), "{status}");
    let mut answer = String::new();
    slow.read_to_string(&mut answer).expect("the slow answer");
    let r = common::parse_response(&answer).expect("a whole response");
    assert_eq!(r.pid.map(i64::from), Some(held_by));
    let idle = pool.wait_status(PATIENCE, |s| s["idle"] == 2 && total(s, "accepted") == 2);
    assert!(idle.is_some(), "{}", pool.status());
}

/// A kept-alive connection holds its worker between requests, as any
/// forkpool worker's does: a new client goes to the other, idle, worker;
/// once the kept-alive connection closes, both are idle, and each
/// connection was counted once.
#[test]
fn a_kept_alive_connection_holds_its_node_worker_and_the_next_client_goes_to_another() {
    let Some(pool) = start_kernel(2, &[]) else {
        return;
    };
    let pid_of = |r: &http_corpus::Response| {
        r.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("x-forkpool-pid"))
            .and_then(|(_, v)| v.trim().parse::<i64>().ok())
    };
    let mut kept = keep_alive(&pool);
    let first = ask(&mut kept).expect("the first answer");
    assert_eq!(first.status, 200);
    let kept_by = pid_of(&first);
    let held = pool.wait_status(PATIENCE, |s| s["busy"] == 1 && busy_pid(s).is_some());
    let held = held.unwrap_or_else(|| {
        panic!(
            "the kept-alive connection holds no worker: {}",
            pool.status()
        )
    });
    assert_eq!(busy_pid(&held), kept_by);
    let other = get(pool.addr, "/").expect("a new connection");
    assert_eq!(other.status, 200);
    assert_ne!(other.pid.map(i64::from), kept_by, "{}", pool.status());
    assert_eq!(pid_of(&ask(&mut kept).expect("the next answer")), kept_by);
    drop(kept);
    let counted = pool.wait_status(PATIENCE, |s| s["idle"] == 2 && total(s, "accepted") == 2);
    assert!(counted.is_some(), "{}", pool.status());
}

/// No cap on a kept-alive connection's requests: a Node worker serves its
/// connections concurrently, so a long one keeps nobody waiting, and a cap
/// only forced reconnections that could land on a busy worker. 1,500
/// requests on one connection, none answered with `Connection: close`.
#[test]
fn a_kept_alive_connection_is_not_cut_after_a_number_of_requests() {
    let Some(pool) = start_kernel(1, &[]) else {
        return;
    };
    let mut conn = keep_alive(&pool);
    for i in 1..=1500 {
        let r = ask(&mut conn).unwrap_or_else(|e| panic!("request {i}: {e}"));
        assert_eq!(r.status, 200, "request {i}");
        let closes = r
            .headers
            .iter()
            .any(|(n, v)| n == "connection" && v.eq_ignore_ascii_case("close"));
        assert!(!closes, "request {i} closed the connection");
    }
}

/// Idle workers answer pings (every 200 ms, 300 ms to answer) while they
/// wait for connections: watched for 3 s, none is killed for silence.
#[test]
fn idle_node_workers_answer_pings() {
    let pings = ["--ping-interval", "200ms", "--ping-timeout", "300ms"];
    let Some(pool) = start_kernel(2, &pings) else {
        return;
    };
    let pids = pool.children();
    let watch = Instant::now() + Duration::from_secs(3);
    while Instant::now() < watch {
        let status = pool.status();
        assert_eq!(killed_by(&status, "ping_timeout"), 0, "{status}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = pool.status();
    assert_eq!(killed_by(&status, "ping_timeout"), 0, "{status}");
    assert_eq!(pool.children(), pids, "{status}");
    assert_eq!(get(pool.addr, "/").expect("request").status, 200);
}

/// In `order` and `shared`, where libuv cannot accept exactly one
/// connection when told, the worker says so (`G`): the supervisor orders
/// it nothing and counts what it reports. Connections are served, all
/// counted, and no order is ever missed or answered by a kill.
#[test]
fn node_workers_in_order_and_shared_say_they_accept_by_themselves() {
    let Some(node) = common::require_program("node", INSTALL) else {
        return;
    };
    let cmd = node_cmd(&node);
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    for mode in ["order", "shared"] {
        let pool = DemoPool::start_run(
            &[
                "--dispatch",
                mode,
                "--min-children",
                "2",
                "--max-children",
                "2",
            ],
            &cmd,
        );
        let status = pool
            .wait_status(PATIENCE, |s| s["idle"] == 2 && s["starting"] == 0)
            .unwrap_or_else(|| panic!("{mode}: {}\n{}", pool.status(), pool.stderr.dump()));
        for slot in status["slots"].as_array().expect("slots") {
            assert_eq!(slot["path"], "messages", "{mode}: {status}");
        }
        for _ in 0..5 {
            assert_eq!(get(pool.addr, "/").expect("request").status, 200);
        }
        for r in common::concurrent_gets(pool.addr, "/?sleep_ms=50", 6) {
            assert_eq!(r.expect("request").status, 200, "{mode}");
        }
        let made = 11;
        let counted = pool.wait_status(PATIENCE, |s| {
            total(s, "accepted") == made && served(s) == made && s["busy"] == 0
        });
        let status = pool.status();
        assert!(counted.is_some(), "{mode}: {made} connections: {status}");
        assert_eq!(total(&status, "killed"), 0, "{mode}: {status}");
        assert_eq!(total(&status, "futile_wakeups"), 0, "{mode}: {status}");
    }
}

/// Outside the modes Node can serve the helper refuses at once, saying
/// which modes to use, instead of serving badly.
#[test]
fn the_helper_refuses_the_modes_node_cannot_serve() {
    let Some(node) = common::require_program("node", INSTALL) else {
        return;
    };
    let modes = "kernel dispatch (the default: no --dispatch), order, shared, or none";
    let cases: [(&[(&str, &str)], &str); 2] = [
        (&[("FORKPOOL_DISPATCH", "handoff")], modes),
        (&[("FORKPOOL_TEMPLATE_FD", "4")], "without --preload"),
    ];
    for (env, says) in cases {
        let out = Command::new(&node)
            .args([helper(), app()])
            .env_remove("FORKPOOL_DISPATCH")
            .env_remove("FORKPOOL_KERNEL_DISPATCH")
            .envs(env.iter().copied())
            .output()
            .expect("run node");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{env:?}: {stderr}");
        assert!(stderr.contains(says), "{env:?}: {stderr}");
    }
}

/// The helper's own unit tests (clients/node/test: the messages and the
/// busy/idle bookkeeping), with `node --test`.
#[test]
fn the_helpers_unit_tests_pass() {
    let Some(node) = common::require_program("node", INSTALL) else {
        return;
    };
    let out = Command::new(node)
        .args(["--test", "test/"])
        .current_dir(clients().join("node"))
        .output()
        .expect("run node --test");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{report}");
    assert!(report.contains("# pass 6"), "{report}");
}

/// The package builds with `npm pack`, offline, and holds the helper.
#[test]
fn the_package_packs_offline() {
    let Some(npm) = common::require_program("npm", INSTALL) else {
        return;
    };
    let cache = common::temp_path("npm-cache");
    let out = Command::new(npm)
        .args(["pack", "--dry-run", "--json", "--offline"])
        .current_dir(clients().join("node"))
        .env("npm_config_cache", &cache)
        .env("npm_config_update_notifier", "false")
        .output()
        .expect("run npm");
    let _ = std::fs::remove_dir_all(&cache);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let packed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("npm's JSON");
    let files: Vec<&str> = packed[0]["files"]
        .as_array()
        .expect("files")
        .iter()
        .filter_map(|f| f["path"].as_str())
        .collect();
    for wanted in [
        "package.json",
        "forkpool.js",
        "forkpool-node.js",
        "channel.js",
        "messages.js",
        "README.md",
    ] {
        assert!(files.contains(&wanted), "{wanted} not packed: {files:?}");
    }
}
