//! What an operator relies on: status, metrics, busy timeout, reload,
//! spare-target signals, privilege drop, sd_notify, config files.

#[path = "common/bench_bins.rs"]
mod bench_bins;
mod common;

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{continuous_load, forkpool_bin, get, kill9, killed_by, temp_path, total, DemoPool};

#[test]
fn status_reports_true_counts_after_a_scripted_sequence() {
    let pool = DemoPool::start(&[
        "--min-children",
        "3",
        "--min-spare",
        "1",
        "--max-spare",
        "4",
    ]);
    assert!(pool.wait_children(Duration::from_secs(5), |n| n == 3));
    for _ in 0..5 {
        assert_eq!(pool.get("/").unwrap().status, 200);
    }
    // One request in flight: slot 0 busy while we look.
    let addr = pool.addr;
    let slow = std::thread::spawn(move || get(addr, "/?work_ms=1500"));
    let status = pool
        .wait_status(Duration::from_secs(5), |s| {
            total(s, "accepted") == 6 && s["busy"] == 1
        })
        .unwrap_or_else(|| panic!("{}", pool.status()));
    let busy: Vec<_> = status["slots"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["state"] == "busy")
        .collect();
    assert_eq!(busy.len(), 1);
    assert_eq!(busy[0]["slot"], 0);
    assert!(busy[0]["busy_for_ms"].as_u64().is_some());
    assert_eq!(busy[0]["served"], 5);
    assert!(slow.join().unwrap().is_ok());

    // Kill an idle child: counted as died, and replaced (min_children 3).
    let spawned_before = pool.status()["totals"]["spawned"].as_u64().unwrap();
    let victim = pool.children()[1];
    pool.kill_and_await_replacement(victim, 4, 3);
    let status = pool.status();
    assert_eq!(status["totals"]["died"], 1);
    assert_eq!(
        status["totals"]["spawned"].as_u64().unwrap(),
        spawned_before + 1
    );
    assert_eq!(status["generation"], 1);

    // The human page says the same.
    let out = Command::new(forkpool_bin())
        .args(["status", "--control"])
        .arg(&pool.control)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("child states:"), "{text}");
    assert!(text.contains("accepted 6 (0 taken next"), "{text}");
    assert!(text.contains("died unexpectedly 1"), "{text}");
    assert!(text.contains("SLOT"), "{text}");
}

#[test]
fn status_without_a_pool_says_what_to_do() {
    let out = Command::new(forkpool_bin())
        .args(["status", "--control"])
        .arg(temp_path("nothing.sock"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is it running?"));
}

#[test]
fn control_socket_is_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let pool = DemoPool::start(&[]);
    let mode = std::fs::metadata(&pool.control)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

fn scrape(pool: &DemoPool) -> String {
    common::scrape_metrics(pool)
}

#[test]
fn metrics_count_what_happened() {
    // `handoff`: the dispatch latency is that of connections the
    // supervisor hands over (in `kernel` dispatch it sees only the
    // overflow: kernel_exec.rs checks that count).
    let pool = DemoPool::start_from(
        &bench_bins::forkpool_bench(),
        &[
            "--chaos",
            "--min-children",
            "2",
            "--metrics",
            "127.0.0.1:0",
            "--dispatch",
            "handoff",
        ],
        &[],
    );
    assert!(pool
        .stdout
        .wait_for("forkpool: metrics on", Duration::from_secs(5)));
    for _ in 0..3 {
        assert_eq!(pool.get("/").unwrap().status, 200);
    }
    assert_eq!(pool.get("/?chaos=garbage").unwrap().status, 200);
    assert!(pool
        .wait_status(Duration::from_secs(5), |s| killed_by(s, "misbehaved") == 1)
        .is_some());
    let text = scrape(&pool);
    assert!(
        text.contains("forkpool_connections_accepted_total 4"),
        "{text}"
    );
    assert!(
        text.contains("forkpool_kills_total{reason=\"misbehaved\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("forkpool_dispatch_latency_seconds_count 4"),
        "{text}"
    );
    assert!(text.contains("forkpool_children{state=\"idle\"}"), "{text}");
}

#[test]
fn busy_timeout_kills_exactly_the_stuck_child() {
    let pool = DemoPool::start(&["--min-children", "3", "--busy-timeout", "700ms"]);
    assert!(pool.wait_children(Duration::from_secs(5), |n| n == 3));
    let addr = pool.addr;
    let stuck = std::thread::spawn(move || get(addr, "/?work_ms=10000"));
    assert!(pool
        .wait_status(Duration::from_secs(5), |s| s["busy"] == 1)
        .is_some());
    let others_before: Vec<i32> = pool.children();
    // Other children keep serving quick requests meanwhile.
    for _ in 0..5 {
        let r = pool.get("/?work_ms=20").unwrap();
        assert_eq!(r.status, 200);
        assert_ne!(r.slot, Some(0));
    }
    assert!(pool
        .wait_status(Duration::from_secs(5), |s| {
            killed_by(s, "busy_timeout") == 1
        })
        .is_some());
    assert!(
        stuck.join().unwrap().is_err(),
        "the stuck request dies with its child"
    );
    let status = pool.status();
    assert_eq!(status["totals"]["killed_by"]["busy_timeout"], 1);
    assert_eq!(status["totals"]["killed"], 1);
    // Exactly one of the original children is gone.
    let now = pool.children();
    let gone = others_before.iter().filter(|p| !now.contains(p)).count();
    assert_eq!(gone, 1, "before {others_before:?}, after {now:?}");
}

#[test]
fn reload_under_load_loses_nothing() {
    let pool = DemoPool::start(&["--min-children", "3", "--max-spare", "4"]);
    assert!(pool.wait_children(Duration::from_secs(5), |n| n == 3));
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, handles) = continuous_load(pool.addr, 4, Arc::clone(&stop));
    for round in 1..=10u64 {
        let before = ok.load(Ordering::SeqCst);
        pool.signal(1);
        assert!(pool.wait_total("reloads", round, Duration::from_secs(5)));
        // Let requests flow through the new generation before the next HUP.
        let deadline = Instant::now() + Duration::from_secs(5);
        while ok.load(Ordering::SeqCst) < before + 20 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    stop.store(true, Ordering::SeqCst);
    let failures: Vec<String> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    assert!(
        failures.is_empty(),
        "failed requests across reloads: {failures:?}"
    );
    assert!(ok.load(Ordering::SeqCst) >= 200);
    let status = pool.status();
    assert_eq!(status["generation"], 11);
    assert_eq!(status["totals"]["reloads"], 10);
    // Old generations drain away.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let status = pool.status();
        let old = status["slots"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["generation"] != 11)
            .count();
        if old == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "old generation still present: {status}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_bad_config_on_reload_keeps_the_old_one() {
    let file = temp_path("pool.toml");
    std::fs::write(&file, "[pool]\nmin_children = 2\nmax_spare = 4\n").unwrap();
    let pool = DemoPool::start(&["--config", file.to_str().unwrap()]);
    assert!(pool.wait_children(Duration::from_secs(5), |n| n == 2));
    std::fs::write(
        &file,
        "[pool]\nmin_children = 2\nmin_spare = 9\nmax_spare = 4\n",
    )
    .unwrap();
    pool.signal(1);
    assert!(pool.wait_total("reloads_refused", 1, Duration::from_secs(5)));
    // Naming what is wrong in the file is the feature: checked second.
    assert!(pool
        .stderr
        .wait_for("min_spare 9 is above max_spare 4", Duration::from_secs(5)));
    assert_eq!(pool.status()["generation"], 1);
    assert_eq!(pool.get("/").unwrap().status, 200);
    std::fs::write(&file, "[pool]\nmin_children = 3\nmax_spare = 5\n").unwrap();
    pool.signal(1);
    let status = pool
        .wait_status(Duration::from_secs(5), |s| total(s, "reloads") == 1)
        .unwrap();
    assert_eq!(total(&status, "reloads_refused"), 1);
    assert_eq!(status["generation"], 2);
    assert_eq!(status["bounds"][0], 3);
    assert_eq!(status["bounds"][3], 5);
    let _ = std::fs::remove_file(&file);
}

#[test]
fn ttin_and_ttou_move_the_spare_target() {
    let pool = DemoPool::start(&["--min-spare", "2", "--max-spare", "3"]);
    let spare = |min: u64| move |s: &serde_json::Value| s["bounds"][2] == min;
    pool.signal(21); // TTIN
    assert!(pool.wait_status(Duration::from_secs(5), spare(3)).is_some());
    pool.signal(21);
    let status = pool
        .wait_status(Duration::from_secs(5), spare(4))
        .unwrap_or_else(|| panic!("{}", pool.status()));
    assert_eq!(status["bounds"][3], 4);
    // The pool grows to keep four idle.
    assert!(pool.wait_children(Duration::from_secs(5), |n| n >= 4));
    pool.signal(22); // TTOU
    assert!(pool.wait_status(Duration::from_secs(5), spare(3)).is_some());
}

fn uid_of(pid: i32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn children_run_as_the_configured_user() {
    let am_root = uid_of(std::process::id() as i32) == Some(0);
    let nobody = std::fs::read_to_string("/etc/passwd")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("nobody:"))
        .and_then(|l| l.split(':').nth(2)?.parse::<u32>().ok());
    if !common::require(am_root, "root (to switch user)", "run the tests as root")
        || !common::require(
            nobody.is_some(),
            "a 'nobody' user",
            "add one: useradd --system nobody",
        )
    {
        return;
    }
    let nobody_uid = nobody.unwrap();
    let pool = DemoPool::start(&["--min-children", "2", "--user", "nobody"]);
    assert!(pool.wait_children(Duration::from_secs(5), |n| n == 2));
    let served = pool.get("/").unwrap();
    assert_eq!(served.status, 200);
    assert_eq!(
        uid_of(served.pid.unwrap()),
        Some(nobody_uid),
        "the serving child"
    );
    // A child forked a moment ago may not have switched yet: poll, bounded.
    assert!(pool.wait_child_pids(Duration::from_secs(5), |pids| {
        pids.iter().all(|p| uid_of(*p) == Some(nobody_uid))
    }));
    assert_eq!(uid_of(pool.pid), Some(0), "the supervisor keeps root");
}

#[test]
fn systemd_hears_ready_status_reloading_and_stopping() {
    use std::os::unix::net::UnixDatagram;
    let path = temp_path("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut pool = DemoPool::start_with(
        &["--min-children", "2"],
        &[("NOTIFY_SOCKET", path.to_str().unwrap())],
    );
    let mut seen = String::new();
    let mut wait_for = |needle: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !seen.contains(needle) && Instant::now() < deadline {
            let mut buf = [0u8; 4096];
            if let Ok(n) = socket.recv(&mut buf) {
                seen.push_str(&String::from_utf8_lossy(&buf[..n]));
                seen.push('\n');
            }
        }
        assert!(seen.contains(needle), "no {needle} in:\n{seen}");
    };
    wait_for("READY=1");
    wait_for("STATUS=child states: ");
    pool.signal(1);
    wait_for("RELOADING=1");
    pool.signal(15);
    wait_for("STOPPING=1");
    assert!(pool.wait_exit(Duration::from_secs(10)).is_some());
    let _ = std::fs::remove_file(&path);
}

fn forkpool(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(forkpool_bin()).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn config_file_errors_name_the_key_the_line_and_the_fix() {
    let file = temp_path("bad.toml");
    let path = file.to_str().unwrap();
    std::fs::write(
        &file,
        "listen = [\"127.0.0.1:0\"]\n[pool]\nmin_childs = 2\n",
    )
    .unwrap();
    let (code, _, err) = forkpool(&["check", "--config", path]);
    assert_eq!(code, 1);
    assert!(err.contains("min_childs"), "{err}");
    assert!(err.contains("line 3"), "{err}");
    assert!(
        err.contains("min_children"),
        "the fix: the key it probably meant\n{err}"
    );

    std::fs::write(&file, "[pool]\nmax_spare = 4\nmin_spare = 8\n").unwrap();
    let (code, _, err) = forkpool(&["check", "--config", path]);
    assert_eq!(code, 1);
    assert!(
        err.contains(&format!(
            "{path}:3: invalid configuration: min_spare 8 is above max_spare 4"
        )),
        "{err}"
    );

    std::fs::write(&file, "[pool]\nping_interval = \"soon\"\n").unwrap();
    let (code, _, err) = forkpool(&["check", "--config", path]);
    assert_eq!(code, 1);
    assert!(err.contains("line 2") && err.contains("500ms"), "{err}");

    std::fs::write(&file, "user = \"no-such-user-forkpool\"\n").unwrap();
    let (code, _, err) = forkpool(&["check", "--config", path]);
    assert_eq!(code, 1);
    assert!(
        err.contains("no such user 'no-such-user-forkpool'"),
        "{err}"
    );

    std::fs::write(
        &file,
        "listen = [\"web=127.0.0.1:8080\"]\n[pool]\nmax_children = 10\nbusy_timeout = \"30s\"\n",
    )
    .unwrap();
    let (code, out, err) = forkpool(&["check", "--config", path]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(": ok"), "{out}");
    assert!(out.contains("web=127.0.0.1:8080"), "{out}");
    assert!(out.contains("children 2..10"), "{out}");
    // Flags override the file.
    let (_, out, _) = forkpool(&["check", "--config", path, "--max-children", "20"]);
    assert!(out.contains("children 2..20"), "{out}");
    let _ = std::fs::remove_file(&file);
}

#[test]
fn named_unix_listener_gets_the_configured_mode() {
    use std::os::unix::fs::PermissionsExt;
    let sock = temp_path("web.sock");
    let listen = format!("local=unix:{}", sock.display());
    let pool = DemoPool::start(&[
        "--listen",
        "127.0.0.1:0",
        "--listen",
        &listen,
        "--unix-mode",
        "0660",
    ]);
    // The pool is ready, so every listener is bound.
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o660);
    assert_eq!(pool.get("/").unwrap().status, 200);
}

#[test]
fn inherited_listeners_are_used_instead_of_binding() {
    // A launcher in Python does what systemd does: bind, put the socket at
    // fd 3, set LISTEN_FDS and LISTEN_PID, exec.
    let script = r#"
import os, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0)); s.listen(16)
os.dup2(s.fileno(), 3); os.set_inheritable(3, True)
os.environ["LISTEN_FDS"] = "1"; os.environ["LISTEN_PID"] = str(os.getpid())
os.environ["LISTEN_FDNAMES"] = "web"
os.execv(sys.argv[1], sys.argv[1:])
"#;
    let mut child = Command::new("python3")
        .args(["-c", script, forkpool_bin(), "demo", "--control"])
        .arg(temp_path("inherit.sock"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let mut reader = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut reader, &mut line).unwrap();
    let result = std::panic::catch_unwind(|| serves_on_inherited_listener(&line));
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    for c in children.split_whitespace() {
        kill9(c.parse().unwrap());
    }
    let _ = child.kill();
    let _ = child.wait();
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

fn serves_on_inherited_listener(line: &str) {
    assert!(line.contains("(inherited)"), "{line}");
    let addr: std::net::SocketAddr = line
        .strip_prefix("forkpool: listening on ")
        .and_then(|r| r.split(' ').next())
        .and_then(|a| a.parse().ok())
        .expect("address");
    assert_eq!(get(addr, "/").unwrap().status, 200);
}
