//! Templates (`--preload`) written as a hostile or careless author would
//! write them (`clients/tests/hostile_template.py`), against the real
//! supervisor: it signals only processes the kernel vouches for, keeps
//! its slots bounded, sweeps what a template leaves behind, and every stop
//! finishes in time. Each check reads status or the process table, never
//! the log.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{alive, total, DemoPool};

const TEMPLATE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../clients/tests/hostile_template.py"
);

/// The stop deadline the pools below are given; a stop must end within it
/// plus one second.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(2);

/// Pool options: a small preloaded pool with a short stop deadline.
const POOL: [&str; 12] = [
    "--preload",
    "--min-children",
    "2",
    "--max-children",
    "4",
    "--min-spare",
    "1",
    "--max-spare",
    "2",
    "--shutdown-timeout",
    "2s",
    "--dispatch",
];

/// A process the test starts and kills by pid, whatever happens.
struct Sacrifice(Child);

impl Sacrifice {
    fn sleep() -> Sacrifice {
        Sacrifice(
            Command::new("sleep")
                .arg("1000")
                .stdin(Stdio::null())
                .spawn()
                .expect("start sleep"),
        )
    }

    fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for Sacrifice {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `forkpool run POOL handoff -- python3 hostile_template.py MODE`,
/// started through `wrapper` (`sh -c SCRIPT`, which ends by exec'ing the
/// supervisor) or directly, not waiting for readiness: most of these
/// templates never make a pool ready.
fn start(mode: &str, wrapper: Option<&str>, env: &[(&str, String)]) -> DemoPool {
    let mut command = match wrapper {
        Some(script) => {
            let mut c = Command::new("sh");
            c.args(["-c", script, common::forkpool_bin(), "run"]);
            c
        }
        None => {
            let mut c = Command::new(common::forkpool_bin());
            c.arg("run");
            c
        }
    };
    command.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    let mut args: Vec<&str> = POOL.to_vec();
    args.push("handoff");
    DemoPool::launch(command, &args, &["python3", TEMPLATE, mode], false)
}

/// Sends SIGTERM and checks the supervisor exits within the stop deadline
/// plus one second.
fn stop_in_time(pool: &mut DemoPool) {
    let asked = Instant::now();
    pool.signal(libc::SIGTERM);
    let exited = pool.wait_exit(SHUTDOWN_TIMEOUT + Duration::from_secs(1));
    assert!(
        exited.is_some(),
        "TERM did not finish within {:?}; status: {:?}\nstderr:\n{}",
        SHUTDOWN_TIMEOUT + Duration::from_secs(1),
        pool.try_status(),
        pool.stderr.dump()
    );
    eprintln!("stopped in {:?}", asked.elapsed());
}

/// Waits until the lying template has been replaced twice; returns that
/// snapshot.
fn lied_twice(pool: &DemoPool) -> serde_json::Value {
    pool.wait_status(Duration::from_secs(20), |s| {
        total(s, "template_restarts") >= 2
    })
    .unwrap_or_else(|| {
        panic!(
            "the lying template was not replaced twice: {}",
            pool.status()
        )
    })
}

/// The template was killed for its lies, not merely replaced.
fn killed_for_lying(status: &serde_json::Value) {
    assert!(total(status, "templates_killed") >= 2, "{status}");
}

/// Polls status for `period`, checking at every snapshot that the slot
/// table holds at most `max` slots; returns the last snapshot.
fn slots_stay_within(pool: &DemoPool, max: usize, period: Duration) -> serde_json::Value {
    let until = Instant::now() + period;
    loop {
        let status = pool.status();
        let slots = status["slots"].as_array().map_or(0, Vec::len);
        assert!(
            slots <= max,
            "{slots} slots with max-children {max}: {status}"
        );
        if Instant::now() >= until {
            return status;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pid a hostile template or wrapper wrote to `path`, once written.
fn read_pid(path: &std::path::Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Whether nothing listens on `addr` any more.
fn refuses(addr: std::net::SocketAddr) -> bool {
    std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err()
}

/// Waits up to `within` for `pid` to be gone; whether it is.
fn gone(pid: i32, within: Duration) -> bool {
    let until = Instant::now() + within;
    while alive(pid) {
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// The supervisor's children, from /proc.
fn children_of(parent: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
        .collect()
}

#[test]
fn a_template_naming_the_supervisors_own_sidecar_cannot_get_it_killed() {
    sidecar_survives("lie-pid");
}

/// The same lie, with the worker's credentials forged to the sidecar's pid
/// too (a template run as root may): the sidecar started before the fork
/// order, so it is not the worker.
#[test]
fn a_root_template_forging_its_workers_credentials_cannot_get_the_sidecar_killed() {
    if !common::require(
        nix::unistd::geteuid().is_root(),
        "root (CAP_SYS_ADMIN, to forge SCM_CREDENTIALS)",
        "run the tests as root",
    ) {
        return;
    }
    sidecar_survives("forge");
}

/// The wrapper leaves a sidecar behind as the supervisor's own child, and
/// the template (`mode`) names it in every `W`.
fn sidecar_survives(mode: &str) {
    let pid_file = common::temp_path("sidecar.pid");
    let script = format!(
        r#"sleep 1000 & echo $! > {}; HOSTILE_PID=$! exec "$0" "$@""#,
        pid_file.display()
    );
    let mut pool = start(mode, Some(&script), &[]);
    let sidecar = read_pid(&pid_file)
        .expect("the wrapper wrote its sidecar's pid before exec'ing the supervisor");
    let _ = std::fs::remove_file(&pid_file);
    let sidecar = Adopted(sidecar);
    assert!(
        children_of(pool.pid).contains(&sidecar.0),
        "the sidecar is the supervisor's child"
    );
    let status = lied_twice(&pool);
    assert!(
        alive(sidecar.0),
        "the supervisor killed its sidecar: {status}"
    );
    killed_for_lying(&status);
    assert_eq!(
        total(&status, "killed"),
        0,
        "no worker was ever verified: {status}"
    );
    slots_stay_within(&pool, 4, Duration::from_millis(500));
    stop_in_time(&mut pool);
    assert!(
        alive(sidecar.0),
        "the supervisor killed its sidecar as it stopped"
    );
}

#[test]
fn a_template_naming_a_process_outside_the_pool_cannot_get_it_killed() {
    let outsider = Sacrifice::sleep();
    let mut pool = start(
        "lie-pid",
        None,
        &[("HOSTILE_PID", outsider.pid().to_string())],
    );
    let status = lied_twice(&pool);
    assert!(
        alive(outsider.pid()),
        "the supervisor killed a process outside the pool: {status}"
    );
    killed_for_lying(&status);
    slots_stay_within(&pool, 4, Duration::from_millis(500));
    stop_in_time(&mut pool);
    assert!(
        alive(outsider.pid()),
        "the supervisor killed a process outside the pool as it stopped"
    );
}

#[test]
fn a_template_naming_itself_is_killed_and_its_slots_freed() {
    let mut pool = start("lie-template", None, &[]);
    let status = lied_twice(&pool);
    killed_for_lying(&status);
    assert_eq!(total(&status, "killed"), 0, "{status}");
    slots_stay_within(&pool, 4, Duration::from_millis(500));
    stop_in_time(&mut pool);
}

/// A `W` naming another slot's (verified) worker is a lie: the template
/// is killed, and the worker it named keeps its slot and serves on.
#[test]
fn a_template_naming_another_slots_worker_is_killed_and_that_worker_serves_on() {
    let pid_file = common::temp_path("first-worker.pid");
    let mut pool = start(
        "lie-slot",
        None,
        &[("HOSTILE_PID_FILE", pid_file.display().to_string())],
    );
    let status = lied_twice(&pool);
    killed_for_lying(&status);
    let first = read_pid(&pid_file).expect("the first worker's pid");
    let _ = std::fs::remove_file(&pid_file);
    let held: Vec<i64> = status["slots"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["pid"].as_i64())
        .filter(|pid| *pid == i64::from(first))
        .collect();
    assert_eq!(held.len(), 1, "one slot holds the named worker: {status}");
    assert_eq!(
        total(&status, "killed"),
        0,
        "no worker was killed: {status}"
    );
    assert!(alive(first), "the named worker was killed");
    assert_eq!(pool.get("/").map(|r| r.status), Ok(200));
    slots_stay_within(&pool, 4, Duration::from_millis(500));
    stop_in_time(&mut pool);
    assert!(
        gone(first, Duration::from_secs(1)),
        "the worker outlived the pool"
    );
}

#[test]
fn a_template_that_never_answers_fork_orders_cannot_storm() {
    let mut pool = start("silent", None, &[]);
    let status = slots_stay_within(&pool, 4, Duration::from_secs(5));
    let spawned = total(&status, "spawned");
    assert!(
        spawned <= 40,
        "{spawned} fork orders in 5 s to a template that answers none: {status}"
    );
    assert!(total(&status, "templates_killed") >= 1, "{status}");
    let fds = std::fs::read_dir(format!("/proc/{}/fd", pool.pid))
        .map(|d| d.count())
        .unwrap_or(0);
    assert!(fds < 64, "the supervisor holds {fds} descriptors");
    stop_in_time(&mut pool);
}

#[test]
fn workers_reaped_behind_the_supervisors_back_are_counted_lost_and_stops_finish() {
    let mut pool = start("reaped", None, &[]);
    let status = pool
        .wait_status(Duration::from_secs(20), |s| total(s, "lost") >= 2)
        .unwrap_or_else(|| panic!("no worker counted lost: {}", pool.status()));
    assert_eq!(total(&status, "killed"), 0, "{status}");
    slots_stay_within(&pool, 4, Duration::from_millis(500));
    stop_in_time(&mut pool);
}

/// SIGQUIT ends the supervisor within one second, whatever its children
/// do: a template and workers deaf to SIGTERM and to every Quit (a TERM
/// would wait `shutdown_timeout` for them), a template whose workers are
/// reaped behind its back (the case where QUIT once did nothing), and one
/// whose helper keeps the listeners.
#[test]
fn quit_ends_the_supervisor_within_a_second_whatever_the_children_do() {
    for mode in ["deaf", "reaped", "helper"] {
        let pid_file = common::temp_path("quit-helper.pid");
        let mut pool = start(
            mode,
            None,
            &[("HOSTILE_PID_FILE", pid_file.display().to_string())],
        );
        let busy = pool.wait_status(Duration::from_secs(20), |s| {
            total(s, "lost") >= 1 || s["ready"] == true
        });
        assert!(
            busy.is_some(),
            "{mode}: the pool never got going: {}",
            pool.status()
        );
        // Every process the pool holds now: the template and its workers.
        let status = pool.status();
        let held: Vec<i32> = ["slots", "templates"]
            .iter()
            .flat_map(|key| status[key].as_array().cloned().unwrap_or_default())
            .filter_map(|entry| entry["pid"].as_i64())
            .filter(|pid| *pid > 0)
            .map(|pid| pid as i32)
            .collect();
        assert!(!held.is_empty(), "{mode}: no process to stop: {status}");
        let addr = pool.addr;
        let asked = Instant::now();
        pool.signal(libc::SIGQUIT);
        let exited = pool.wait_exit(Duration::from_secs(3));
        let took = asked.elapsed();
        assert!(
            exited.is_some() && took <= Duration::from_millis(1200),
            "{mode}: QUIT took {took:?} (exited: {exited:?})\n{}",
            pool.stderr.dump()
        );
        for pid in held {
            assert!(
                gone(pid, Duration::from_secs(1)),
                "{mode}: {pid} outlived QUIT"
            );
        }
        assert!(
            refuses(addr),
            "{mode}: something still listens on the pool's port after QUIT"
        );
        if let Some(helper) = read_pid(&pid_file) {
            let _guard = Adopted(helper);
            assert!(
                gone(helper, Duration::from_secs(1)),
                "{mode}: the helper outlived QUIT"
            );
        }
        let _ = std::fs::remove_file(pid_file);
    }
}

#[test]
fn what_a_template_started_does_not_outlive_the_pool() {
    let pid_file = common::temp_path("helper.pid");
    let mut pool = start(
        "helper",
        None,
        &[("HOSTILE_PID_FILE", pid_file.display().to_string())],
    );
    let until = Instant::now() + Duration::from_secs(20);
    let helper = loop {
        if let Some(pid) = read_pid(&pid_file) {
            break pid;
        }
        assert!(
            Instant::now() < until,
            "the template never started its helper"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let _guard = Adopted(helper);
    assert!(
        pool.wait_status(Duration::from_secs(20), |s| s["ready"] == true)
            .is_some(),
        "the pool never became ready"
    );
    assert_eq!(pool.get("/").map(|r| r.status), Ok(200));
    let addr = pool.addr;
    stop_in_time(&mut pool);
    assert!(
        gone(helper, Duration::from_secs(1)),
        "the template's helper {helper} outlived the pool"
    );
    assert!(
        refuses(addr),
        "something still listens on the pool's port after the stop"
    );
    let _ = std::fs::remove_file(pid_file);
}

#[test]
fn a_template_flooding_stderr_is_killed() {
    let mut pool = start("flood", None, &[]);
    pool.wait_status(Duration::from_secs(30), |s| {
        total(s, "templates_killed") >= 1
    })
    .unwrap_or_else(|| panic!("the flooding template was not killed: {}", pool.status()));
    stop_in_time(&mut pool);
}

/// A process the test did not start but must not leave running: kept by
/// pid, SIGKILLed when the test ends.
struct Adopted(i32);

impl Drop for Adopted {
    fn drop(&mut self) {
        common::kill9(self.0);
    }
}

/// The pids the supervisor holds pidfds for (`/proc/PID/fdinfo`'s `Pid:`
/// of each `anon_inode:[pidfd]` descriptor).
fn pidfd_targets(supervisor: i32) -> Vec<i32> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{supervisor}/fd")) else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = fds
        .filter_map(|e| e.ok())
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy() == "anon_inode:[pidfd]")
        })
        .filter_map(|e| {
            let info = std::fs::read_to_string(format!(
                "/proc/{supervisor}/fdinfo/{}",
                e.file_name().to_string_lossy()
            ))
            .ok()?;
            info.lines()
                .find_map(|l| l.strip_prefix("Pid:"))
                .and_then(|p| p.trim().parse().ok())
        })
        .collect();
    pids.sort_unstable();
    pids
}

#[test]
fn every_worker_and_template_is_held_by_a_pidfd() {
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../clients/python/example_http_worker.py"
    );
    let mut args: Vec<&str> = POOL.to_vec();
    args.push("handoff");
    let mut pool = DemoPool::start_run(&args, &["python3", example]);
    let status = pool
        .wait_status(Duration::from_secs(20), |s| s["idle"] == 2)
        .unwrap_or_else(|| panic!("two idle workers never came: {}", pool.status()));
    let mut expected: Vec<i32> = status["slots"]
        .as_array()
        .unwrap()
        .iter()
        .chain(status["templates"].as_array().unwrap())
        .map(|c| c["pid"].as_i64().unwrap() as i32)
        .collect();
    expected.sort_unstable();
    assert_eq!(expected.len(), 3, "{status}");
    assert_eq!(pidfd_targets(pool.pid), expected, "{status}");
    stop_in_time(&mut pool);
}
