//! Helpers for `tests/rack.rs`: a pool of `forkpool-rack` workers serving
//! the Sinatra test app, and what /proc says about its processes.
#![allow(dead_code)]

use std::process::Command;
use std::time::Duration;

use crate::common::DemoPool;

/// The Ruby helper's directory (`ruby -I` it).
pub const RUBY_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../clients/ruby");
/// The Rack server's command.
pub const RACK_SERVER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../clients/ruby/forkpool-rack"
);
/// The Sinatra app the tests serve (every request through Rack::Lint).
pub const SINATRA_APP: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../clients/ruby/test/sinatra_app.ru"
);

/// Runs the minitest file `test` (a path under clients/ruby) with the
/// helper on the load path; panics, with its output, unless it exits 0
/// having printed `summary` (runs, assertions, no failure or error).
pub fn minitest(test: &str, summary: &str) {
    let out = Command::new("ruby")
        .args(["-I", RUBY_DIR, &format!("{RUBY_DIR}/{test}")])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(summary),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Pool options for exactly `n` workers, held.
pub fn held(n: &str) -> [&str; 8] {
    [
        "--min-children",
        n,
        "--max-children",
        n,
        "--min-spare",
        "0",
        "--max-spare",
        n,
    ]
}

/// How long a worker may take to start or a state to be reached on a
/// loaded machine; a quiet one never waits this long.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// True if Ruby, Rack and Sinatra are installed; without them the test
/// must return without running (see `common::require`: under CI a failure).
pub fn require_sinatra() -> bool {
    let found = Command::new("ruby")
        .args(["-e", "require 'rack'; require 'sinatra/base'"])
        .output()
        .is_ok_and(|o| o.status.success());
    crate::common::require(
        found,
        "ruby with Rack and Sinatra",
        "run bash .ci/deps/ruby.sh",
    )
}

/// `ruby -I clients/ruby clients/ruby/forkpool-rack [SERVER_ARGS] app.ru`.
pub fn rack_command<'a>(server_args: &[&'a str]) -> Vec<&'a str> {
    let mut cmd = vec!["ruby", "-I", RUBY_DIR, RACK_SERVER];
    cmd.extend_from_slice(server_args);
    cmd.push(SINATRA_APP);
    cmd
}

/// A pool in dispatch MODE (`--preload` if asked) running CMD, with
/// POOL_ARGS or else exactly one worker, once `workers` workers are idle.
pub fn start_with(mode: &str, preload: bool, pool_args: &[&str], cmd: &[&str]) -> DemoPool {
    let mut args = vec!["--ping-timeout", "20s", "--dispatch", mode];
    if preload {
        args.push("--preload");
    }
    if pool_args.is_empty() {
        args.extend_from_slice(&crate::common::ONE_CHILD);
    } else {
        args.extend_from_slice(pool_args);
    }
    let pool = DemoPool::start_run(&args, cmd);
    let workers = if pool_args.is_empty() { 1 } else { 0 };
    assert!(
        wait_idle(&pool, workers),
        "the workers never became idle:\n{}",
        pool.stderr.dump()
    );
    pool
}

/// One worker serving the Sinatra app with SERVER_ARGS.
pub fn start(mode: &str, preload: bool, server_args: &[&str]) -> DemoPool {
    start_with(mode, preload, &[], &rack_command(server_args))
}

/// Polls `forkpool status` until at least `n` workers are idle, none busy
/// or starting, and the template (if any) is ready.
pub fn wait_idle(pool: &DemoPool, n: u64) -> bool {
    pool.wait_status(PATIENCE, |s| {
        let templates = s["templates"].as_array();
        s["idle"].as_u64().unwrap_or(0) >= n.max(1)
            && s["busy"] == 0
            && s["starting"] == 0
            && templates.is_none_or(|t| t.iter().all(|t| t["state"] == "ready"))
    })
    .is_some()
}

/// The pids of the pool's workers, by slot, from `forkpool status`.
pub fn worker_pids(pool: &DemoPool) -> Vec<i32> {
    worker_pids_in(&pool.status())
}

/// The pids of the workers in a status snapshot, by slot. (A slot being
/// forked from a template shows pid 0 until it is verified.)
pub fn worker_pids_in(status: &serde_json::Value) -> Vec<i32> {
    status["slots"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|slot| slot["pid"].as_i64())
        .filter(|pid| *pid > 0)
        .map(|pid| pid as i32)
        .collect()
}

/// The template's pid, 0 without one.
pub fn template_pid(status: &serde_json::Value) -> i32 {
    // While a reload rolls, the old template is listed too (first, until
    // it has exited): the newest generation's is the one in charge.
    status["templates"]
        .as_array()
        .and_then(|all| all.iter().max_by_key(|t| t["generation"].as_u64()))
        .and_then(|t| t["pid"].as_i64())
        .unwrap_or(0) as i32
}

/// The parent of `pid`, from /proc.
pub fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// What each descriptor of `pid` points at (`socket:[..]`, a path, ...).
pub fn fd_targets(pid: i32) -> Vec<(i32, String)> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(|e| {
                let e = e.ok()?;
                let fd = e.file_name().to_str()?.parse().ok()?;
                let target = std::fs::read_link(e.path()).ok()?;
                Some((fd, target.to_string_lossy().into_owned()))
            })
            .collect()
        })
        .unwrap_or_default()
}
