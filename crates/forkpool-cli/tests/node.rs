//! clients/node: an existing Node request handler served by
//! `forkpool run --dispatch none -- node clients/node/forkpool-node.js
//! APP.js`, with the pool's own listen backlog, a graceful quit, a clear
//! refusal of the modes Node's public API cannot serve, and a package that
//! `npm pack` builds offline.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{get, send, DemoPool};

const INSTALL: &str = "bash .ci/deps/node.sh";

fn clients() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients")
}

fn helper() -> String {
    clients()
        .join("node/forkpool-node.js")
        .display()
        .to_string()
}

fn app() -> String {
    clients().join("tests/hello_app.js").display().to_string()
}

/// `forkpool run --dispatch none` of two Node workers, with `extra`.
fn start(extra: &[&str]) -> Option<DemoPool> {
    let node = common::require_program("node", INSTALL)?;
    let mut args = vec!["--dispatch", "none", "--min-children", "2"];
    args.extend_from_slice(extra);
    let cmd = [node.to_str().unwrap(), &helper(), &app()];
    Some(DemoPool::start_run(&args, &cmd))
}

/// Node calls listen(2) again on the socket it is given: it passes the
/// pool's backlog (`FORKPOOL_BACKLOG`), which the kernel then still shows.
#[test]
fn a_node_app_serves_and_keeps_the_pools_backlog() {
    let Some(pool) = start(&["--backlog", "77"]) else {
        return;
    };
    for _ in 0..5 {
        let r = get(pool.addr, "/").expect("request");
        assert_eq!((r.status, r.body.as_str()), (200, "hello\n"));
    }
    // Sampled by the supervisor from the kernel (inet_diag), once a second.
    let status = pool.wait_status(Duration::from_secs(10), |s| {
        s["queues"][0]["backlog"].as_u64().is_some()
    });
    let status = status.unwrap_or_else(|| panic!("no queue sampled: {}", pool.status()));
    assert_eq!(status["queues"][0]["backlog"], 77, "{status}");
}

/// SIGTERM to the supervisor: the workers stop accepting, the request in
/// progress is answered, and the pool exits cleanly.
#[test]
fn a_node_worker_quits_gracefully() {
    let Some(mut pool) = start(&["--shutdown-timeout", "10s"]) else {
        return;
    };
    let mut slow = send(pool.addr, "/?sleep_ms=1500");
    // The app says on stderr when it has the request.
    assert!(
        pool.stderr.wait_for(
            "worker stderr: request /?sleep_ms=1500",
            Duration::from_secs(10)
        ),
        "{}",
        pool.stderr.dump()
    );
    pool.signal(libc::SIGTERM);
    let mut answer = String::new();
    slow.read_to_string(&mut answer).expect("read the answer");
    let r = common::parse_response(&answer).expect("a whole response");
    assert_eq!((r.status, r.body.as_str()), (200, "hello\n"));
    let exit = pool
        .wait_exit(Duration::from_secs(10))
        .expect("the pool exits");
    assert!(exit.success(), "{exit}\n{}", pool.stderr.dump());
}

/// Outside `none` mode the helper refuses at once, saying which mode to
/// use, instead of serving badly.
#[test]
fn the_helper_refuses_the_modes_node_cannot_serve() {
    let Some(node) = common::require_program("node", INSTALL) else {
        return;
    };
    let cases: [(&[(&str, &str)], &str); 4] = [
        (&[("FORKPOOL_DISPATCH", "handoff")], "--dispatch none"),
        (
            &[
                ("FORKPOOL_DISPATCH", "handoff"),
                ("FORKPOOL_KERNEL_DISPATCH", "1"),
            ],
            "kernel dispatch",
        ),
        (&[("FORKPOOL_DISPATCH", "order")], "--dispatch none"),
        (&[("FORKPOOL_TEMPLATE_FD", "4")], "without --preload"),
    ];
    for (env, says) in cases {
        let out = Command::new(&node)
            .args([helper(), app()])
            .env_remove("FORKPOOL_DISPATCH")
            .envs(env.iter().copied())
            .output()
            .expect("run node");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{env:?}: {stderr}");
        assert!(stderr.contains(says), "{env:?}: {stderr}");
    }
}

/// The package builds with `npm pack`, offline, and holds the helper.
#[test]
fn the_package_packs_offline() {
    let Some(npm) = common::require_program("npm", INSTALL) else {
        return;
    };
    let cache = common::temp_path("npm-cache");
    let out = Command::new(npm)
        .args(["pack", "--dry-run", "--json", "--offline"])
        .current_dir(clients().join("node"))
        .env("npm_config_cache", &cache)
        .env("npm_config_update_notifier", "false")
        .output()
        .expect("run npm");
    let _ = std::fs::remove_dir_all(&cache);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let packed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("npm's JSON");
    let files: Vec<&str> = packed[0]["files"]
        .as_array()
        .expect("files")
        .iter()
        .filter_map(|f| f["path"].as_str())
        .collect();
    for wanted in [
        "package.json",
        "forkpool.js",
        "forkpool-node.js",
        "README.md",
    ] {
        assert!(files.contains(&wanted), "{wanted} not packed: {files:?}");
    }
}
