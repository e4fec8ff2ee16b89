//! `python3 -m forkpool_wsgi`: a real Flask app served by the command the
//! README gives, checked over raw TCP for the HTTP/1.1 cases, and the
//! Python helper's own unit tests and packaging.

mod common;

#[path = "common/wsgi_support.rs"]
mod wsgi_support;

#[path = "common/http_corpus.rs"]
mod http_corpus;

use std::io::Write;
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use common::DemoPool;
use wsgi_support::{
    clients_dir, connect, drip_head, read_response, request, slot_pids, status_pid_of, venv_python,
    wait_status, worker_peak_rss_kib,
};

/// `forkpool run --listen 127.0.0.1:0 ... -- python -m forkpool_wsgi
/// flask_app:app` from the test apps' directory, as README shows it.
fn start_flask(dispatch: &str, python: &str) -> DemoPool {
    let mut command = Command::new(common::forkpool_bin());
    command
        .arg("run")
        .current_dir(wsgi_support::apps_dir())
        .env("PYTHONPATH", clients_dir());
    let args = [
        "--ping-timeout",
        "20s",
        "--dispatch",
        dispatch,
        "--min-children",
        "2",
        "--min-spare",
        "1",
        "--max-spare",
        "2",
        "--max-children",
        "4",
    ];
    let cmd = [
        python,
        "-m",
        "forkpool_wsgi",
        "flask_app:app",
        "--head-timeout",
        "2",
    ];
    DemoPool::launch(command, &args, &cmd, true)
}

fn flask_app_over_http(dispatch: &str) {
    let Some(python) = venv_python() else { return };
    let pool = start_flask(dispatch, &python);
    let addr = pool.addr;

    // GET, then more requests on the same connection: one worker serves them.
    let mut conn = connect(addr);
    let hello = request(&mut conn, "GET / HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!((hello.status, hello.body.as_slice()), (200, &b"hello"[..]));
    let pids: Vec<Vec<u8>> = (0..3)
        .map(|_| request(&mut conn, "GET /pid HTTP/1.1\r\nHost: t\r\n\r\n").body)
        .collect();
    assert!(
        pids.iter().all(|p| p == &pids[0]),
        "keep-alive moved: {pids:?}"
    );
    // HEAD: the length of the GET, no body (the next answer on the same
    // connection would be garbled if one had been sent).
    let head = request(&mut conn, "HEAD / HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(head.status, 200);
    assert_eq!(head.header("content-length").as_deref(), Some("5"));
    assert!(head.body.is_empty());
    assert_eq!(
        request(&mut conn, "GET / HTTP/1.1\r\nHost: t\r\n\r\n").body,
        b"hello"
    );
    drop(conn);

    // A chunked body, read by the app as a stream.
    let mut conn = connect(addr);
    let chunked = request(
        &mut conn,
        "POST /digest HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n\
         6\r\nhello \r\n5\r\nworld\r\n0\r\n\r\n",
    );
    let text = String::from_utf8(chunked.body).unwrap();
    assert!(
        text.starts_with("11 b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9 "),
        "{text}"
    );

    // Expect: 100-continue: the interim answer comes before the body is sent.
    conn.write_all(
        b"POST /digest HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\nExpect: 100-continue\r\n\r\n",
    )
    .unwrap();
    let interim = read_response(&mut conn, false);
    assert_eq!(interim.status, 100);
    conn.write_all(b"hello world").unwrap();
    let after = read_response(&mut conn, false);
    assert_eq!(after.status, 200);
    assert!(after.body.starts_with(b"11 b94d27b9"));
    drop(conn);

    // A large Content-Length body is streamed: the worker's peak memory
    // stays far below the body's size.
    const BIG: usize = 96 << 20;
    let mut conn = connect(addr);
    write!(
        conn,
        "POST /digest HTTP/1.1\r\nHost: t\r\nContent-Length: {BIG}\r\n\r\n"
    )
    .unwrap();
    let block = vec![b'x'; 1 << 16];
    for _ in 0..BIG / block.len() {
        conn.write_all(&block).unwrap();
    }
    let big = read_response(&mut conn, false);
    let text = String::from_utf8(big.body).unwrap();
    let fields: Vec<&str> = text.split(' ').collect();
    assert_eq!(fields[0], BIG.to_string(), "{text}");
    let pid: i32 = fields[2].parse().unwrap();
    assert!(
        slot_pids(&pool.status()).contains(&pid),
        "pid {pid} not in status"
    );
    let peak = worker_peak_rss_kib(pid);
    assert!(
        peak < (BIG as u64 / 1024) / 2,
        "worker {pid} peaked at {peak} KiB for a {BIG}-byte body"
    );
    drop(conn);

    // An app that raises: a 500, and the same workers go on serving.
    let before = pool.status();
    let mut conn = connect(addr);
    let failed = request(&mut conn, "GET /raise HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(failed.status, 500);
    drop(conn);
    // Its traceback reaches the supervisor's log, which names the slot.
    assert!(
        pool.stderr.wait_for_all(
            &["Traceback (most recent call last)", "slot="],
            Duration::from_secs(5)
        ) && pool.stderr.wait_for_all(
            &["RuntimeError: the test app fails on purpose", "slot="],
            Duration::from_secs(5)
        ),
        "no traceback with a slot in the log:\n{}",
        pool.stderr.dump()
    );
    let mut conn = connect(addr);
    assert_eq!(
        request(&mut conn, "GET / HTTP/1.1\r\nHost: t\r\n\r\n").body,
        b"hello"
    );
    drop(conn);
    let after = pool.status();
    assert_eq!(after["totals"]["died"], 0, "{after}");
    // The pool may grow a spare meanwhile (it is adaptive), but every worker
    // that was there before the exception still is.
    let alive = slot_pids(&after);
    assert!(
        slot_pids(&before).iter().all(|pid| alive.contains(pid)),
        "a worker went away: before {before}, after {after}"
    );

    // A streaming response without a length is sent chunked.
    let mut conn = connect(addr);
    let streamed = request(&mut conn, "GET /stream HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(
        streamed.header("transfer-encoding").as_deref(),
        Some("chunked")
    );
    assert_eq!(
        streamed.body,
        b"part 0\npart 1\npart 2\npart 3\npart 4\n".to_vec()
    );
    drop(conn);

    // A malformed request: 400 and the connection closed.
    let mut conn = connect(addr);
    let bad = request(
        &mut conn,
        "GET / HTTP/1.1\r\nHost: t\r\nno colon here\r\n\r\n",
    );
    assert_eq!(bad.status, 400);
    assert_eq!(bad.header("connection").as_deref(), Some("close"));
    drop(conn);

    // A client dripping its head a byte at a time: 408 at the head
    // deadline (2 s), and the worker is idle again.
    let mut conn = connect(addr);
    assert!(
        drip_head(
            &mut conn,
            Duration::from_millis(200),
            Duration::from_secs(15)
        ),
        "the worker never answered a dripping client"
    );
    assert_eq!(read_response(&mut conn, false).status, 408);
    drop(conn);
    assert!(
        wait_status(&pool, Duration::from_secs(10), |s| s["busy"] == 0),
        "a worker stayed busy after the 408"
    );

    // forkpool.recycle: the answer closes the connection, that worker
    // leaves, and another one serves the next request.
    let mut conn = connect(addr);
    let recycled = request(&mut conn, "GET /recycle HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(recycled.header("connection").as_deref(), Some("close"));
    let gone: i32 = String::from_utf8(recycled.body).unwrap().parse().unwrap();
    drop(conn);
    assert!(
        wait_status(&pool, Duration::from_secs(30), |s| {
            let pids = slot_pids(s);
            !pids.contains(&gone) && pids.len() >= 2 && s["idle"].as_u64() >= Some(2)
        }),
        "worker {gone} did not leave or was not replaced"
    );
    let mut conn = connect(addr);
    let next = request(&mut conn, "GET /pid HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_ne!(String::from_utf8(next.body).unwrap(), gone.to_string());
    let status = pool.status();
    assert!(status_pid_of(&status, gone).is_none());
    // It said Leaving (X): a retirement, not a death.
    assert_eq!(common::total(&status, "died"), 0, "{status}");
    assert!(common::total(&status, "retired") >= 1, "{status}");
}

#[test]
fn flask_app_in_handoff() {
    flask_app_over_http("handoff");
}

#[test]
fn flask_app_in_shared() {
    flask_app_over_http("shared");
}

#[test]
fn flask_app_in_order_and_from_a_factory_with_chdir() {
    let Some(python) = venv_python() else { return };
    let apps = wsgi_support::apps_dir();
    let mut command = Command::new(common::forkpool_bin());
    command
        .arg("run")
        .current_dir(std::env::temp_dir())
        .env("PYTHONPATH", clients_dir());
    let cmd = [
        python.as_str(),
        "-m",
        "forkpool_wsgi",
        "--chdir",
        apps.to_str().unwrap(),
        "flask_app:create_app()",
        "--no-access-log",
        "--keepalive-timeout",
        "120",
    ];
    let args = [
        "--ping-timeout",
        "20s",
        "--dispatch",
        "order",
        "--shutdown-timeout",
        "60s",
    ];
    let mut pool = DemoPool::launch(command, &args, &cmd, true);
    let mut conn = connect(pool.addr);
    for _ in 0..3 {
        let r = request(&mut conn, "GET / HTTP/1.1\r\nHost: t\r\n\r\n");
        assert_eq!(r.body, b"hello");
    }
    // HTTP/1.0 without keep-alive: the answer closes the connection.
    let mut conn = connect(pool.addr);
    let old = request(&mut conn, "GET / HTTP/1.0\r\n\r\n");
    assert_eq!(old.header("connection").as_deref(), Some("close"));
    assert_eq!(pool.status()["totals"]["died"], 0);

    // A kept-alive client idle between requests does not hold up a
    // graceful stop: the worker sees the Quit and ends the connection,
    // long before its keep-alive timeout (120 s) or the shutdown timeout.
    let mut idle = connect(pool.addr);
    assert_eq!(
        request(&mut idle, "GET / HTTP/1.1\r\nHost: t\r\n\r\n").body,
        b"hello"
    );
    idle.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    pool.signal(15);
    let mut rest = Vec::new();
    let ended = std::io::Read::read_to_end(&mut idle, &mut rest);
    assert!(
        ended.is_ok() && rest.is_empty(),
        "kept-alive connection not ended: {ended:?}"
    );
    let status = pool.wait_exit(Duration::from_secs(20));
    assert!(
        status.is_some_and(|s| s.success()),
        "no graceful exit: {status:?}"
    );
}

/// The helper's own unit tests (`clients/python/tests`).
#[test]
fn python_helper_unit_tests_pass() {
    let out = Command::new("python3")
        .args([
            "-W",
            "ignore::ResourceWarning",
            "-m",
            "unittest",
            "discover",
            "-s",
            "tests",
        ])
        .current_dir(clients_dir())
        .env("PYTHONPATH", clients_dir())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python3 -m unittest failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `pip install ./clients/python` into a fresh venv gives both modules,
/// importable from anywhere, and `python -m forkpool_wsgi --help` lists
/// the limits and `--no-access-log`.
#[test]
fn pip_install_provides_both_modules() {
    let Some(_) = venv_python() else { return };
    let venv = wsgi_support::target_dir().join(format!("py-install-test-{}", std::process::id()));
    let _cleanup = wsgi_support::RemoveOnDrop(venv.clone());
    let made = Command::new("python3")
        .arg("-m")
        .arg("venv")
        .arg(&venv)
        .status()
        .unwrap();
    assert!(made.success(), "python3 -m venv failed");
    let python = venv.join("bin/python");
    // pip builds in the source tree: install from a copy, so that
    // nothing is left in clients/python.
    let source = venv.join("src");
    std::fs::create_dir_all(&source).unwrap();
    for entry in std::fs::read_dir(clients_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, source.join(path.file_name().unwrap())).unwrap();
        }
    }
    let installed = Command::new(&python)
        .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
        .arg(&source)
        .output()
        .unwrap();
    assert!(
        installed.status.success(),
        "pip install failed:\n{}",
        String::from_utf8_lossy(&installed.stderr)
    );
    let imported = Command::new(&python)
        .args(["-c", "import forkpool_worker, forkpool_wsgi, forkpool_http"])
        .current_dir(std::env::temp_dir())
        .env_remove("PYTHONPATH")
        .output()
        .unwrap();
    assert!(
        imported.status.success(),
        "{}",
        String::from_utf8_lossy(&imported.stderr)
    );
    let help = Command::new(&python)
        .args(["-m", "forkpool_wsgi", "--help"])
        .current_dir(std::env::temp_dir())
        .env_remove("PYTHONPATH")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--chdir",
        "--no-access-log",
        "--head-timeout",
        "--keepalive-timeout",
        "--max-body",
    ] {
        assert!(text.contains(flag), "--help lacks {flag}:\n{text}");
    }
}

/// The example HTTP worker: a dripping client gets 408 at the head
/// deadline instead of holding the worker, and a huge Content-Length is
/// refused (413) without being read.
#[test]
fn example_http_worker_bounds_the_head_and_the_body() {
    let script = clients_dir().join("example_http_worker.py");
    let pool = DemoPool::start_run(
        &[
            "--ping-timeout",
            "20s",
            "--min-children",
            "1",
            "--min-spare",
            "1",
        ],
        &["python3", script.to_str().unwrap()],
    );
    let mut conn = connect(pool.addr);
    assert!(
        drip_head(
            &mut conn,
            Duration::from_millis(500),
            Duration::from_secs(20)
        ),
        "a client dripping its head held the worker"
    );
    assert_eq!(read_response(&mut conn, false).status, 408);

    let mut conn: TcpStream = connect(pool.addr);
    conn.write_all(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 100000000000\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&mut conn, false).status, 413);
    assert!(wait_status(&pool, Duration::from_secs(10), |s| s["busy"] == 0));
}

/// A one-worker `order` pool serving the Flask app with `--keepalive-turn
/// TURN`: a kept-alive connection keeps the worker while a second client
/// waits on the listener, until TURN has passed since its first request;
/// then the connection gives way (its next response says `Connection:
/// close`, or, idle, it is closed without one: docs/http.md, "Give-way"),
/// and the waiting client is served.
fn kept_alive_connection_gives_way_after(turn: Duration) {
    let Some(python) = venv_python() else { return };
    let mut command = Command::new(common::forkpool_bin());
    command
        .arg("run")
        .current_dir(wsgi_support::apps_dir())
        .env("PYTHONPATH", clients_dir());
    let mut args = vec!["--ping-timeout", "20s", "--dispatch", "order"];
    args.extend_from_slice(&common::ONE_CHILD);
    let turn_text = turn.as_secs_f64().to_string();
    let cmd = [
        python.as_str(),
        "-m",
        "forkpool_wsgi",
        "flask_app:app",
        "--keepalive-turn",
        turn_text.as_str(),
    ];
    let pool = DemoPool::launch(command, &args, &cmd, true);
    let mut kept = connect(pool.addr);
    let opened = std::time::Instant::now();
    let first = request(&mut kept, "GET / HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(first.header("connection"), None, "the first answer closed");
    let mut waiting = connect(pool.addr);
    waiting
        .write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    common::check_keepalive_turn("order", turn, opened, || {
        // Given up while idle: the request finds the connection closed.
        let _ = kept.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n");
        let mut reader = std::io::BufReader::new(&kept);
        let Ok(answer) = http_corpus::read_response(&mut reader, false) else {
            return true;
        };
        assert_eq!(answer.body, b"hello");
        answer
            .headers
            .contains(&("connection".into(), "close".into()))
    });
    drop(kept);
    let served = read_response(&mut waiting, false);
    assert_eq!(
        (served.status, served.body.as_slice()),
        (200, &b"hello"[..])
    );
}

#[test]
fn a_kept_alive_connection_gives_way_at_once_without_a_turn() {
    kept_alive_connection_gives_way_after(Duration::ZERO);
}

#[test]
fn a_kept_alive_connection_keeps_its_worker_for_its_turn() {
    kept_alive_connection_gives_way_after(Duration::from_secs(3));
}
