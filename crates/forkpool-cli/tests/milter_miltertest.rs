//! A milter driven by Debian's `miltertest` (a milter client nobody here
//! wrote, scripted in Lua; `bash .ci/deps/mail.sh` installs it): the script
//! `tests/milter/rules.lua` negotiates, sends macros and every stage of two
//! messages on one connection, and checks each reply and the end-of-message
//! modifications (the added header, the quarantine).
//!
//! It runs against every [`milter_filters::FilterUnderTest`] there is:
//! the libmilter and pymilter filters of `bench/milter/`, and
//! `forkpool milter` with the rules of its `--example`.

mod common;
#[path = "common/listening.rs"]
mod listening;
#[path = "common/milter_filters.rs"]
mod milter_filters;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::require_program;
use milter_filters::{filters_under_test, RunningFilter};

/// Runs `rules.lua` against `filter`, expecting messages handled by
/// `pid` if given; returns miltertest's exit success and its output.
fn run_script(miltertest: &Path, filter: &RunningFilter, pid: Option<i32>) -> (bool, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/milter/rules.lua");
    let out_path = common::temp_path("miltertest.out");
    let out = std::fs::File::create(&out_path).unwrap();
    let mut command = Command::new(miltertest);
    command.arg("-D").arg(format!("port={}", filter.port));
    if let Some(pid) = pid {
        command.arg("-D").arg(format!("pid={pid}"));
    }
    let mut child = command
        .arg("-s")
        .arg(&script)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("start miltertest");
    // Its own reads time out after 10 s; this bounds the rest.
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() >= deadline {
            common::kill9(child.id() as i32);
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let output = std::fs::read_to_string(&out_path).unwrap_or_default();
    let _ = std::fs::remove_file(&out_path);
    (status.is_some_and(|s| s.success()), output)
}

#[test]
fn miltertest_script_passes_against_the_filter() {
    let Some(miltertest) = require_program("miltertest", "run bash .ci/deps/mail.sh") else {
        return;
    };
    let Some(filters) = filters_under_test() else {
        return;
    };
    for under_test in &filters.all {
        let filter = under_test.start(&filters.dir);
        // The process that handles the conversation is the filter itself
        // or, for a pool, one of its children: the script checks which
        // only when it is the filter.
        let pid = (!under_test.is_pool()).then_some(filter.pid);
        let (ok, output) = run_script(&miltertest, &filter, pid);
        let name = under_test.name();
        assert!(
            ok,
            "{name}: miltertest failed:\n{output}\n{}",
            filter.output()
        );
        let handled_by: i32 = output
            .lines()
            .find_map(|l| l.strip_prefix("handled-by "))
            .and_then(|pid| pid.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name}: no handled-by line:\n{output}"));
        assert!(filter.owns(handled_by), "{name}: {handled_by}");
    }
}

#[test]
fn miltertest_script_fails_when_the_header_names_another_process() {
    let Some(miltertest) = require_program("miltertest", "run bash .ci/deps/mail.sh") else {
        return;
    };
    let Some(filters) = filters_under_test() else {
        return;
    };
    let filter = filters.all[0].start(&filters.dir);
    // Pid 1 handles no mail: the script's own checks must catch that.
    let (ok, output) = run_script(&miltertest, &filter, Some(1));
    assert!(!ok, "the script passed a wrong pid:\n{output}");
}
