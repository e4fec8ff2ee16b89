//! forkpool_wsgi against the shared HTTP corpus (tests/http-corpus, rules
//! in docs/http.md), serving the echo app `clients/tests/echo_app.py`.

mod common;

#[path = "common/http_corpus.rs"]
mod http_corpus;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::DemoPool;

fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients")
}

/// `forkpool run` with four workers of `python3 -m forkpool_wsgi APP`,
/// from clients/tests; `extra` goes to forkpool_wsgi.
pub fn start_echo(app: &str, extra: &[&str]) -> Option<DemoPool> {
    let python = common::require_program("python3", "apt-get install python3")?;
    let mut command = Command::new(common::forkpool_bin());
    command
        .arg("run")
        .current_dir(clients_dir().join("tests"))
        .env("PYTHONPATH", clients_dir().join("python"));
    let args = [
        "--ping-timeout",
        "20s",
        "--dispatch",
        "order",
        "--min-children",
        "4",
        "--max-children",
        "4",
    ];
    let mut cmd = vec![python.to_str().unwrap(), "-m", "forkpool_wsgi", app];
    cmd.extend(["--no-access-log", "--head-timeout", "5"]);
    cmd.extend(extra);
    Some(DemoPool::launch(command, &args, &cmd, true))
}

fn assert_passes(failures: &[http_corpus::Failure]) {
    let report: Vec<String> = failures.iter().map(|f| f.to_string()).collect();
    assert!(
        failures.is_empty(),
        "{} corpus cases failed ({:?}):\n{}",
        failures.len(),
        http_corpus::failures_by_class(failures),
        report.join("\n")
    );
}

#[test]
fn forkpool_wsgi_passes_the_whole_corpus() {
    let Some(pool) = start_echo("echo_app:app", &[]) else {
        return;
    };
    assert_passes(&http_corpus::run_corpus(pool.addr));
}

/// The valid cases again, with the echo app behind `wsgiref.validate`
/// (PEP 3333's checker): a complaint is an exception, so a 500.
#[test]
fn forkpool_wsgi_keeps_pep_3333_on_the_valid_cases() {
    let Some(pool) = start_echo("echo_app:validated", &[]) else {
        return;
    };
    let failures: Vec<http_corpus::Failure> = http_corpus::load_cases()
        .iter()
        .filter(|case| case.class() == "valid")
        .filter_map(|case| {
            let what = http_corpus::run_case(pool.addr, case).err()?;
            let case = case.name.clone();
            Some(http_corpus::Failure { case, what })
        })
        .collect();
    assert_passes(&failures);
}
