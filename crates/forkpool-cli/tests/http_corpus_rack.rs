//! forkpool-rack against docs/http.md: the shared HTTP corpus
//! (tests/http-corpus) with the echo app `clients/tests/echo_config.ru`,
//! the valid cases again through `Rack::Lint`, and what the corpus cannot
//! show: the app's response checked, the body deadline, and idle kept-alive
//! connections giving way.

mod common;

#[path = "common/http_corpus.rs"]
mod http_corpus;
#[path = "common/http_server_checks.rs"]
mod http_server_checks;
#[path = "common/psgi_support.rs"]
mod psgi_support;
#[path = "common/rack_support.rs"]
mod rack_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::DemoPool;

fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients")
}

/// True if Ruby and Rack are installed (else, under CI, a failure).
fn require_rack() -> bool {
    let found = Command::new("ruby")
        .args(["-e", "require 'rack'; require 'json'"])
        .output()
        .is_ok_and(|o| o.status.success());
    common::require(found, "ruby with Rack", "run bash .ci/deps/ruby.sh")
}

/// `forkpool run` with `workers` workers of `forkpool-rack CONFIG`, from
/// clients/tests; `extra` goes to forkpool-rack, `env` to the workers.
fn start_app(
    config: &str,
    workers: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Option<DemoPool> {
    if !require_rack() {
        return None;
    }
    let ruby_dir = clients_dir().join("ruby");
    let server = ruby_dir.join("forkpool-rack");
    let mut command = Command::new(common::forkpool_bin());
    command
        .arg("run")
        .current_dir(clients_dir().join("tests"))
        .envs(env.iter().copied());
    let mut args = vec!["--ping-timeout", "20s", "--dispatch", "handoff"];
    args.extend(rack_support::held(workers));
    let mut cmd = vec![
        "ruby",
        "-I",
        ruby_dir.to_str().unwrap(),
        server.to_str().unwrap(),
        "--no-access-log",
        "--head-timeout",
        "5",
    ];
    cmd.extend(extra);
    cmd.push(config);
    Some(DemoPool::launch(command, &args, &cmd, true))
}

#[test]
fn forkpool_rack_passes_the_whole_corpus() {
    let Some(pool) = start_app("echo_config.ru", "4", &[], &[]) else {
        return;
    };
    http_server_checks::assert_passes(&http_corpus::run_corpus(pool.addr));
}

/// The valid cases again, with the echo app behind `Rack::Lint` (the Rack
/// specification's checker): a complaint is an exception, so a 500.
#[test]
fn forkpool_rack_keeps_the_rack_spec_on_the_valid_cases() {
    let lint = [("FORKPOOL_ECHO_LINT", "1")];
    let Some(pool) = start_app("echo_config.ru", "4", &[], &lint) else {
        return;
    };
    http_server_checks::assert_passes(&http_server_checks::run_class(pool.addr, "valid"));
}

/// A Rack app that puts CRLF in a header value or in its status gets
/// a 500 with nothing of it sent, and a log line naming the header.
#[test]
fn an_app_cannot_split_its_response() {
    let Some(pool) = start_app("inject_config.ru", "1", &[], &[]) else {
        return;
    };
    http_server_checks::app_cannot_split_its_response(&pool);
}

/// A dripping body gets 408 at `--body-timeout` (2 s) and frees the worker.
#[test]
fn a_dripping_body_gets_408_at_the_body_timeout() {
    let Some(pool) = start_app("echo_config.ru", "1", &["--body-timeout", "2"], &[]) else {
        return;
    };
    http_server_checks::dripping_body_gets_408_at_the_body_timeout(&pool);
}

/// 100 idle kept-alive clients on 4 workers never make a new one wait.
#[test]
fn idle_kept_alive_clients_give_way_to_a_new_one() {
    let extra = ["--keepalive-timeout", "20", "--keepalive-turn", "0"];
    let Some(pool) = start_app("echo_config.ru", "4", &extra, &[]) else {
        return;
    };
    http_server_checks::idle_kept_alive_clients_give_way_to_a_new_one(&pool);
}

/// The one-match reading of a head and the long way read every head alike
/// (`clients/ruby/test/http_head_test.rb`: chosen heads, and 2,000 put
/// together at random from good and bad pieces, seeded).
#[test]
fn a_head_reads_alike_in_one_match_and_the_long_way() {
    if !require_rack() {
        return;
    }
    rack_support::minitest(
        "test/http_head_test.rb",
        "2 runs, 2009 assertions, 0 failures, 0 errors",
    );
}

/// A response's header lines (`clients/ruby/test/rack_response_test.rb`):
/// a name remembers the line its last value made, and what goes out is
/// still what the app gave this time (a changed value, one changed in
/// place, a Content-Length, a bad value after a good one).
#[test]
fn a_remembered_header_line_never_stands_for_another_value() {
    if !require_rack() {
        return;
    }
    rack_support::minitest(
        "test/rack_response_test.rb",
        "5 runs, 36 assertions, 0 failures, 0 errors",
    );
}
