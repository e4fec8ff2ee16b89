//! SIGUSR2: a new supervisor takes over the listeners without refusing a
//! connection; a broken new binary leaves the old one serving.

mod common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{continuous_load, forkpool_bin, get, kill9, temp_path, total, DemoPool};

/// A private copy of the binary, so a test can replace it on disk.
fn binary_copy() -> PathBuf {
    let path = temp_path("forkpool-bin");
    std::fs::copy(forkpool_bin(), &path).unwrap();
    path
}

/// Asks `f` every 20 ms until it answers, for at most `limit`.
fn poll_until<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(t) = f() {
            return Some(t);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills a supervisor the harness does not know about, and its children.
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let pid = self.0;
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        kill9(pid);
        for c in children.split_whitespace() {
            kill9(c.parse().unwrap());
        }
    }
}

/// Lets the load run until `target` requests succeeded (10 s at most),
/// stops it, and asserts none failed.
fn end_load(
    ok: &std::sync::atomic::AtomicUsize,
    target: usize,
    stop: &AtomicBool,
    load: Vec<std::thread::JoinHandle<Vec<String>>>,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while ok.load(Ordering::SeqCst) < target && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::SeqCst);
    let failures: Vec<String> = load.into_iter().flat_map(|h| h.join().unwrap()).collect();
    assert!(
        failures.is_empty(),
        "failed requests across the upgrade: {failures:?}"
    );
}

#[test]
fn upgrade_under_load_refuses_nothing_and_the_old_supervisor_leaves() {
    upgrade_under_load(&["--min-children", "3"]);
}

/// Kernel dispatch: the new supervisor's slots join the listener's group
/// and take over; what the old children's sockets held is not reset.
#[test]
fn upgrade_under_load_in_kernel_dispatch_refuses_nothing() {
    upgrade_under_load(&["--min-children", "3", "--dispatch", "kernel"]);
}

fn upgrade_under_load(args: &[&str]) {
    let binary = binary_copy();
    let mut pool = DemoPool::start_from(&binary, args, &[]);
    let old_pid = pool.pid;
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, load) = continuous_load(pool.addr, 4, Arc::clone(&stop));
    while ok.load(Ordering::SeqCst) < 50 {
        std::thread::sleep(Duration::from_millis(5));
    }
    pool.signal(12); // USR2
                     // The old supervisor exits only once the new one said it is ready.
    let status = pool
        .wait_exit(Duration::from_secs(20))
        .expect("old supervisor exits");
    assert!(status.success());
    // That the listeners were inherited, not bound again, is reported only
    // in the new supervisor's start-up lines on stdout.
    assert!(pool.stdout.wait_for("(inherited)", Duration::from_secs(2)));
    let new = pool.status();
    let new_pid = new["pid"].as_i64().unwrap() as i32;
    let _cleanup = KillOnDrop(new_pid);
    assert_ne!(new_pid, old_pid);
    if args.contains(&"kernel") {
        assert_eq!(new["dispatch"], "kernel", "{new}");
    }
    // Keep the load on the new supervisor for a while.
    let target = ok.load(Ordering::SeqCst) + 100;
    end_load(&ok, target, &stop, load);
    assert!(ok.load(Ordering::SeqCst) >= target);
    // Only the new supervisor's children serve now.
    let r = get(pool.addr, "/").unwrap();
    let parent = std::fs::read_to_string(format!("/proc/{}/stat", r.pid.unwrap())).unwrap();
    let ppid: i32 = parent
        .rsplit(") ")
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(ppid, new_pid);
    let _ = std::fs::remove_file(&binary);
}

#[test]
fn a_broken_new_binary_leaves_the_old_supervisor_serving() {
    let binary = binary_copy();
    let pool = DemoPool::start_from(&binary, &["--min-children", "2"], &[]);
    // Replace the binary on disk, as a bad deploy would.
    let broken = temp_path("broken");
    std::fs::write(
        &broken,
        "#!/bin/sh\necho 'new build is broken' >&2\nexit 1\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&broken, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::rename(&broken, &binary).unwrap();
    pool.signal(12);
    let status = pool
        .wait_status(Duration::from_secs(10), |s| {
            total(s, "upgrade_failures") == 1
        })
        .unwrap_or_else(|| panic!("{}", pool.stderr.dump()));
    assert_eq!(status["pid"].as_i64().unwrap() as i32, pool.pid);
    // The operator sees why: the new build's own stderr is passed on
    // (the message is the feature, checked after the state).
    assert!(pool
        .stderr
        .wait_for("new build is broken", Duration::from_secs(2)));
    for _ in 0..5 {
        assert_eq!(pool.get("/").unwrap().status, 200);
    }
    let _ = std::fs::remove_file(&binary);
}

/// A new supervisor that never becomes ready (it hangs) is killed once
/// `start_timeout` plus 5 s have passed, the deadline its own children
/// would have (not a fixed minute), and the old one keeps serving.
#[test]
fn a_hung_new_binary_is_killed_after_start_timeout_and_the_old_one_serves() {
    let binary = binary_copy();
    let pool = DemoPool::start_from(
        &binary,
        &["--min-children", "2", "--start-timeout", "1s"],
        &[],
    );
    let pid_file = temp_path("hung-successor-pid");
    let hung = temp_path("hung");
    std::fs::write(
        &hung,
        format!(
            "#!/bin/sh
echo $$ > {}
exec sleep 1000
",
            pid_file.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&hung, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::rename(&hung, &binary).unwrap();
    let started = Instant::now();
    pool.signal(12);
    let successor = poll_until(Duration::from_secs(5), || {
        std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
    })
    .expect("the new binary ran");
    let _cleanup = KillOnDrop(successor);
    let status = pool
        .wait_status(Duration::from_secs(20), |s| {
            total(s, "upgrade_failures") == 1
        })
        .unwrap_or_else(|| panic!("{}", pool.stderr.dump()));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(6),
        "gave up on the successor after {took:?}, before start_timeout plus 5 s"
    );
    assert_eq!(status["pid"].as_i64().unwrap() as i32, pool.pid);
    // Killed and reaped by the old supervisor.
    let gone = poll_until(Duration::from_secs(5), || {
        (!std::path::Path::new(&format!("/proc/{successor}")).exists()).then_some(())
    });
    assert!(
        gone.is_some(),
        "the hung successor {successor} is still there"
    );
    for _ in 0..5 {
        assert_eq!(pool.get("/").unwrap().status, 200);
    }
    let _ = std::fs::remove_file(&binary);
    let _ = std::fs::remove_file(&pid_file);
}

/// A `GET /metrics` on the metrics address printed by `pool`: the status.
fn metrics_status(pool: &DemoPool) -> Result<u16, String> {
    let addr: std::net::SocketAddr = pool
        .stdout
        .dump()
        .lines()
        .find_map(|l| l.strip_prefix("forkpool: metrics on http://"))
        .and_then(|a| a.trim_end_matches("/metrics").parse().ok())
        .ok_or("no metrics line")?;
    get(addr, "/metrics").map(|r| r.status)
}

#[test]
fn upgrade_with_metrics_and_control_hands_both_over_under_load() {
    let binary = binary_copy();
    let args = ["--min-children", "3", "--metrics", "127.0.0.1:0"];
    let mut pool = DemoPool::start_from(&binary, &args, &[]);
    assert!(pool
        .stdout
        .wait_for("forkpool: metrics on", Duration::from_secs(5)));
    let old_pid = pool.pid;
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, load) = continuous_load(pool.addr, 4, Arc::clone(&stop));
    while ok.load(Ordering::SeqCst) < 50 {
        std::thread::sleep(Duration::from_millis(5));
    }
    pool.signal(12); // USR2
    let status = pool
        .wait_exit(Duration::from_secs(30))
        .expect("old supervisor exits");
    assert!(status.success(), "{status:?}");
    let new_pid = pool.status()["pid"].as_i64().expect("status answered") as i32;
    let _cleanup = KillOnDrop(new_pid);
    assert_ne!(new_pid, old_pid, "status answered by the new supervisor");
    // The old supervisor is gone: whoever answers the metrics is the new one.
    assert_eq!(metrics_status(&pool), Ok(200));
    let target = ok.load(Ordering::SeqCst) + 50;
    end_load(&ok, target, &stop, load);
    let _ = std::fs::remove_file(&binary);
}

#[test]
fn a_successor_that_fails_after_binding_leaves_status_and_metrics_to_the_old_one() {
    let binary = binary_copy();
    let config = temp_path("upgrade.toml");
    std::fs::write(&config, "[pool]\nmin_children = 2\n").unwrap();
    let config_arg = config.to_str().unwrap();
    let args = ["--config", config_arg, "--metrics", "127.0.0.1:0"];
    let pool = DemoPool::start_from(&binary, &args, &[]);
    assert!(pool
        .stdout
        .wait_for("forkpool: metrics on", Duration::from_secs(5)));
    // The successor will want an agent port that is taken: it fails after
    // it has bound its control socket.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std::fs::write(
        &config,
        format!(
            "agent = \"{}\"\n[pool]\nmin_children = 2\n",
            taken.local_addr().unwrap()
        ),
    )
    .unwrap();
    pool.signal(12);
    let status = pool
        .wait_status(Duration::from_secs(20), |s| {
            total(s, "upgrade_failures") == 1
        })
        .unwrap_or_else(|| panic!("{}", pool.stderr.dump()));
    assert_eq!(status["pid"].as_i64(), Some(i64::from(pool.pid)));
    assert_eq!(metrics_status(&pool), Ok(200));
    assert_eq!(pool.get("/").map(|r| r.status), Ok(200));
    let _ = std::fs::remove_file(&binary);
    let _ = std::fs::remove_file(&config);
}
