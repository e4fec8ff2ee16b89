//! The Perl helper in `--dispatch kernel` (issue 26): `Forkpool::Worker`
//! maps the scoreboard with `syscall(mmap)`, stores through
//! `/proc/self/mem`, says `K` and serves its own socket. The example worker
//! (`clients/perl/example_http_worker.pl`) passes the cases every helper
//! passes (`common/kernel_helper_cases.rs`); `forkpool-psgi` serves in
//! kernel dispatch, keep-alive included, and gives way on the overflow.

#[path = "common/bench_bins.rs"]
mod bench_bins;
mod common;
#[path = "common/example_workers.rs"]
mod example_workers;
#[path = "common/kernel_helper_cases.rs"]
mod kernel_helper_cases;
#[path = "common/psgi_support.rs"]
mod psgi_support;

use std::io::{Read, Write};

use common::{send, total};
use example_workers::PERL_WORKER;
use kernel_helper_cases::{
    answer, assert_clean, assert_reconnects_stayed, kernel_pool, SupervisorStopped, PATIENCE,
};
use psgi_support::{
    connect, kept_alive, read_response, reconnecting_at_once, require_plack, PSGI_SERVER, TEST_APP,
};

const WORKER: [&str; 2] = ["perl", PERL_WORKER];

kernel_helper_cases::every_helper_case!(|case: fn(&[&str])| case(&WORKER), with_preload);

/// `perl forkpool-psgi [ARGS] t/app.psgi` (the Plack test app: it names
/// the worker in `X-Forkpool-Slot` and `X-Forkpool-Pid`).
fn psgi(args: &[&'static str]) -> Vec<&'static str> {
    let mut cmd = vec!["perl", PSGI_SERVER];
    cmd.extend_from_slice(args);
    cmd.push(TEST_APP);
    cmd
}

/// With the supervisor stopped, ten requests on ten connections and three
/// on one kept-alive connection are all served by slot 0, the kept-alive
/// ones by one process.
#[test]
fn forkpool_psgi_serves_slot_zero_keep_alive_included() {
    if !require_plack() {
        return;
    }
    let Some(pool) = kernel_pool(2, &[], &psgi(&[])) else {
        return;
    };
    let (slots, kept) = {
        let _stopped = SupervisorStopped::new(&pool);
        let slots: Vec<Option<usize>> = (0..10)
            .map(|_| {
                let r = answer(send(pool.addr, "/?name=x"))
                    .unwrap_or_else(|e| panic!("{e}\n{}", pool.stderr.dump()));
                assert_eq!(r.body, "hello x\n");
                r.slot
            })
            .collect();
        let mut conn = connect(&pool);
        let kept: Vec<_> = (0..3)
            .map(|i| {
                write!(conn, "GET /?name={i} HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
                let r = read_response(&mut conn, false);
                assert_eq!(r.body_text(), format!("hello {i}\n"));
                assert_eq!(r.header("connection"), None, "kept alive");
                (r.header("x-forkpool-slot"), r.header("x-forkpool-pid"))
            })
            .collect();
        (slots, kept)
    };
    assert_eq!(slots, vec![Some(0); 10], "{}", pool.stderr.dump());
    assert_eq!(kept[0].0.as_deref(), Some("0"), "{kept:?}");
    assert!(kept.iter().all(|k| *k == kept[0]), "one worker: {kept:?}");
    let status = pool
        .wait_status(PATIENCE, |s| total(s, "accepted") >= 11)
        .unwrap_or_else(|| panic!("the board's counts never reached status: {}", pool.status()));
    assert_eq!(total(&status, "accepted"), 11, "{status}");
    assert_clean(&status);
}

/// A client told `Connection: close` that reconnects the moment it has
/// the answer, without waiting for the close, lands on the same worker
/// every time: forkpool-psgi goes idle just before a connection's last
/// answer goes out (`Forkpool::Worker`'s `ending_connection`), not after
/// the close. Going idle after the close, the reconnect races the
/// worker's finish and lands on slot 1 (or the overflow). Exec'd and
/// under `--preload`, the supervisor stopped.
#[test]
fn forkpool_psgi_client_reconnecting_at_once_finds_its_worker_idle() {
    const ROUNDS: usize = 100;
    if !require_plack() {
        return;
    }
    let cmd = psgi(&["--no-access-log", "--max-keepalive-requests", "1"]);
    for extra in [&[][..], &["--preload"][..]] {
        let Some(pool) = kernel_pool(2, extra, &cmd) else {
            return;
        };
        let answers = {
            let _stopped = SupervisorStopped::new(&pool);
            reconnecting_at_once(&pool, ROUNDS, b"GET /?name=x HTTP/1.1\r\nHost: t\r\n\r\n")
        };
        assert_reconnects_stayed(&pool, &format!("{extra:?}"), &answers);
    }
}

/// One worker holds a kept-alive connection (`--keepalive-turn 0`, a
/// keep-alive timeout of a minute): a second client finds no idle worker,
/// so the kernel puts it on the overflow; the worker sees it waiting
/// there, closes the idle kept-alive connection and takes the waiting one
/// itself, long before the keep-alive timeout.
#[test]
fn forkpool_psgi_gives_way_on_the_overflow() {
    if !require_plack() {
        return;
    }
    let args = ["--keepalive-turn", "0", "--keepalive-timeout", "60"];
    let Some(pool) = kernel_pool(1, &[], &psgi(&args)) else {
        return;
    };
    let mut kept = kept_alive(&pool);
    let waiting = answer(send(pool.addr, "/?name=b"))
        .unwrap_or_else(|e| panic!("the waiting client: {e}\n{}", pool.stderr.dump()));
    assert_eq!(waiting.body, "hello b\n");
    let mut rest = Vec::new();
    kept.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "the idle kept-alive connection was closed");
    let status = pool
        .wait_status(PATIENCE, |s| total(s, "accepted") >= 2)
        .unwrap_or_else(|| panic!("the board's counts never reached status: {}", pool.status()));
    assert_eq!(total(&status, "taken_next"), 1, "{status}");
    assert_clean(&status);
}

/// `psgix.harakiri`: the worker leaves after its response (`X`, a
/// retirement, not a death) and a new one takes the slot.
#[test]
fn forkpool_psgi_harakiri_leaves_as_a_retirement() {
    if !require_plack() {
        return;
    }
    let Some(pool) = kernel_pool(1, &[], &psgi(&[])) else {
        return;
    };
    let r = answer(send(pool.addr, "/harakiri")).expect("an answer");
    assert_eq!(r.body, "leaving\n");
    let status = pool
        .wait_status(PATIENCE, |s| total(s, "retired") == 1 && s["idle"] == 1)
        .unwrap_or_else(|| panic!("the worker was not replaced: {}", pool.status()));
    assert_clean(&status);
    let again = answer(send(pool.addr, "/?name=c")).expect("an answer");
    assert_ne!(again.pid, r.pid);
}
