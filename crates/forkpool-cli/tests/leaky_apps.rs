//! Apps that leak a descriptor on every request (clients/tests/leak_app.*),
//! served kept alive by forkpool_wsgi, forkpool-psgi and forkpool-rack in
//! a one-worker pool under `prlimit --nofile=64`. A connection that stays
//! open for all its requests would let the leak fill the table before the
//! check after each connection ever ran: the servers look every 8th
//! request too, and the worker then leaves (that answer says `Connection:
//! close`) before the app's opens fail (docs/protocol.md, "Running out of
//! descriptors"). Real supervisor, real servers, loopback only.

mod common;
#[path = "common/psgi_support.rs"]
mod psgi_support;
#[path = "common/rack_support.rs"]
mod rack_support;
#[path = "common/wsgi_support.rs"]
mod wsgi_support;

use std::collections::BTreeSet;
use std::net::TcpStream;
use std::time::Duration;

use common::{killed_by, total, DemoPool};
use wsgi_support::{clients_dir, connect, request};

/// `clients/tests`, where the leaking apps are.
const TEST_APPS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../clients/tests");

/// Requests sent on kept-alive connections: a worker leaks about 40
/// descriptors before its table reaches the reserve under a limit of 64.
const REQUESTS: usize = 100;

/// Runs `cmd` under `prlimit --nofile=64` in a one-worker `handoff` pool
/// and sends [`REQUESTS`] requests, each connection kept alive until the
/// server closes it: every answer must be `200`, from two workers or
/// more, the ones that went retired (`X`), none died or was killed.
fn a_leaking_app_kept_alive_never_fails(cmd: &[&str]) {
    let mut limited = vec!["prlimit", "--nofile=64:64"];
    limited.extend_from_slice(cmd);
    let mut args = vec!["--dispatch", "handoff", "--ping-timeout", "20s"];
    args.extend_from_slice(&common::ONE_CHILD);
    let pool = DemoPool::start_run(&args, &limited);
    let mut conn: Option<TcpStream> = None;
    let mut pids = BTreeSet::new();
    let mut connections = 0;
    for n in 0..REQUESTS {
        let c = conn.get_or_insert_with(|| {
            connections += 1;
            connect(pool.addr)
        });
        let reply = request(c, "GET / HTTP/1.1\r\nHost: leak.test\r\n\r\n");
        let body = String::from_utf8_lossy(&reply.body).to_string();
        assert_eq!(
            reply.status,
            200,
            "request {n}: {body}\n{}",
            pool.stderr.dump()
        );
        pids.insert(body.trim().to_string());
        if reply.header("connection").as_deref() == Some("close") {
            conn = None;
        }
    }
    assert!(
        pids.len() >= 2,
        "one worker served all {REQUESTS}: {pids:?}"
    );
    assert!(
        connections < REQUESTS / 4,
        "{connections} connections: not kept alive"
    );
    let status = pool
        .wait_status(Duration::from_secs(20), |s| total(s, "retired") >= 1)
        .unwrap_or_else(|| panic!("no worker retired: {}", pool.status()));
    assert_eq!(total(&status, "died"), 0, "{status}");
    assert_eq!(total(&status, "killed"), 0, "{status}");
    assert_eq!(killed_by(&status, "misbehaved"), 0, "{status}");
}

#[test]
fn forkpool_wsgi_leaves_before_a_leaking_app_fills_the_table() {
    let path = format!("PYTHONPATH={}", clients_dir().display());
    a_leaking_app_kept_alive_never_fails(&[
        "env",
        &path,
        "python3",
        "-m",
        "forkpool_wsgi",
        "--chdir",
        TEST_APPS,
        "leak_app:app",
        "--no-access-log",
    ]);
}

#[test]
fn forkpool_psgi_leaves_before_a_leaking_app_fills_the_table() {
    let app = format!("{TEST_APPS}/leak_app.psgi");
    a_leaking_app_kept_alive_never_fails(&[
        "perl",
        psgi_support::PSGI_SERVER,
        "--no-access-log",
        // Its default (10) would end each connection, and have the
        // check after each connection catch the leak, long before.
        "--max-keepalive-requests",
        "1000",
        &app,
    ]);
}

#[test]
fn forkpool_rack_leaves_before_a_leaking_app_fills_the_table() {
    if !rack_support::require_sinatra() {
        return;
    }
    let app = format!("{TEST_APPS}/leak_config.ru");
    a_leaking_app_kept_alive_never_fails(&[
        "ruby",
        "-I",
        rack_support::RUBY_DIR,
        rack_support::RACK_SERVER,
        "--no-access-log",
        &app,
    ]);
}
