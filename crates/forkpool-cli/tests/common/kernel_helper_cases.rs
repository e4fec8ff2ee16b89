//! The cases every worker helper passes in `--dispatch kernel` (issue 26),
//! for `kernel_c.rs` and `kernel_perl.rs`: real supervisor, real sockets,
//! the helper's example HTTP worker (it names its slot and pid in
//! `X-Forkpool-Slot` and `X-Forkpool-Pid`, and `?work_ms=N` sleeps).
//!
//! A worker that keeps its record on the scoreboard serves its own socket
//! without the supervisor. So the cases that check *who* serves stop the
//! supervisor (SIGSTOP) while they send: a helper that fell back to `R`
//! (handed each connection by the supervisor) answers nothing then, and
//! the case fails.
#![allow(dead_code)]

use std::io::Read;
use std::net::TcpStream;
use std::time::Duration;

use crate::common::{
    killed_by, parse_response, require_kernel_dispatch, send, signal_pid, total, DemoPool, Response,
};

/// The longest wait for a state or an answer that should come at once.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// A pool of `children` workers running `cmd` in kernel dispatch, once
/// all are idle; None (under CI: a failure) where the kernel refuses the
/// eBPF program.
pub fn kernel_pool(children: u64, extra: &[&str], cmd: &[&str]) -> Option<DemoPool> {
    let n = children.to_string();
    let mut args = vec![
        "--dispatch",
        "kernel",
        "--min-children",
        &n,
        "--max-children",
        &n,
        "--min-spare",
        "0",
        "--max-spare",
        &n,
    ];
    // A stopped worker is not taken for a hung one, unless `extra` says.
    if !extra.contains(&"--ping-timeout") {
        args.extend(["--ping-timeout", "20s"]);
    }
    args.extend_from_slice(extra);
    let pool = DemoPool::start_run(&args, cmd);
    if !require_kernel_dispatch(&pool) {
        return None;
    }
    assert!(
        pool.wait_status(PATIENCE, |s| s["idle"] == children && s["starting"] == 0)
            .is_some(),
        "the workers never became idle: {}\n{}",
        pool.status(),
        pool.stderr.dump()
    );
    Some(pool)
}

/// The cases every helper passes, as one `#[test]` each (and, given
/// `with_preload`, the case of workers forked by a template). `$run` takes a
/// case (`fn(&[&str])`) and runs it on the helper's worker command, or
/// does nothing where the helper cannot run (and fails under CI).
#[allow(unused_macros)] // not every test file that uses the cases runs all six
macro_rules! every_helper_case {
    ($run:expr) => {
        #[test]
        fn sequential_requests_all_go_to_slot_zero() {
            ($run)(kernel_helper_cases::sequential_requests_all_go_to_slot_zero);
        }

        #[test]
        fn a_burst_lands_one_request_per_idle_worker() {
            ($run)(kernel_helper_cases::a_burst_lands_one_request_per_idle_worker);
        }

        #[test]
        fn a_killed_worker_loses_nothing_queued_on_its_socket() {
            ($run)(kernel_helper_cases::a_killed_worker_loses_nothing_queued_on_its_socket);
        }

        #[test]
        fn workers_leave_after_their_share_and_nothing_is_lost() {
            ($run)(kernel_helper_cases::workers_leave_after_their_share_and_nothing_is_lost);
        }

        #[test]
        fn quit_serves_what_was_queued_on_the_own_socket() {
            ($run)(kernel_helper_cases::quit_serves_what_was_queued_on_the_own_socket);
        }

        #[test]
        fn idle_workers_answer_pings() {
            ($run)(kernel_helper_cases::idle_workers_answer_pings);
        }

        #[test]
        fn a_leaking_worker_leaves_before_its_table_fills() {
            ($run)(kernel_helper_cases::a_leaking_worker_leaves_before_its_table_fills);
        }

        #[test]
        fn a_leaking_worker_leaves_before_its_table_fills_in_handoff() {
            ($run)(kernel_helper_cases::a_leaking_worker_leaves_before_its_table_fills_in_handoff);
        }

        #[test]
        fn a_growing_worker_leaves_before_another_connection() {
            ($run)(kernel_helper_cases::a_growing_worker_leaves_before_another_connection);
        }

        #[test]
        fn an_old_worker_leaves_before_another_connection() {
            ($run)(kernel_helper_cases::an_old_worker_leaves_before_another_connection);
        }
    };
    // A helper with templates (`--preload`) passes one case more.
    ($run:expr, with_preload) => {
        kernel_helper_cases::every_helper_case!($run);

        #[test]
        fn preloaded_workers_keep_the_board_too() {
            ($run)(kernel_helper_cases::preloaded_workers_keep_the_board_too);
        }

        #[test]
        fn a_growing_preloaded_worker_leaves_before_another_connection() {
            ($run)(
                kernel_helper_cases::a_growing_preloaded_worker_leaves_before_another_connection,
            );
        }
    };
}
#[allow(unused_imports)]
pub(crate) use every_helper_case;

/// The supervisor stopped (SIGSTOP) for as long as this lives.
pub struct SupervisorStopped(i32);

impl SupervisorStopped {
    pub fn new(pool: &DemoPool) -> SupervisorStopped {
        signal_pid(pool.pid, "STOP");
        SupervisorStopped(pool.pid)
    }
}

impl Drop for SupervisorStopped {
    fn drop(&mut self) {
        signal_pid(self.0, "CONT");
    }
}

/// The answer on `conn`, read to its end within 5 s (else: nobody took it).
pub fn answer(mut conn: TcpStream) -> Result<Response, String> {
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut raw = String::new();
    conn.read_to_string(&mut raw)
        .map_err(|e| format!("no answer within 5 s: {e}"))?;
    parse_response(&raw)
}

/// A `GET` with `Connection: close`, answered within 5 s.
pub fn get(pool: &DemoPool, path: &str) -> Result<Response, String> {
    answer(send(pool.addr, path))
}

/// The worker in `slot` (its pid), from status.
pub fn pid_in_slot(status: &serde_json::Value, slot: u64) -> i32 {
    status["slots"]
        .as_array()
        .and_then(|all| all.iter().find(|s| s["slot"] == slot))
        .and_then(|s| s["pid"].as_i64())
        .unwrap_or_else(|| panic!("no worker in slot {slot}: {status}")) as i32
}

/// What status says slot `slot` served.
pub fn slot_served(status: &serde_json::Value, slot: u64) -> u64 {
    status["slots"]
        .as_array()
        .and_then(|all| all.iter().find(|s| s["slot"] == slot))
        .and_then(|s| s["served"].as_u64())
        .unwrap_or(0)
}

/// No worker was killed (a `B`, `N` or `M` from a `K` worker is a protocol
/// violation) or died, and the pool is in kernel dispatch.
pub fn assert_clean(status: &serde_json::Value) {
    assert_eq!(killed_by(status, "misbehaved"), 0, "{status}");
    assert_eq!(total(status, "killed"), 0, "{status}");
    assert_eq!(total(status, "died"), 0, "{status}");
    assert!(status.get("dispatch_fallback").is_none(), "{status}");
}

/// 30 sequential requests with the supervisor stopped: all answered by
/// slot 0 (the lowest idle worker, which goes idle on the board before it
/// closes each connection). Woken, the supervisor reads the 30 the worker
/// took itself from the board.
pub fn sequential_requests_all_go_to_slot_zero(cmd: &[&str]) {
    sequential_requests_all_go_to_slot_zero_with(&[], cmd);
}

/// [`sequential_requests_all_go_to_slot_zero`], the pool run with `extra`
/// options (`--preload`).
pub fn sequential_requests_all_go_to_slot_zero_with(extra: &[&str], cmd: &[&str]) {
    let Some(pool) = kernel_pool(3, extra, cmd) else {
        return;
    };
    let before = slot_served(&pool.status(), 0);
    let slots: Vec<Result<Option<usize>, String>> = {
        let _stopped = SupervisorStopped::new(&pool);
        let mut slots = Vec::new();
        // Up to the first failure: one unanswered request says enough.
        while slots.len() < 30 && slots.last().is_none_or(Result::is_ok) {
            slots.push(get(&pool, "/").map(|r| r.slot));
        }
        slots
    };
    assert_eq!(slots, vec![Ok(Some(0)); 30], "{}", pool.stderr.dump());
    let status = pool
        .wait_status(PATIENCE, |s| total(s, "accepted") >= 30)
        .unwrap_or_else(|| panic!("the board's counts never reached status: {}", pool.status()));
    assert_eq!(total(&status, "accepted"), 30, "{status}");
    assert_eq!(slot_served(&status, 0) - before, 30, "{status}");
    assert_clean(&status);
}

/// Under `--preload` a worker the template forked says `K` too and is
/// sent its seat (`S`: its own sockets and the board): slot 0 serves every
/// request, the supervisor stopped.
pub fn preloaded_workers_keep_the_board_too(cmd: &[&str]) {
    sequential_requests_all_go_to_slot_zero_with(&["--preload"], cmd);
}

/// Four slow requests at once to four idle workers, the supervisor
/// stopped: the kernel reserves a different worker for each.
pub fn a_burst_lands_one_request_per_idle_worker(cmd: &[&str]) {
    let Some(pool) = kernel_pool(4, &[], cmd) else {
        return;
    };
    let status = pool.status();
    let before: Vec<u64> = (0..4).map(|slot| slot_served(&status, slot)).collect();
    let mut slots: Vec<usize> = {
        let _stopped = SupervisorStopped::new(&pool);
        let sent: Vec<_> = (0..4).map(|_| send(pool.addr, "/?work_ms=300")).collect();
        sent.into_iter()
            .map(|conn| {
                let r = answer(conn).unwrap_or_else(|e| panic!("{e}\n{}", pool.stderr.dump()));
                r.slot.expect("X-Forkpool-Slot")
            })
            .collect()
    };
    slots.sort_unstable();
    assert_eq!(slots, [0, 1, 2, 3], "{}", pool.stderr.dump());
    let status = pool
        .wait_status(PATIENCE, |s| total(s, "accepted") >= 4)
        .unwrap_or_else(|| panic!("the board's counts never reached status: {}", pool.status()));
    for (slot, before) in before.iter().enumerate() {
        assert_eq!(slot_served(&status, slot as u64) - before, 1, "{status}");
    }
    assert_clean(&status);
}

/// A stopped worker in slot 0 is reserved for the first connection,
/// which waits on its own socket; the next goes to slot 1 (both with the
/// supervisor stopped too). SIGKILLed, the
/// worker loses nothing: the supervisor accepts what was queued on its
/// socket and hands it on.
pub fn a_killed_worker_loses_nothing_queued_on_its_socket(cmd: &[&str]) {
    let Some(pool) = kernel_pool(2, &[], cmd) else {
        return;
    };
    let first = pid_in_slot(&pool.status(), 0);
    signal_pid(first, "STOP");
    let (queued, next) = {
        let _stopped = SupervisorStopped::new(&pool);
        let queued = send(pool.addr, "/");
        (queued, get(&pool, "/"))
    };
    let next = next.unwrap_or_else(|e| panic!("the second request: {e}"));
    assert_eq!(next.slot, Some(1), "{}", pool.stderr.dump());
    signal_pid(first, "KILL");
    let answer = answer(queued).expect("the queued connection was answered");
    assert_eq!(answer.status, 200);
    assert_ne!(answer.pid, Some(first));
    assert!(pool.wait_total("died", 1, PATIENCE), "{}", pool.status());
}

/// `max_requests_per_child` 5 and 20 sequential requests: every one is
/// answered, and each worker that served its share leaves (`X`, a
/// retirement) and is replaced.
pub fn workers_leave_after_their_share_and_nothing_is_lost(cmd: &[&str]) {
    let Some(pool) = kernel_pool(1, &["--max-requests-per-child", "5"], cmd) else {
        return;
    };
    let mut pids = Vec::new();
    for i in 0..20 {
        let r = get(&pool, "/").unwrap_or_else(|e| panic!("request {i}: {e}"));
        assert_eq!(r.status, 200, "request {i}");
        pids.push(r.pid.expect("X-Forkpool-Pid"));
    }
    pids.dedup();
    assert!(pids.len() >= 4, "20 requests, 5 a worker: {pids:?}");
    let status = pool
        .wait_status(PATIENCE, |s| total(s, "retired") >= 3 && s["idle"] == 1)
        .unwrap_or_else(|| panic!("the workers were not replaced: {}", pool.status()));
    assert_clean(&status);
}

/// `Q` (here from a reload, `HUP`) to a worker with a connection the
/// kernel queued on its own socket just before: the worker serves it
/// before it exits. The worker is stopped while the connection is queued
/// and the roll tells it to quit, so both wait for it when it wakes.
pub fn quit_serves_what_was_queued_on_the_own_socket(cmd: &[&str]) {
    let Some(pool) = kernel_pool(2, &[], cmd) else {
        return;
    };
    let first = pid_in_slot(&pool.status(), 0);
    signal_pid(first, "STOP");
    let queued = send(pool.addr, "/");
    signal_pid(pool.pid, "HUP");
    let told = pool.wait_status(PATIENCE, |s| {
        s["slots"].as_array().is_some_and(|all| {
            all.iter()
                .any(|w| w["pid"] == first && w["state"] == "retiring")
        })
    });
    signal_pid(first, "CONT");
    assert!(
        told.is_some(),
        "the worker was never told to quit: {}",
        pool.status()
    );
    let answer = answer(queued).expect("the queued connection was answered");
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.pid,
        Some(first),
        "served by the worker it was queued for"
    );
    let status = pool
        .wait_status(PATIENCE, |s| {
            total(s, "retired") >= 2 && s["idle"] == 2 && s["generation"] == 2
        })
        .unwrap_or_else(|| panic!("the old workers did not all leave: {}", pool.status()));
    assert_clean(&status);
}

/// Idle workers answer the supervisor's pings (every 200 ms, 1 s to
/// answer) while they wait on their own sockets: watched for 2 s, none is
/// killed for silence and each was heard from within the last second.
pub fn idle_workers_answer_pings(cmd: &[&str]) {
    let pings = ["--ping-interval", "200ms", "--ping-timeout", "1s"];
    let Some(pool) = kernel_pool(2, &pings, cmd) else {
        return;
    };
    let first = [
        pid_in_slot(&pool.status(), 0),
        pid_in_slot(&pool.status(), 1),
    ];
    let watch = std::time::Instant::now() + Duration::from_secs(2);
    let mut status = pool.status();
    while std::time::Instant::now() < watch {
        status = pool.status();
        let now = [pid_in_slot(&status, 0), pid_in_slot(&status, 1)];
        assert_eq!(now, first, "a worker was replaced: {status}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(killed_by(&status, "ping_timeout"), 0, "{status}");
    for slot in status["slots"].as_array().expect("slots") {
        assert!(slot["last_heard_ms"].as_u64() < Some(1000), "{status}");
    }
    assert_clean(&status);
}

/// A reconnect test's answers, (`X-Forkpool-Slot`, `Connection`) each:
/// every one from slot 0 and saying `Connection: close`; then the
/// supervisor counted them all and the pool is clean.
pub fn assert_reconnects_stayed(
    pool: &DemoPool,
    label: &str,
    answers: &[(Option<String>, Option<String>)],
) {
    let elsewhere = answers
        .iter()
        .filter(|(slot, _)| slot.as_deref() != Some("0"))
        .count();
    assert_eq!(
        elsewhere,
        0,
        "{label}: {elsewhere} of {} reconnects left slot 0: {answers:?}",
        answers.len()
    );
    assert!(
        answers
            .iter()
            .all(|(_, connection)| connection.as_deref() == Some("close")),
        "{label}: every answer ends its connection"
    );
    let status = pool
        .wait_status(PATIENCE, |s| {
            crate::common::total(s, "accepted") >= answers.len() as u64
        })
        .unwrap_or_else(|| panic!("not all counted: {}", pool.status()));
    assert_clean(&status);
}

/// A worker whose handler leaks descriptors (`?leak_fds=4`, the example
/// worker run with `--chaos` under `prlimit --nofile=64`) leaves before its
/// table fills (docs/protocol.md, "Running out of descriptors"): 30
/// requests are all answered `200` (a full table would fail the handler's
/// opens with 500, or an accept), by three workers or more, and the ones
/// that went said `X` (retired), none died or was killed.
pub fn a_leaking_worker_leaves_before_its_table_fills(cmd: &[&str]) {
    leaking_worker_leaves_in(&["--dispatch", "kernel"], cmd);
}

/// [`a_leaking_worker_leaves_before_its_table_fills`] in `handoff`, where a
/// full table would also drop the descriptor of a connection handed over.
pub fn a_leaking_worker_leaves_before_its_table_fills_in_handoff(cmd: &[&str]) {
    leaking_worker_leaves_in(&["--dispatch", "handoff"], cmd);
}

fn leaking_worker_leaves_in(dispatch: &[&str], cmd: &[&str]) {
    let mut leaky = vec!["prlimit", "--nofile=64:64"];
    leaky.extend_from_slice(cmd);
    leaky.push("--chaos");
    let mut args = dispatch.to_vec();
    args.extend(["--min-children", "1", "--max-children", "1"]);
    args.extend(["--min-spare", "0", "--max-spare", "1"]);
    let pool = DemoPool::start_run(&args, &leaky);
    if dispatch.contains(&"kernel") && !require_kernel_dispatch(&pool) {
        return;
    }
    let mut pids = std::collections::BTreeSet::new();
    for n in 0..30 {
        let r = get(&pool, "/?leak_fds=4")
            .unwrap_or_else(|e| panic!("request {n}: {e}\n{}", pool.stderr.dump()));
        assert_eq!(r.status, 200, "request {n}\n{}", pool.stderr.dump());
        pids.insert(r.pid.expect("X-Forkpool-Pid"));
    }
    assert!(pids.len() >= 3, "no worker left in time: {pids:?}");
    let status = pool
        .wait_status(PATIENCE, |s| total(s, "retired") >= 2)
        .unwrap_or_else(|| panic!("the workers did not retire: {}", pool.status()));
    assert_clean(&status);
}

/// What one `?grow_mib` request (or the demo's `?chaos=growN`) adds to a
/// worker's unshared memory, in MiB, and the limit the memory cases set.
pub const GROWTH_MIB: u64 = 30;
pub const MEMORY_LIMIT_MIB: u64 = 64;

/// The most requests one worker may serve in the memory cases. A worker
/// checks its memory after each connection and leaves, still busy on the
/// board, once its USS is above the limit; so it serves the request that
/// takes it over, and none after. It starts with some USS B ≥ 0 and holds
/// B + 30·k MiB after k requests: over 64 MiB at k = 3 whatever B is
/// (90 > 64), and already at k = 2 when B > 4 MiB. So no worker serves a
/// 4th: it would have been taken at more than limit + one request's
/// growth.
pub const MOST_PER_WORKER: usize = (MEMORY_LIMIT_MIB / GROWTH_MIB) as usize + 1;

/// A worker (the example worker run with `--chaos`, `?grow_mib=30`) that
/// grows 30 MiB a request under `--max-child-memory 64MiB`, sent 6
/// requests back to back (each as soon as the previous one answered),
/// with the supervisor stopped all the while: nothing but the worker's own
/// check after each connection can keep it from the next one. No worker
/// serves more than [`MOST_PER_WORKER`]; the three workers between them
/// serve all six. Woken, the supervisor counts the first worker's exit as
/// a memory recycle (`totals.recycled_memory`, its USS read by the
/// supervisor itself) and replaces it.
pub fn a_growing_worker_leaves_before_another_connection(cmd: &[&str]) {
    let chaotic = [cmd, &["--chaos"]].concat();
    memory_limit_holds(
        |children, extra| kernel_pool(children, extra, &chaotic),
        &format!("/?grow_mib={GROWTH_MIB}"),
    );
}

/// [`a_growing_worker_leaves_before_another_connection`], the workers
/// forked by a template (`--preload`): they find the limit in the
/// environment they inherit from it.
pub fn a_growing_preloaded_worker_leaves_before_another_connection(cmd: &[&str]) {
    let chaotic = [cmd, &["--chaos"]].concat();
    memory_limit_holds(
        |children, extra| kernel_pool(children, &[extra, &["--preload"]].concat(), &chaotic),
        &format!("/?grow_mib={GROWTH_MIB}"),
    );
}

/// The memory case on the pools `pool_of(children, extra options)` makes,
/// `grow` the path of a request that grows the worker by [`GROWTH_MIB`].
pub fn memory_limit_holds(pool_of: impl Fn(u64, &[&str]) -> Option<DemoPool>, grow: &str) {
    let limit = format!("{MEMORY_LIMIT_MIB}MiB");
    let Some(pool) = pool_of(3, &["--max-child-memory", &limit]) else {
        return;
    };
    let first = pid_in_slot(&pool.status(), 0);
    let pids: Vec<i32> = {
        let _stopped = SupervisorStopped::new(&pool);
        (0..6)
            .map(|i| {
                let r = get(&pool, grow)
                    .unwrap_or_else(|e| panic!("request {i}: {e}\n{}", pool.stderr.dump()));
                assert_eq!(r.status, 200, "request {i}: {}", r.body);
                r.pid.expect("X-Forkpool-Pid")
            })
            .collect()
    };
    let mut served: std::collections::BTreeMap<i32, usize> = Default::default();
    for pid in &pids {
        *served.entry(*pid).or_default() += 1;
    }
    assert!(
        served.values().all(|&n| n <= MOST_PER_WORKER),
        "a worker served more than {MOST_PER_WORKER} requests of {GROWTH_MIB} MiB each under a \
         {MEMORY_LIMIT_MIB} MiB limit (pid: requests): {served:?}\n{}",
        pool.stderr.dump()
    );
    let status = pool
        .wait_status(PATIENCE, |s| {
            total(s, "recycled_memory") >= 1
                && s["idle"] == 3
                && s["slots"]
                    .as_array()
                    .is_some_and(|all| all.iter().all(|w| w["pid"] != first))
        })
        .unwrap_or_else(|| {
            panic!(
                "the first worker ({first}) was not recycled for its memory: {}\n{}",
                pool.status(),
                pool.stderr.dump()
            )
        });
    assert_clean(&status);
}

/// The lifetime the lifetime case sets, and what the supervisor may add to
/// it per worker (a tenth, drawn at random).
const LIFETIME: Duration = Duration::from_secs(2);
const MOST_LIFETIME: Duration = Duration::from_millis(2200);

/// `--max-child-lifetime 2s`, one worker, short requests sent back to
/// back from before its lifetime ends until well after, the supervisor
/// stopped until 0.3 s after the latest the lifetime can end: nothing but
/// the worker's own check after each connection can keep it from the
/// next one. Of the requests sent after its lifetime surely ended (its
/// start is read off `/proc` and status, its end is at most 2.2 s after
/// its `K`), it serves at most one: one that found it idle as its lifetime
/// ended. Woken, the supervisor counts its exit as a lifetime recycle and
/// replaces it; every request is answered.
pub fn an_old_worker_leaves_before_another_connection(cmd: &[&str]) {
    lifetime_limit_holds(|children, extra| kernel_pool(children, extra, cmd));
}

/// The lifetime case on the pools `pool_of(children, extra options)` makes.
pub fn lifetime_limit_holds(pool_of: impl Fn(u64, &[&str]) -> Option<DemoPool>) {
    let lifetime = format!("{}ms", LIFETIME.as_millis());
    let Some(pool) = pool_of(1, &["--max-child-lifetime", &lifetime]) else {
        return;
    };
    let status = pool.status();
    let first = pid_in_slot(&status, 0);
    // Its `K` came at most this long after its fork (its fork is no
    // earlier than the supervisor's clock of its start, its `K` no later
    // than the supervisor's reading of it), and the fork within the clock
    // tick /proc gives it.
    let ready_after = status["slots"][0]["ready_after_ms"]
        .as_u64()
        .unwrap_or_else(|| panic!("no ready_after_ms: {status}"));
    let expires = started_at(first) + TICK + Duration::from_millis(ready_after) + MOST_LIFETIME;
    let wake = expires + Duration::from_millis(300);
    let stop_sending = expires + Duration::from_millis(600);
    let mut sent: Vec<(Duration, i32)> = Vec::new();
    {
        let _stopped = SupervisorStoppedUntil::new(&pool, wake);
        while since_boot() < stop_sending && sent.len() < 1000 {
            let at = since_boot();
            let r = get(&pool, "/?work_ms=5")
                .unwrap_or_else(|e| panic!("a request: {e}\n{}", pool.stderr.dump()));
            assert_eq!(r.status, 200, "{}", r.body);
            sent.push((at, r.pid.expect("X-Forkpool-Pid")));
        }
    }
    // Sent a clock tick after its end, at least (/proc/uptime reads low).
    let late: Vec<Duration> = sent
        .iter()
        .filter(|&&(at, pid)| pid == first && at > expires + TICK)
        .map(|&(at, _)| at.saturating_sub(expires))
        .collect();
    assert!(
        late.len() <= 1,
        "the worker {first} served {} requests sent after its lifetime ({lifetime}, at most \
         {MOST_LIFETIME:?} drawn) had ended, this long after: {late:?}\n{}",
        late.len(),
        pool.stderr.dump()
    );
    assert!(
        sent.iter().any(|&(_, pid)| pid == first),
        "the worker never served: {sent:?}"
    );
    let status = pool
        .wait_status(PATIENCE, |s| {
            total(s, "recycled_lifetime") >= 1 && s["slots"][0]["pid"] != first
        })
        .unwrap_or_else(|| {
            panic!(
                "the worker ({first}) was not recycled for its age: {}\n{}",
                pool.status(),
                pool.stderr.dump()
            )
        });
    assert_clean(&status);
}

/// The resolution of `/proc`'s process start times and of `/proc/uptime`.
const TICK: Duration = Duration::from_millis(10);

/// The time since boot, as `/proc/uptime` says (to 10 ms, rounded down).
fn since_boot() -> Duration {
    let text = std::fs::read_to_string("/proc/uptime").expect("/proc/uptime");
    let seconds: f64 = text
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .expect("a number in /proc/uptime");
    Duration::from_secs_f64(seconds)
}

/// When process `pid` started, since boot (its `/proc/PID/stat` field 22,
/// in clock ticks of 10 ms, rounded down).
fn started_at(pid: i32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the worker's stat");
    let after_name = stat.rsplit_once(')').expect("stat has a name").1;
    let ticks: u64 = after_name
        .split_whitespace()
        .nth(19)
        .and_then(|t| t.parse().ok())
        .expect("a start time in stat");
    TICK * ticks as u32
}

/// The supervisor stopped (SIGSTOP) until `until` (time since boot) or
/// until this is dropped, whichever comes first: a thread wakes it.
pub struct SupervisorStoppedUntil {
    waker: Option<std::thread::JoinHandle<()>>,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl SupervisorStoppedUntil {
    pub fn new(pool: &DemoPool, until: Duration) -> SupervisorStoppedUntil {
        let pid = pool.pid;
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        signal_pid(pid, "STOP");
        let dropped = done.clone();
        let waker = std::thread::spawn(move || {
            while since_boot() < until && !dropped.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            signal_pid(pid, "CONT");
        });
        SupervisorStoppedUntil {
            waker: Some(waker),
            done,
        }
    }
}

impl Drop for SupervisorStoppedUntil {
    fn drop(&mut self) {
        self.done.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(waker) = self.waker.take() {
            let _ = waker.join();
        }
    }
}
