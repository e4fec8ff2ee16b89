//! Plack's own server test suite (`Plack::Test::Suite`, the one Starman
//! runs) against forkpool-psgi under `forkpool run`, by
//! `clients/tests/plack_suite.pl` (issue 25: it passes today; the strict
//! HTTP rules must keep it so).

mod common;

#[path = "common/psgi_support.rs"]
mod psgi_support;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SUITE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../clients/tests/plack_suite.pl"
);

#[test]
fn plack_test_suite_passes_on_forkpool_psgi() {
    if !psgi_support::require_plack() {
        return;
    }
    let mut child = Command::new("perl")
        .arg(SUITE)
        .arg(common::forkpool_bin())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run perl");
    // The suite is some 36 tests of small requests: a minute is ample.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut out = String::new();
    let mut err = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let failed: Vec<&str> = out.lines().filter(|l| l.starts_with("not ok")).collect();
    let passed = out.lines().filter(|l| l.starts_with("ok ")).count();
    assert!(
        status.is_some_and(|s| s.success()) && failed.is_empty() && passed > 50,
        "Plack::Test::Suite: {passed} passed, failed: {failed:#?}, exit {status:?}\n{out}\n{err}"
    );
}
