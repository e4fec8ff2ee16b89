//! `forkpool run -- perl clients/perl/forkpool-psgi APP.psgi`: a real Plack
//! app served through forkpool's PSGI server, spoken to over raw TCP; the
//! Perl unit tests of its HTTP module; and the two faults of the example
//! Perl HTTP worker (issue 11 item 12).

mod common;

#[path = "common/psgi_support.rs"]
mod psgi_support;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use psgi_support::{
    connect, read_response, require_plack, rss_kib, start_psgi, worker_pids, PERL_DIR, TEST_APP,
};

/// What most tests run in: every protocol dispatch mode the brief asks
/// for, `handoff` (the default) and `order`.
const MODES: [&str; 2] = ["handoff", "order"];

#[test]
fn perl_unit_tests_of_the_http_module_pass() {
    let out = std::process::Command::new("prove")
        .args(["-I", PERL_DIR])
        .arg(format!("{PERL_DIR}/t"))
        .output()
        .expect("run prove (it comes with perl)");
    assert!(
        out.status.success(),
        "prove failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn get_head_post_and_keep_alive() {
    if !require_plack() {
        return;
    }
    for mode in MODES {
        let pool = start_psgi(mode, &[]);
        let mut conn = connect(&pool);
        conn.write_all(b"GET /?name=psgi HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        let get = read_response(&mut conn, false);
        assert_eq!(
            (get.status, get.body_text().as_str()),
            (200, "hello psgi\n")
        );
        let pid = get.header("x-forkpool-pid").expect("X-Forkpool-Pid");

        // HEAD: the GET's headers, no body; then a POST on the same
        // connection, its body in chunks, echoed by Plack::Request.
        conn.write_all(b"HEAD /?name=psgi HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        let head = read_response(&mut conn, true);
        assert_eq!(head.status, 200);
        assert!(head.body.is_empty());
        conn.write_all(
            b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n\
              5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n",
        )
        .unwrap();
        let post = read_response(&mut conn, false);
        assert_eq!(
            (post.status, post.body_text().as_str()),
            (200, "hello, world")
        );

        // Two requests in one write (pipelined), the second asking to close.
        conn.write_all(
            b"GET /?name=a HTTP/1.1\r\nHost: t\r\n\r\n\
              GET /?name=b HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        )
        .unwrap();
        let a = read_response(&mut conn, false);
        let b = read_response(&mut conn, false);
        assert_eq!(a.body_text(), "hello a\n");
        assert_eq!(b.body_text(), "hello b\n");
        assert_eq!(b.header("connection").as_deref(), Some("close"));
        for r in [&head, &post, &a, &b] {
            assert_eq!(
                r.header("x-forkpool-pid"),
                Some(pid.clone()),
                "one connection, one worker"
            );
        }
        let mut rest = Vec::new();
        conn.read_to_end(&mut rest).unwrap();
        assert!(
            rest.is_empty(),
            "the server closed after `Connection: close`"
        );
        let totals = &pool.status()["totals"];
        assert_eq!(
            totals["accepted"], 1,
            "{mode}: five requests, one connection"
        );
    }
}

#[test]
fn keep_alive_is_bounded_in_requests_and_idle_time() {
    if !require_plack() {
        return;
    }
    let pool = start_psgi(
        "handoff",
        &["--max-keepalive-requests", "2", "--keepalive-timeout", "1"],
    );
    let mut conn = connect(&pool);
    conn.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let first = read_response(&mut conn, false);
    assert_eq!(first.header("connection"), None);
    conn.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let second = read_response(&mut conn, false);
    assert_eq!(second.header("connection").as_deref(), Some("close"));
    assert_eq!(
        conn.read(&mut [0; 16]).unwrap(),
        0,
        "closed after the limit"
    );

    // A kept-alive client that says nothing more is let go.
    let mut idle = connect(&pool);
    idle.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    read_response(&mut idle, false);
    let waited = Instant::now();
    assert_eq!(idle.read(&mut [0; 16]).unwrap(), 0, "closed when idle");
    assert!(waited.elapsed() < Duration::from_secs(15));
    assert!(
        psgi_support::wait_idle(&pool, 1),
        "the worker is idle again"
    );
}

#[test]
fn expect_100_continue_and_a_large_body_streamed_in_bounded_memory() {
    if !require_plack() {
        return;
    }
    for mode in MODES {
        let pool = start_psgi(mode, &[]);
        let pid = worker_pids(&pool)[0];
        let before = rss_kib(pid, "VmRSS");
        const SIZE: usize = 96 << 20;
        let mut conn = connect(&pool);
        write!(
            conn,
            "POST /count HTTP/1.1\r\nHost: t\r\nContent-Length: {SIZE}\r\n\
             Expect: 100-continue\r\n\r\n"
        )
        .unwrap();
        let cont = read_response(&mut conn, true);
        assert_eq!(cont.status, 100, "100 Continue before the body");
        let piece: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
        for _ in 0..SIZE >> 20 {
            conn.write_all(&piece).unwrap();
        }
        let res = read_response(&mut conn, false);
        let sum = piece.iter().map(|&b| b as u64).sum::<u64>() * (SIZE >> 20) as u64;
        assert_eq!(res.status, 200);
        assert_eq!(res.body_text(), format!("{SIZE} {}\n", sum % (1 << 32)));
        assert_eq!(res.header("x-forkpool-pid"), Some(pid.to_string()));
        // The peak resident size, not the size now: the body must never
        // have been held whole.
        let peak = rss_kib(pid, "VmHWM");
        assert!(
            peak < before + 16 * 1024,
            "{mode}: the worker grew from {before} KiB to a peak of {peak} KiB for a {} MiB body",
            SIZE >> 20
        );
    }
}

#[test]
fn an_app_that_dies_gets_a_500_and_the_worker_serves_on() {
    if !require_plack() {
        return;
    }
    for mode in MODES {
        let pool = start_psgi(mode, &[]);
        let pid = worker_pids(&pool)[0];
        let mut conn = connect(&pool);
        conn.write_all(b"GET /die HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        let res = read_response(&mut conn, false);
        assert_eq!(res.status, 500);
        // The error reaches the supervisor's log with the worker's slot.
        assert!(
            pool.stderr.wait_for_all(
                &["the app failed on purpose", &format!("pid={pid}"), "slot="],
                Duration::from_secs(5)
            ),
            "{mode}: the error is not in the log with the slot:\n{}",
            pool.stderr.dump()
        );
        let again = pool.get("/?name=again").unwrap();
        assert_eq!((again.status, again.body.as_str()), (200, "hello again\n"));
        assert_eq!(again.pid, Some(pid), "{mode}: the same worker");
        let status = pool.status();
        assert_eq!(status["totals"]["died"], 0, "{mode}: no worker died");
        assert_eq!(status["slots"][0]["served"], 2);
    }
}

#[test]
fn a_streamed_response_is_chunked_and_a_file_body_is_sent_whole() {
    if !require_plack() {
        return;
    }
    for mode in MODES {
        let pool = start_psgi(mode, &[]);
        let mut conn = connect(&pool);
        conn.write_all(b"GET /stream?parts=4 HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        let res = read_response(&mut conn, false);
        assert_eq!(res.header("transfer-encoding").as_deref(), Some("chunked"));
        assert_eq!(res.body_text(), "part 1\npart 2\npart 3\npart 4\n");

        conn.write_all(b"GET /file HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            .unwrap();
        let file = read_response(&mut conn, false);
        assert_eq!(file.body, std::fs::read(TEST_APP).unwrap());

        // An HTTP/1.0 client cannot take chunks: the body ends at the close.
        let mut old = connect(&pool);
        old.write_all(b"GET /stream?parts=2 HTTP/1.0\r\n\r\n")
            .unwrap();
        let res = read_response(&mut old, false);
        assert_eq!(res.header("transfer-encoding"), None);
        assert_eq!(res.body_text(), "part 1\npart 2\n");
    }
}

#[test]
fn a_client_dripping_its_head_gets_408_and_frees_the_worker() {
    if !require_plack() {
        return;
    }
    for mode in MODES {
        let pool = start_psgi(mode, &["--header-timeout", "1"]);
        let mut conn = connect(&pool);
        let started = Instant::now();
        let mut answer = Vec::new();
        // One byte every 200 ms: each read succeeds, the head never ends.
        for byte in b"GET / HTTP/1.1\r\nHost: t\r\nX-Slow: ".iter().cycle() {
            if conn.write_all(&[*byte]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
            conn.set_nonblocking(true).unwrap();
            let mut buf = [0; 512];
            if let Ok(n) = conn.read(&mut buf) {
                answer.extend_from_slice(&buf[..n]);
            }
            conn.set_nonblocking(false).unwrap();
            if !answer.is_empty() || started.elapsed() > Duration::from_secs(20) {
                break;
            }
        }
        // The answer must come while the client is still sending: a
        // timeout per read would wait for ever here.
        let dripped_for = started.elapsed();
        let mut rest = Vec::new();
        let _ = conn.read_to_end(&mut rest);
        answer.extend(rest);
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 408 "), "{mode}: {text:?}");
        assert!(
            dripped_for < Duration::from_secs(20),
            "{mode}: no answer while the client was dripping"
        );
        assert!(
            psgi_support::wait_idle(&pool, 1),
            "{mode}: worker not freed"
        );
    }
}

#[test]
fn malformed_and_oversized_requests_are_refused() {
    if !require_plack() {
        return;
    }
    let pool = start_psgi(
        "handoff",
        &["--max-header-size", "1024", "--max-body-size", "1000"],
    );
    let cases: [(&[u8], u16); 5] = [
        (b"NOT A REQUEST\r\n\r\n", 400),
        (
            b"GET / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            400,
        ),
        (
            b"POST /count HTTP/1.1\r\nHost: t\r\nContent-Length: 1001\r\n\r\n",
            413,
        ),
        (
            b"POST /count HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3e9\r\n",
            413,
        ),
        (b"GET / HTTP/1.1\r\nHost: t\r\nX-Big: ", 431),
    ];
    for (request, want) in cases {
        let mut conn = connect(&pool);
        conn.write_all(request).unwrap();
        if want == 431 {
            conn.write_all(&[b'x'; 2048]).unwrap();
        }
        let res = read_response(&mut conn, false);
        assert_eq!(
            res.status,
            want,
            "{:?}",
            String::from_utf8_lossy(&request[..20])
        );
    }
    assert!(psgi_support::wait_idle(&pool, 1));
    assert_eq!(pool.status()["totals"]["died"], 0);
}

#[test]
fn harakiri_ends_the_worker_after_its_response() {
    if !require_plack() {
        return;
    }
    for mode in MODES {
        let pool = start_psgi(mode, &[]);
        let first = pool.get("/harakiri").unwrap();
        assert_eq!((first.status, first.body.as_str()), (200, "leaving\n"));
        let old = first.pid.unwrap();
        assert!(
            pool.wait_child_pids(Duration::from_secs(30), |p| !p.is_empty()
                && !p.contains(&old)),
            "{mode}: the worker did not leave:\n{}",
            pool.stderr.dump()
        );
        assert!(psgi_support::wait_idle(&pool, 1));
        let next = pool.get("/").unwrap();
        assert_eq!(next.status, 200);
        assert_ne!(next.pid, Some(old), "{mode}: a new worker");
        // It said Leaving (X): a retirement, not a death.
        let status = pool.status();
        assert_eq!(common::total(&status, "died"), 0, "{mode}: {status}");
        assert!(common::total(&status, "retired") >= 1, "{mode}: {status}");
    }
}

#[test]
fn shared_mode_serves_too() {
    if !require_plack() {
        return;
    }
    let pool = start_psgi("shared", &[]);
    let res = pool.get("/?name=shared").unwrap();
    assert_eq!((res.status, res.body.as_str()), (200, "hello shared\n"));
}

#[test]
fn plackup_with_the_forkpool_handler() {
    if !require_plack() {
        return;
    }
    let pool = psgi_support::start_pool(
        "handoff",
        &[
            "plackup",
            "-I",
            PERL_DIR,
            "-s",
            "Forkpool",
            "--max-keepalive-requests",
            "1",
            TEST_APP,
        ],
    );
    let mut conn = connect(&pool);
    conn.write_all(b"GET /?name=plackup HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let res = read_response(&mut conn, false);
    assert_eq!(res.body_text(), "hello plackup\n");
    // The handler option reached the server: one request per connection.
    assert_eq!(res.header("connection").as_deref(), Some("close"));
    assert_eq!(
        res.header("x-forkpool-pid"),
        Some(worker_pids(&pool)[0].to_string())
    );
}

/// Issue 11 item 12: the example worker used to time out each read but not
/// the head as a whole, and read a body of any declared size into memory.
#[test]
fn example_perl_worker_bounds_the_head_time_and_the_body_size() {
    let worker = format!("{PERL_DIR}/example_http_worker.pl");
    let pool = psgi_support::start_pool("handoff", &["perl", &worker]);
    let mut conn = connect(&pool);
    let started = Instant::now();
    // A byte every 2 s: under the old per-read timeout of 5 s, forever.
    let mut closed = false;
    for byte in b"GET / HTTP/1.1\r\nX: ".iter().cycle() {
        if conn.write_all(&[*byte]).is_err() {
            closed = true;
            break;
        }
        conn.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        match conn.read(&mut [0; 256]) {
            Ok(_) => {
                closed = true;
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => {
                closed = true;
                break;
            }
        }
        if started.elapsed() > Duration::from_secs(40) {
            break;
        }
    }
    assert!(closed, "the dripping client still holds the worker");
    assert!(psgi_support::wait_idle(&pool, 1), "worker not freed");

    let pid = worker_pids(&pool)[0];
    let mut big = connect(&pool);
    big.write_all(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 100000000000\r\n\r\n")
        .unwrap();
    let res = read_response(&mut big, false);
    assert_eq!(res.status, 413);
    assert_eq!(res.header("x-forkpool-pid"), Some(pid.to_string()));
}

/// The access log is a line per request on stderr: a busy worker logging
/// hundreds of lines a second for longer than the stderr flood limit (5 s)
/// is serving, not flooding, and must be neither cut off nor killed.
#[test]
fn a_busy_worker_logging_every_request_is_not_taken_for_a_flood() {
    if !require_plack() {
        return;
    }
    let pool = start_psgi("handoff", &[]);
    let run_for = Duration::from_millis(6_500);
    let started = Instant::now();
    let answered: usize = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    let mut ok = 0;
                    while started.elapsed() < run_for {
                        let r = pool.get("/?name=load").unwrap_or_else(|e| {
                            panic!("{e}\n{}", pool.stderr.dump());
                        });
                        assert_eq!(r.status, 200);
                        ok += 1;
                    }
                    ok
                })
            })
            .collect();
        clients.into_iter().map(|c| c.join().unwrap()).sum()
    });
    let per_second = answered as f64 / run_for.as_secs_f64();
    assert!(
        per_second > 400.0,
        "only {per_second:.0} requests a second: too few to tell a flood rule apart"
    );
    let status = pool.status();
    assert_eq!(common::total(&status, "killed"), 0, "{status}");
    assert_eq!(common::total(&status, "died"), 0, "{status}");
    assert_eq!(
        common::total(&status, "stderr_lines_dropped"),
        0,
        "{status}"
    );
}

/// A one-worker pool in dispatch MODE serving the Plack app with
/// `--keepalive-turn TURN`: a kept-alive connection keeps the worker while
/// a second client waits on the listener, until TURN has passed since its
/// first request; after that it gives way, either way docs/http.md allows:
/// its next response says `Connection: close`, or, idle between two
/// requests, it is closed; and the waiting client is served at once
/// rather than after the keep-alive timeout.
fn kept_alive_connection_gives_way_after(mode: &str, turn: Duration) {
    let turn_text = turn.as_secs_f64().to_string();
    let pool = start_psgi(mode, &["--keepalive-turn", &turn_text]);
    let mut kept = connect(&pool);
    let opened = Instant::now();
    kept.write_all(b"GET /?name=a HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let first = read_response(&mut kept, false);
    assert_eq!(first.header("connection"), None, "{mode}: kept alive");
    let mut waiting = connect(&pool);
    waiting
        .write_all(b"GET /?name=b HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    assert!(
        common::DemoPool::wait_status(&pool, Duration::from_secs(10), |s| {
            s["queues"][0]["waiting"] == 1
        })
        .is_some(),
        "{mode}: the second client never waited on the listener"
    );
    common::check_keepalive_turn(mode, turn, opened, || {
        if kept
            .write_all(b"GET /?name=a HTTP/1.1\r\nHost: t\r\n\r\n")
            .is_err()
        {
            return true; // closed while idle
        }
        if !matches!(kept.peek(&mut [0]), Ok(1)) {
            return true; // closed while idle: no answer comes
        }
        let answer = read_response(&mut kept, false);
        assert_eq!(answer.body_text(), "hello a\n");
        answer.header("connection").as_deref() == Some("close")
    });
    drop(kept);
    assert_eq!(read_response(&mut waiting, false).body_text(), "hello b\n");
}

/// `--keepalive-turn 0`: the connection gives way at its first chance,
/// which for an idle one is as soon as a client waits (docs/http.md,
/// give-way): the waiting client is served without the kept-alive one
/// sending anything, and the kept-alive one finds its connection closed.
#[test]
fn a_kept_alive_connection_gives_way_at_once_without_a_turn() {
    if !require_plack() {
        return;
    }
    for mode in MODES {
        let pool = start_psgi(mode, &["--keepalive-turn", "0"]);
        let mut kept = connect(&pool);
        kept.write_all(b"GET /?name=a HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        let first = read_response(&mut kept, false);
        assert_eq!(first.header("connection"), None, "{mode}: kept alive");
        let started = Instant::now();
        let mut waiting = connect(&pool);
        waiting
            .write_all(b"GET /?name=b HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            .unwrap();
        assert_eq!(read_response(&mut waiting, false).body_text(), "hello b\n");
        let waited = started.elapsed();
        assert!(
            waited < Duration::from_secs(2),
            "{mode}: the waiting client waited {waited:?} (the keep-alive timeout is 5 s)"
        );
        let mut rest = Vec::new();
        kept.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "{mode}: the idle connection was closed");
    }
}

#[test]
fn a_kept_alive_connection_keeps_its_worker_for_its_turn() {
    if !require_plack() {
        return;
    }
    kept_alive_connection_gives_way_after("order", Duration::from_secs(3));
}
