//! forkpool_wsgi against docs/http.md: the shared HTTP corpus
//! (tests/http-corpus) with the echo app `clients/tests/echo_app.py`, and
//! what the corpus cannot show: the app's response checked, the body
//! deadline, and idle kept-alive connections giving way.

mod common;

#[path = "common/http_corpus.rs"]
mod http_corpus;
#[path = "common/http_server_checks.rs"]
mod http_server_checks;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::DemoPool;

fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients")
}

/// `forkpool run` with `workers` workers of `python3 -m forkpool_wsgi
/// APP`, from clients/tests; `extra` goes to forkpool_wsgi.
fn start_app(app: &str, workers: &str, extra: &[&str]) -> Option<DemoPool> {
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
        "handoff",
        "--min-children",
        workers,
        "--max-children",
        workers,
        "--min-spare",
        "0",
        "--max-spare",
        workers,
    ];
    let mut cmd = vec![python.to_str().unwrap(), "-m", "forkpool_wsgi", app];
    cmd.extend(["--no-access-log", "--head-timeout", "5"]);
    cmd.extend(extra);
    Some(DemoPool::launch(command, &args, &cmd, true))
}

#[test]
fn forkpool_wsgi_passes_the_whole_corpus() {
    let Some(pool) = start_app("echo_app:app", "4", &[]) else {
        return;
    };
    http_server_checks::assert_passes(&http_corpus::run_corpus(pool.addr));
}

/// Every case the app answers, again with the echo app behind
/// `wsgiref.validate` (PEP 3333's checker: a complaint is an exception, so
/// a 500). Not `OPTIONS *`: the checker wants PATH_INFO to start with `/`,
/// which PEP 3333 itself does not ask, and docs/http.md gives the app `*`.
#[test]
fn forkpool_wsgi_keeps_pep_3333_on_every_served_case() {
    let Some(pool) = start_app("echo_app:validated", "4", &[]) else {
        return;
    };
    let cases = http_corpus::load_cases();
    let served: Vec<&http_corpus::Case> = cases
        .iter()
        .filter(|case| case.responses.iter().all(|r| r.get("app").is_some()))
        .filter(|case| case.name != "target/options-asterisk")
        .collect();
    assert!(served.len() > 80, "only {} served cases", served.len());
    let failures: Vec<http_corpus::Failure> = served
        .into_iter()
        .filter_map(|case| {
            let what = http_corpus::run_case(pool.addr, case).err()?;
            let case = case.name.clone();
            Some(http_corpus::Failure { case, what })
        })
        .collect();
    http_server_checks::assert_passes(&failures);
}

/// A raw WSGI app that puts CRLF in a header value or in its status gets
/// a 500 with nothing of it sent, and a log line naming the header.
#[test]
fn an_app_cannot_split_its_response() {
    let Some(pool) = start_app("inject_app:app", "1", &[]) else {
        return;
    };
    http_server_checks::app_cannot_split_its_response(&pool);
}

/// A dripping body gets 408 at `--body-timeout` (2 s) and frees the worker.
#[test]
fn a_dripping_body_gets_408_at_the_body_timeout() {
    let Some(pool) = start_app("echo_app:app", "1", &["--body-timeout", "2"]) else {
        return;
    };
    http_server_checks::dripping_body_gets_408_at_the_body_timeout(&pool);
}

/// 100 idle kept-alive clients on 4 workers never make a new one wait.
#[test]
fn idle_kept_alive_clients_give_way_to_a_new_one() {
    let extra = ["--keepalive-timeout", "20"];
    let Some(pool) = start_app("echo_app:app", "4", &extra) else {
        return;
    };
    http_server_checks::idle_kept_alive_clients_give_way_to_a_new_one(&pool);
}
