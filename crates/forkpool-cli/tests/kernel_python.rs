//! The Python helper in `--dispatch kernel` (issue 26): `forkpool_worker`
//! maps the scoreboard with `mmap` and `ctypes`, says `K` and serves its
//! own socket. The example worker (clients/python/example_http_worker.py)
//! passes the cases every helper passes (`common/kernel_helper_cases.rs`);
//! a worker not told its share is recycled by `Q`; `forkpool_wsgi` serves
//! in kernel dispatch (a small WSGI app, clients/tests/slot_app.py, and the
//! Flask test app), keep-alive included, and gives way on the overflow.

#[path = "common/bench_bins.rs"]
mod bench_bins;
mod common;
#[path = "common/example_workers.rs"]
mod example_workers;
#[path = "common/kernel_helper_cases.rs"]
mod kernel_helper_cases;
#[path = "common/wsgi_support.rs"]
mod wsgi_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{send, total, DemoPool};
use example_workers::PYTHON_WORKER;
use kernel_helper_cases::{
    answer, assert_clean, assert_reconnects_stayed, kernel_pool, SupervisorStopped, PATIENCE,
};
use wsgi_support::{apps_dir, clients_dir, connect, request, venv_python};

const WORKER: [&str; 2] = ["python3", PYTHON_WORKER];

kernel_helper_cases::every_helper_case!(|case: fn(&[&str])| case(&WORKER), with_preload);

/// A worker not told its share (FORKPOOL_MAX_REQUESTS removed) is sent
/// `Q` by the supervisor, which reads what it served on the board (at
/// least every 100 ms): it exits and is replaced, and every request is
/// answered. Requests go on until three workers have answered.
#[test]
fn a_worker_not_told_its_share_is_recycled_by_quit() {
    let extra = ["--max-requests-per-child", "5"];
    let cmd = [
        "env",
        "-u",
        "FORKPOOL_MAX_REQUESTS",
        "python3",
        PYTHON_WORKER,
    ];
    let Some(pool) = kernel_pool(1, &extra, &cmd) else {
        return;
    };
    let deadline = Instant::now() + PATIENCE;
    let mut pids: Vec<i32> = Vec::new();
    while pids.len() < 3 && Instant::now() < deadline {
        let r = answer(send(pool.addr, "/")).expect("every request is answered");
        assert_eq!(r.status, 200);
        let pid = r.pid.expect("pid header");
        if pids.last() != Some(&pid) {
            pids.push(pid);
        }
    }
    assert_eq!(pids.len(), 3, "no worker recycled: {pids:?}");
    let status = pool.status();
    assert!(total(&status, "retired") >= 2, "{status}");
    assert_clean(&status);
}

/// `python3 -m forkpool_wsgi --chdir DIR APP ARGS`, the helper on
/// PYTHONPATH.
fn wsgi(python: &str, dir: &str, app: &str, args: &[&str]) -> Vec<String> {
    let path = format!("PYTHONPATH={}", clients_dir().display());
    let mut cmd: Vec<String> = vec!["env".into(), path, python.into()];
    cmd.extend(
        [
            "-m",
            "forkpool_wsgi",
            "--chdir",
            dir,
            app,
            "--no-access-log",
        ]
        .map(String::from),
    );
    cmd.extend(args.iter().map(|a| a.to_string()));
    cmd
}

/// forkpool_wsgi on clients/tests/slot_app.py (it names the worker in
/// `X-Forkpool-Slot` and `X-Forkpool-Pid`).
fn slot_app(args: &[&str]) -> Vec<String> {
    let dir = clients_dir().join("../tests").display().to_string();
    wsgi("python3", &dir, "slot_app:app", args)
}

fn as_strs(cmd: &[String]) -> Vec<&str> {
    cmd.iter().map(String::as_str).collect()
}

/// With the supervisor stopped, ten requests on ten connections and five
/// on one kept-alive connection are all served by slot 0, the kept-alive
/// ones by one process.
#[test]
fn forkpool_wsgi_serves_slot_zero_keep_alive_included() {
    let cmd = slot_app(&[]);
    let Some(pool) = kernel_pool(2, &[], &as_strs(&cmd)) else {
        return;
    };
    let (slots, kept) = {
        let _stopped = SupervisorStopped::new(&pool);
        let slots: Vec<Option<usize>> = (0..10)
            .map(|_| answer(send(pool.addr, "/")).map_or(None, |r| r.slot))
            .collect();
        let mut conn = connect(pool.addr);
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let kept: Vec<_> = (0..5)
            .map(|_| request(&mut conn, "GET / HTTP/1.1\r\nHost: t\r\n\r\n"))
            .map(|r| {
                (
                    r.header("x-forkpool-slot"),
                    r.header("x-forkpool-pid"),
                    r.header("connection"),
                )
            })
            .collect();
        (slots, kept)
    };
    assert_eq!(slots, vec![Some(0); 10], "{}", pool.stderr.dump());
    assert_eq!(kept[0].0.as_deref(), Some("0"), "{kept:?}");
    assert_eq!(kept[0].2, None, "kept alive: {kept:?}");
    assert!(kept.iter().all(|k| *k == kept[0]), "one worker: {kept:?}");
    let status = pool
        .wait_status(PATIENCE, |s| total(s, "accepted") >= 11)
        .unwrap_or_else(|| panic!("the board's counts never reached status: {}", pool.status()));
    assert_eq!(total(&status, "accepted"), 11, "{status}");
    assert_clean(&status);
}

/// A client told `Connection: close` that reconnects the moment it has
/// the answer, without waiting for the close, lands on the same worker
/// every time: forkpool_wsgi goes idle just before a connection's last
/// answer goes out (`Worker.ending_connection`). Going idle after the
/// close, the reconnect races the worker's finish and lands on slot 1 (or
/// the overflow). Exec'd and under `--preload`, the supervisor stopped.
#[test]
fn forkpool_wsgi_client_reconnecting_at_once_finds_its_worker_idle() {
    const ROUNDS: usize = 100;
    let cmd = slot_app(&["--max-requests-per-connection", "1"]);
    for extra in [&[][..], &["--preload"][..]] {
        let Some(pool) = kernel_pool(2, extra, &as_strs(&cmd)) else {
            return;
        };
        let answers: Vec<(Option<String>, Option<String>)> = {
            let _stopped = SupervisorStopped::new(&pool);
            (0..ROUNDS)
                .map(|_| {
                    let mut conn = connect(pool.addr);
                    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                    let r = request(&mut conn, "GET / HTTP/1.1\r\nHost: t\r\n\r\n");
                    (r.header("x-forkpool-slot"), r.header("connection"))
                })
                .collect()
        };
        assert_reconnects_stayed(&pool, &format!("{extra:?}"), &answers);
    }
}

/// One worker holds an idle kept-alive connection (busy on the board, a
/// keep-alive timeout of two minutes), so a new client lands on the
/// overflow: the worker sees it there, gives way (closes the kept-alive
/// connection without an answer) and the new client is served.
#[test]
fn forkpool_wsgi_gives_way_on_the_overflow() {
    let cmd = slot_app(&["--keepalive-turn", "0", "--keepalive-timeout", "120"]);
    let Some(pool) = kernel_pool(1, &[], &as_strs(&cmd)) else {
        return;
    };
    let mut kept = connect(pool.addr);
    let first = request(&mut kept, "GET / HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!((first.status, first.header("connection")), (200, None));
    let served = answer(send(pool.addr, "/"))
        .unwrap_or_else(|e| panic!("the waiting client: {e}\n{}", pool.stderr.dump()));
    assert_eq!(served.status, 200);
    kept.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut rest = Vec::new();
    let ended = kept.read_to_end(&mut rest);
    assert!(ended.is_ok() && rest.is_empty(), "{ended:?} {rest:?}");
    assert_clean(&pool.status());
}

/// The Flask test app in kernel dispatch, the supervisor stopped: new
/// connections, then keep-alive and a body, all to the slot 0 worker.
#[test]
fn flask_app_in_kernel_dispatch() {
    let Some(python) = venv_python() else { return };
    let cmd = wsgi(
        &python,
        &apps_dir().display().to_string(),
        "flask_app:app",
        &[],
    );
    let Some(pool) = kernel_pool(2, &[], &as_strs(&cmd)) else {
        return;
    };
    let slot0 = kernel_helper_cases::pid_in_slot(&pool.status(), 0).to_string();
    let pids = {
        let _stopped = SupervisorStopped::new(&pool);
        // Each answer read to the close, which comes once the worker is
        // idle on the board again.
        let mut pids: Vec<Vec<u8>> = (0..5).map(|_| pid_on_a_new_connection(&pool)).collect();
        let mut conn = connect(pool.addr);
        pids.extend(
            (0..3).map(|_| request(&mut conn, "GET /pid HTTP/1.1\r\nHost: t\r\n\r\n").body),
        );
        let posted = request(
            &mut conn,
            "POST /digest HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello",
        );
        assert!(posted.body.starts_with(b"5 2cf24dba"), "{posted:?}");
        pids
    };
    assert!(
        pids.iter().all(|p| p == slot0.as_bytes()),
        "{slot0} {pids:?}\n{}",
        pool.stderr.dump()
    );
    let status = pool
        .wait_status(PATIENCE, |s| total(s, "accepted") >= 6)
        .unwrap_or_else(|| panic!("the board's counts never reached status: {}", pool.status()));
    assert_eq!(total(&status, "accepted"), 6, "{status}");
    assert_clean(&status);
}

/// `GET /pid` on a new connection, read to the close (which comes once
/// the worker is idle again).
fn pid_on_a_new_connection(pool: &DemoPool) -> Vec<u8> {
    let mut conn: TcpStream = connect(pool.addr);
    conn.write_all(b"GET /pid HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    let r = wsgi_support::read_response(&mut conn, false);
    let rest = conn.read_to_end(&mut Vec::new());
    assert_eq!(rest.ok(), Some(0));
    r.body
}
