//! Templates (`--preload`), the worker side: each helper run as a template
//! under `clients/tests/template_harness.py`, a small reference supervisor
//! that is a child subreaper, orders forks and checks every forked worker
//! from the outside (reparented to it, exactly the expected descriptors,
//! stderr on the passed pipe, `after_fork` ran, serves and answers pings,
//! survives its template, refork). The real supervisor's side is not here.

#[path = "common/bench_bins.rs"]
mod bench_bins;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const HARNESS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../clients/tests/template_harness.py"
);
const PYTHON_APP: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../clients/tests/template_app.py"
);

/// The harness's whole run is bounded by this; it bounds each wait itself.
const RUN: Duration = Duration::from_secs(120);

/// Kills the harness (by pid) if the test ends before it does.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn harness(dispatch: &str, extra: &[&str], app: &[&str]) -> Guard {
    let child = Command::new("python3")
        .arg(HARNESS)
        .args(["--dispatch", dispatch])
        .args(extra)
        .arg("--")
        .args(app)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs the template harness");
    Guard(child)
}

fn wait_bounded(guard: &mut Guard) -> std::process::ExitStatus {
    let deadline = Instant::now() + RUN;
    loop {
        if let Some(status) = guard.0.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "the harness ran over {RUN:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every check of the harness, for one helper in one dispatch mode.
fn passes_every_check(dispatch: &str, app: &[&str]) {
    let mut guard = harness(dispatch, &[], app);
    let status = wait_bounded(&mut guard);
    assert!(
        status.success(),
        "template harness failed ({status}) for {app:?} in {dispatch}: see its stderr above"
    );
}

/// Whether `pid` is still a live process (a zombie is not).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// The harness forks workers and SIGKILLs itself: its template and every
/// worker must be gone within a bounded time.
fn nothing_outlives_the_supervisor(dispatch: &str, app: &[&str]) {
    let mut guard = harness(dispatch, &["--die"], app);
    let mut line = String::new();
    BufReader::new(guard.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let status = wait_bounded(&mut guard);
    let pids: Vec<u32> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 4, "harness ({status}) printed {line:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|&pid| alive(pid)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<u32> = pids.iter().copied().filter(|&pid| alive(pid)).collect();
    for &pid in &left {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    assert!(
        left.is_empty(),
        "still running 10 s after the supervisor died: {left:?}"
    );
}

#[test]
fn python_template_in_handoff() {
    passes_every_check("handoff", &["python3", PYTHON_APP]);
}

#[test]
fn python_template_in_order() {
    passes_every_check("order", &["python3", PYTHON_APP]);
}

#[test]
fn python_template_and_workers_exit_with_the_supervisor() {
    nothing_outlives_the_supervisor("handoff", &["python3", PYTHON_APP]);
}

const PERL_APP: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../clients/tests/template_app.pl"
);

#[test]
fn perl_template_in_handoff() {
    passes_every_check("handoff", &["perl", PERL_APP]);
}

#[test]
fn perl_template_in_order() {
    passes_every_check("order", &["perl", PERL_APP]);
}

#[test]
fn perl_template_and_workers_exit_with_the_supervisor() {
    nothing_outlives_the_supervisor("order", &["perl", PERL_APP]);
}

/// The Rust helper: the example worker in `--json` mode, a binary of the
/// `forkpool-bench` crate.
fn rust_app() -> Vec<String> {
    vec![
        bench_bins::workspace_bin("forkpool-example-worker")
            .display()
            .to_string(),
        "--json".to_string(),
    ]
}

fn rust_args(app: &[String]) -> Vec<&str> {
    app.iter().map(String::as_str).collect()
}

#[test]
fn rust_template_in_handoff() {
    let app = rust_app();
    passes_every_check("handoff", &rust_args(&app));
}

#[test]
fn rust_template_in_order() {
    let app = rust_app();
    passes_every_check("order", &rust_args(&app));
}

#[test]
fn rust_template_and_workers_exit_with_the_supervisor() {
    let app = rust_app();
    nothing_outlives_the_supervisor("handoff", &rust_args(&app));
}
