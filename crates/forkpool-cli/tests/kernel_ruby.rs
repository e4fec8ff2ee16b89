//! The Ruby helper in `--dispatch kernel` (issue 26): `Forkpool::Worker`
//! (clients/ruby/example_http_worker.rb) and `forkpool-rack` (the Sinatra
//! test app) under `forkpool run`, with real sockets and the real
//! supervisor; and the helper's scoreboard record on a file mapped like
//! the board.
//!
//! A worker that keeps its record on the board serves its own socket
//! without the supervisor: most tests stop the supervisor (SIGSTOP) while
//! they send, so a worker that fell back to `R` (handed every connection)
//! would answer nothing.

mod common;

#[path = "common/psgi_support.rs"]
mod psgi_support;
#[path = "common/rack_support.rs"]
mod rack_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{killed_by, parse_response, send, signal_pid, total, DemoPool, Response};
use psgi_support::{connect, read_response};
use rack_support::{fd_targets, rack_command, require_sinatra, template_pid, PATIENCE, RUBY_DIR};

/// `clients/ruby/example_http_worker.rb`.
const RUBY_WORKER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../clients/ruby/example_http_worker.rb"
);

/// `ruby -I clients/ruby clients/ruby/example_http_worker.rb`.
fn ruby_worker() -> Vec<&'static str> {
    vec!["ruby", "-I", RUBY_DIR, RUBY_WORKER]
}

fn require_ruby() -> bool {
    common::require_program("ruby", "run bash .ci/deps/ruby.sh").is_some()
}

/// A pool of `children` workers running CMD in kernel dispatch, once all
/// are idle; None (or, under CI, a failure) where the kernel refuses the
/// program.
fn kernel_pool(children: &str, extra: &[&str], cmd: &[&str]) -> Option<DemoPool> {
    let mut args = vec![
        "--dispatch",
        "kernel",
        "--ping-timeout",
        "20s",
        "--min-children",
        children,
        "--max-children",
        children,
        "--min-spare",
        "0",
        "--max-spare",
        children,
    ];
    args.extend_from_slice(extra);
    let pool = DemoPool::start_run(&args, cmd);
    if !common::require_kernel_dispatch(&pool) {
        return None;
    }
    let n: u64 = children.parse().unwrap();
    assert!(
        pool.wait_status(PATIENCE, |s| s["idle"] == n).is_some(),
        "the workers never became idle:\n{}",
        pool.stderr.dump()
    );
    Some(pool)
}

/// `kernel_pool` of the example worker; None when Ruby is missing.
fn ruby_pool(children: &str, extra: &[&str]) -> Option<DemoPool> {
    if !require_ruby() {
        return None;
    }
    kernel_pool(children, extra, &ruby_worker())
}

/// `kernel_pool` (EXTRA pool options) of forkpool-rack (SERVER_ARGS) on
/// the Sinatra test app; None when Ruby, Rack or Sinatra is missing.
fn rack_pool(children: &str, extra: &[&str], server_args: &[&str]) -> Option<DemoPool> {
    if !require_sinatra() {
        return None;
    }
    kernel_pool(children, extra, &rack_command(server_args))
}

/// `--preload` or nothing.
fn preload_args(preload: bool) -> &'static [&'static str] {
    if preload {
        &["--preload"]
    } else {
        &[]
    }
}

/// The supervisor stopped (SIGSTOP) for as long as this lives: only the
/// kernel and the workers serve meanwhile.
struct Stopped(i32);

impl Stopped {
    fn supervisor(pool: &DemoPool) -> Stopped {
        signal_pid(pool.pid, "STOP");
        Stopped(pool.pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal_pid(self.0, "CONT");
    }
}

/// A GET read to its end, failing after 5 s (a connection nobody took).
fn get_within(pool: &DemoPool, path: &str) -> Result<Response, String> {
    read_answer(send(pool.addr, path))
}

fn read_answer(mut conn: TcpStream) -> Result<Response, String> {
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut raw = String::new();
    conn.read_to_string(&mut raw)
        .map_err(|e| format!("no answer: {e}"))?;
    parse_response(&raw)
}

/// What status says slot `slot` served. Compare two readings: the
/// supervisor may count one connection for a worker it read busy on the
/// board before the worker's first idle store (between `K` and it).
fn slot_served(status: &serde_json::Value, slot: u64) -> u64 {
    status["slots"]
        .as_array()
        .and_then(|all| all.iter().find(|s| s["slot"] == slot))
        .and_then(|s| s["served"].as_u64())
        .unwrap_or(0)
}

fn pid_in_slot(status: &serde_json::Value, slot: u64) -> i32 {
    status["slots"]
        .as_array()
        .and_then(|all| all.iter().find(|s| s["slot"] == slot))
        .and_then(|s| s["pid"].as_i64())
        .unwrap_or_else(|| panic!("no worker in slot {slot}: {status}")) as i32
}

/// Neither a protocol violation (`B`, `N`, `M` from a `K` worker) nor a
/// death.
fn assert_no_kill_nor_death(status: &serde_json::Value) {
    assert_eq!(killed_by(status, "misbehaved"), 0, "{status}");
    assert_eq!(total(status, "killed"), 0, "{status}");
    assert_eq!(total(status, "died"), 0, "{status}");
    assert!(status.get("dispatch_fallback").is_none(), "{status}");
}

/// 30 sequential requests, the supervisor stopped: all served by slot 0,
/// which went idle on the board before each close. The supervisor, woken,
/// reads the 30 from the board.
#[test]
fn sequential_requests_all_go_to_slot_zero_without_the_supervisor() {
    let Some(pool) = ruby_pool("3", &[]) else {
        return;
    };
    let before = slot_served(&pool.status(), 0);
    let slots: Vec<Result<Option<usize>, String>> = {
        let _stopped = Stopped::supervisor(&pool);
        (0..30)
            .map(|_| get_within(&pool, "/").map(|r| r.slot))
            .collect()
    };
    assert_eq!(slots, vec![Ok(Some(0)); 30], "{}", pool.stderr.dump());
    let status = pool
        .wait_status(PATIENCE, |s| total(s, "accepted") >= 30)
        .unwrap_or_else(|| panic!("the board's counts never reached status: {}", pool.status()));
    assert_eq!(total(&status, "accepted"), 30, "{status}");
    assert_eq!(slot_served(&status, 0) - before, 30, "{status}");
    assert_no_kill_nor_death(&status);
}

/// Four slow requests at once to four idle workers, the supervisor
/// stopped: the kernel reserves a different worker for each.
#[test]
fn a_burst_lands_one_request_per_idle_worker() {
    let Some(pool) = ruby_pool("4", &[]) else {
        return;
    };
    let status = pool.status();
    let before: Vec<u64> = (0..4).map(|slot| slot_served(&status, slot)).collect();
    let mut slots: Vec<usize> = {
        let _stopped = Stopped::supervisor(&pool);
        let waiting: Vec<_> = (0..4).map(|_| send(pool.addr, "/?work_ms=400")).collect();
        waiting
            .into_iter()
            .map(|conn| {
                let r = read_answer(conn).unwrap_or_else(|e| panic!("{e}"));
                r.slot.expect("X-Forkpool-Slot")
            })
            .collect()
    };
    slots.sort_unstable();
    assert_eq!(slots, [0, 1, 2, 3], "{}", pool.stderr.dump());
    let status = pool
        .wait_status(PATIENCE, |s| total(s, "accepted") >= 4)
        .unwrap();
    for slot in 0..4 {
        assert_eq!(
            slot_served(&status, slot) - before[slot as usize],
            1,
            "{status}"
        );
    }
    assert_no_kill_nor_death(&status);
}

/// A stopped worker is reserved for the first connection, which waits on
/// its own socket; the next goes to slot 1 (both with the supervisor
/// stopped). Killed, the worker loses nothing: the supervisor, running
/// again, takes what was queued and hands it on.
#[test]
fn a_killed_worker_loses_nothing_queued_on_its_socket() {
    let Some(pool) = ruby_pool("2", &[]) else {
        return;
    };
    let first = pid_in_slot(&pool.status(), 0);
    signal_pid(first, "STOP");
    let (queued, next) = {
        let _stopped = Stopped::supervisor(&pool);
        let queued = send(pool.addr, "/");
        (queued, get_within(&pool, "/"))
    };
    let next = next.unwrap_or_else(|e| panic!("the second request: {e}"));
    assert_eq!(next.slot, Some(1), "{}", pool.stderr.dump());
    signal_pid(first, "KILL");
    let answer = read_answer(queued).expect("the queued connection was answered");
    assert_eq!(answer.status, 200);
    assert_ne!(answer.pid, Some(first));
    assert!(pool.wait_total("died", 1, PATIENCE), "{}", pool.status());
}

/// `max_requests_per_child` 5: with the supervisor stopped, slot 0
/// serves five requests and leaves (busy on the board, `X`), then slot 1
/// the next five. Running again, the supervisor replaces both (retired,
/// neither killed nor dead), and the new workers serve. Exec'd (the share
/// in FORKPOOL_MAX_REQUESTS) and forked by a template (in `S`).
#[test]
fn a_worker_leaves_after_its_share_and_is_replaced() {
    for preload in [false, true] {
        let mut extra = vec!["--max-requests-per-child", "5"];
        extra.extend_from_slice(preload_args(preload));
        let Some(pool) = ruby_pool("2", &extra) else {
            return;
        };
        leaves_after_its_share(&pool, preload);
    }
}

fn leaves_after_its_share(pool: &DemoPool, preload: bool) {
    let slots: Vec<Result<Option<usize>, String>> = {
        let _stopped = Stopped::supervisor(pool);
        (0..10)
            .map(|_| get_within(pool, "/").map(|r| r.slot))
            .collect()
    };
    let want: Vec<_> = [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]
        .into_iter()
        .map(|s| Ok(Some(s)))
        .collect();
    assert_eq!(slots, want, "preload {preload}: {}", pool.stderr.dump());
    let status = pool
        .wait_status(PATIENCE, |s| total(s, "retired") >= 2 && s["idle"] == 2)
        .unwrap_or_else(|| panic!("the workers were not replaced: {}", pool.status()));
    assert_eq!(total(&status, "spawned"), 4, "preload {preload}: {status}");
    assert_no_kill_nor_death(&status);
    for i in 0..5 {
        let r = get_within(pool, "/").unwrap_or_else(|e| panic!("request {i}: {e}"));
        assert_eq!(r.status, 200);
    }
}

/// On TERM every worker gets `Q`, stores busy and exits 0: retired, none
/// killed for being slow to stop.
#[test]
fn workers_told_to_quit_exit_at_once() {
    let Some(mut pool) = ruby_pool("3", &[]) else {
        return;
    };
    assert_eq!(get_within(&pool, "/").map(|r| r.status), Ok(200));
    pool.signal(15);
    let exit = pool.wait_exit(PATIENCE).expect("the supervisor exited");
    assert!(exit.success(), "{exit:?}\n{}", pool.stderr.dump());
    let totals = common::final_totals(&pool);
    assert_eq!(total(&totals, "retired"), 3, "{totals}");
    assert_eq!(total(&totals, "killed"), 0, "{totals}");
}

/// A worker stopped while the kernel queues a connection on its socket is
/// told to quit meanwhile (a reload rolls the pool): woken, it reads `Q`
/// first, then serves what is queued for it before it exits, instead of
/// leaving it to the supervisor to hand elsewhere.
#[test]
fn a_worker_told_to_quit_serves_what_was_queued_for_it() {
    let Some(pool) = ruby_pool("2", &[]) else {
        return;
    };
    let worker = pid_in_slot(&pool.status(), 0);
    signal_pid(worker, "STOP");
    let queued = send(pool.addr, "/");
    pool.signal(1); // HUP: a new generation, and Q for the old one
    let retiring = pool.wait_status(PATIENCE, |s| {
        s["slots"].as_array().is_some_and(|all| {
            all.iter()
                .any(|w| w["pid"] == worker && w["state"] == "retiring")
        })
    });
    signal_pid(worker, "CONT");
    assert!(retiring.is_some(), "never told to quit: {}", pool.status());
    let answer = read_answer(queued).expect("the queued connection was answered");
    assert_eq!((answer.status, answer.pid), (200, Some(worker)));
    let status = pool
        .wait_status(PATIENCE, |s| {
            s["generation"] == 2 && s["idle"] == 2 && total(s, "retired") >= 2
        })
        .unwrap_or_else(|| panic!("the old generation never left: {}", pool.status()));
    assert_no_kill_nor_death(&status);
}

/// forkpool-rack in kernel dispatch, exec'd and under `--preload`, the
/// supervisor stopped: sequential requests all land on slot 0, and a
/// kept-alive connection serves three requests on one worker.
#[test]
fn the_rack_server_serves_in_kernel_dispatch_keep_alive_included() {
    for preload in [false, true] {
        let Some(pool) = rack_pool("2", preload_args(preload), &["--no-access-log"]) else {
            return;
        };
        serves_keep_alive_included(&pool, preload);
    }
}

fn serves_keep_alive_included(pool: &DemoPool, preload: bool) {
    let (slots, kept) = {
        let _stopped = Stopped::supervisor(pool);
        let slots: Vec<Option<usize>> = (0..10)
            .map(|_| get_within(pool, "/").expect("an answer").slot)
            .collect();
        let mut conn = connect(pool);
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let kept: Vec<(u16, Option<String>, Option<String>)> = (0..3)
            .map(|i| {
                write!(conn, "GET /?name={i} HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
                let r = read_response(&mut conn, false);
                (
                    r.status,
                    r.header("x-forkpool-slot"),
                    r.header("connection"),
                )
            })
            .collect();
        (slots, kept)
    };
    assert_eq!(
        slots,
        vec![Some(0); 10],
        "preload {preload}: {}",
        pool.stderr.dump()
    );
    assert_eq!(
        kept,
        vec![(200, Some("0".to_string()), None); 3],
        "preload {preload}"
    );
    let status = pool
        .wait_status(PATIENCE, |s| total(s, "accepted") >= 11)
        .unwrap();
    assert_eq!(total(&status, "accepted"), 11, "{status}");
    assert_no_kill_nor_death(&status);
}

/// One forkpool-rack worker holds an idle kept-alive connection (its
/// turn 0, the keep-alive timeout 30 s); a new client goes to the overflow,
/// the worker gives way and takes it from there itself: served at once,
/// even with the supervisor stopped.
#[test]
fn the_rack_server_gives_way_on_the_overflow() {
    let Some(pool) = rack_pool(
        "1",
        &[],
        &["--keepalive-timeout", "30", "--keepalive-turn", "0"],
    ) else {
        return;
    };
    let mut kept = connect(&pool);
    kept.write_all(b"GET /?name=a HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let first = read_response(&mut kept, false);
    assert_eq!(first.header("connection"), None, "kept alive");
    let (answer, waited) = {
        let _stopped = Stopped::supervisor(&pool);
        let started = Instant::now();
        (get_within(&pool, "/?name=b"), started.elapsed())
    };
    let answer = answer.unwrap_or_else(|e| panic!("{e}\n{}", pool.stderr.dump()));
    assert_eq!(answer.body, "hello b\n");
    assert!(waited < Duration::from_secs(5), "waited {waited:?}");
    kept.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(
        kept.read(&mut [0; 16]).unwrap_or(1),
        0,
        "the idle connection was closed"
    );
    let status = pool
        .wait_status(PATIENCE, |s| total(s, "taken_next") >= 1)
        .unwrap_or_else(|| panic!("not taken from the overflow: {}", pool.status()));
    assert_no_kill_nor_death(&status);
}

/// Refork in kernel dispatch: after five connections the warm worker
/// becomes the template. It gives up its seat first (busy, its own socket
/// closed, the board closed and unmapped: no `bpf-map` among its
/// descriptors or mappings), and the workers it forks are seated again
/// (`S`) and serve with the supervisor stopped.
#[test]
fn a_reforking_worker_gives_up_its_seat() {
    let Some(pool) = rack_pool(
        "2",
        &["--preload", "--refork-after", "5"],
        &["--no-access-log"],
    ) else {
        return;
    };
    let warm = pid_in_slot(&pool.status(), 0);
    let deadline = Instant::now() + PATIENCE;
    loop {
        assert_eq!(get_within(&pool, "/").map(|r| r.status), Ok(200));
        let s = pool.status();
        if total(&s, "reforks") == 1
            && template_pid(&s) == warm
            && s["templates"].as_array().map_or(0, Vec::len) == 1
            && s["templates"][0]["state"] == "ready"
            && s["idle"] == 2
        {
            break;
        }
        assert!(Instant::now() < deadline, "no refork: {s}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let maps = std::fs::read_to_string(format!("/proc/{warm}/maps")).unwrap();
    let fds = fd_targets(warm);
    assert!(
        !maps.contains("bpf-map") && !fds.iter().any(|(_, t)| t.contains("bpf-map")),
        "the new template kept the board: {fds:?}\n{maps}"
    );
    let answers: Vec<Result<Response, String>> = {
        let _stopped = Stopped::supervisor(&pool);
        (0..3).map(|_| get_within(&pool, "/")).collect()
    };
    for answer in answers {
        let answer = answer.unwrap_or_else(|e| panic!("{e}\n{}", pool.stderr.dump()));
        assert_eq!(answer.status, 200);
        assert_ne!(
            answer.pid,
            Some(warm),
            "served by a worker of the new template"
        );
    }
    assert_no_kill_nor_death(&pool.status());
}

/// The record the helper keeps, on a file mapped like the board (magic,
/// two slots): each way of going idle stores 1 and says whether word 2
/// asks for `I`; the counts land in words 9-11 of slot 1's record; a file
/// that is not a board, or a slot past its count, is refused.
#[test]
fn the_record_lands_on_a_file_mapped_like_the_board() {
    if !require_ruby() {
        return;
    }
    for atomics in ["true", "false"] {
        let path = common::temp_path("board");
        let mut board = vec![0u8; 4096];
        board[..8].copy_from_slice(b"fkpbrd01");
        board[8..16].copy_from_slice(&2u64.to_le_bytes());
        std::fs::write(&path, &board).unwrap();
        let script = format!(
            r#"require "forkpool/board"
               file = File.open(ARGV[0], "r+")
               board = Forkpool::Board.new(file.fileno, 1, atomics: {atomics})
               board.busy!
               board.took!; board.served!; board.took!; board.took_next!; board.served!
               quiet = board.idle!
               File.open(ARGV[0], "r+") {{ |f| f.pwrite([1].pack("Q<"), 16) }}
               asked = board.idle!
               puts [board.idle_store, quiet, asked].join(" ")"#
        );
        let out = Command::new("ruby")
            .args(["-I", RUBY_DIR, "-e", &script])
            .arg(&path)
            .output()
            .unwrap();
        let words: Vec<u64> = std::fs::read(&path).unwrap()[..8 * 16]
            .chunks(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
            .collect();
        std::fs::remove_file(&path).unwrap();
        assert!(out.status.success(), "{out:?}");
        let idle_store = if atomics == "true" {
            "exchange"
        } else {
            "store_and_trylock"
        };
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("{idle_store} false true")
        );
        // Slot 1's record: state idle, taken 3, served 2, taken next 1;
        // slot 0's untouched.
        assert_eq!(words[8..16], [0, 0, 0, 0, 1, 3, 2, 1], "{words:?}");
    }

    let path = common::temp_path("not-a-board");
    std::fs::write(&path, vec![0u8; 4096]).unwrap();
    let refused = |slot: &str, first: &[u8]| {
        let mut bytes = vec![0u8; 4096];
        bytes[..first.len()].copy_from_slice(first);
        std::fs::write(&path, &bytes).unwrap();
        let out = Command::new("ruby")
            .args(["-I", RUBY_DIR, "-e"])
            .arg(format!(
                r#"require "forkpool/board"
                   Forkpool::Board.new(File.open(ARGV[0], "r+").fileno, {slot})"#
            ))
            .arg(&path)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // Refused with ArgumentError (what `from_env` raises for a bad
    // environment), not a crash.
    let (code, why) = refused("0", b"notboard");
    assert_eq!(code, Some(1), "{why}");
    assert!(why.contains("(ArgumentError)"), "{why}");
    let mut two_slots = b"fkpbrd01".to_vec();
    two_slots.extend_from_slice(&2u64.to_le_bytes());
    assert_eq!(
        refused("1", &two_slots).0,
        Some(0),
        "slot 1 is on the board"
    );
    let (code, why) = refused("2", &two_slots);
    assert_eq!(code, Some(1), "{why}");
    assert!(why.contains("(ArgumentError)"), "{why}");
    std::fs::remove_file(&path).unwrap();
}
