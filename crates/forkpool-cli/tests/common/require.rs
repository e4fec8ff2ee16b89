//! The one rule for tests that need something from outside the workspace
//! (a program, a package, root): missing under `CI=true` is a failure.
//! Shared by every test crate that needs it (the milter crate includes
//! this file by path), so the rule is written once.
#![allow(dead_code)]

use std::io::Write;

/// Whether the tests run under CI: the `CI` environment variable, which CI
/// services set (to `true`), is set to anything but empty, `0` or `false`.
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false"))
}

/// The one rule for a test that needs something from outside the
/// workspace (a program, a package, root). `found` says whether it is
/// here; `what` names it and `install` says how to get it. Returns true
/// when the test can go on.
///
/// Missing under CI ([`under_ci`]): the test fails, naming what to
/// install, because CI installs everything (`.ci/deps/`) and a test that
/// quietly did nothing there would read as a pass. Missing elsewhere: the
/// test returns at once, after a `NOT RUN` line written straight to the
/// terminal (past the harness's capture, which hides a passing test's
/// output), so nobody mistakes the `ok` the harness prints for a check.
pub fn require(found: bool, what: &str, install: &str) -> bool {
    if found {
        return true;
    }
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("this test");
    if under_ci() {
        panic!("{test}: {what} is missing; install it: {install}");
    }
    let _ = writeln!(
        std::io::stderr(),
        "NOT RUN: {test}: {what} is missing ({install}); it checked nothing \
         (under CI=true this is a failure)"
    );
    false
}

/// The program `name` on `PATH` (or in `/usr/sbin`, `/sbin`, where root's
/// tools live), through [`require`]: `None` when the test must return.
pub fn require_program(name: &str, install: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(std::path::PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file());
    require(found.is_some(), &format!("the program `{name}`"), install);
    found
}
