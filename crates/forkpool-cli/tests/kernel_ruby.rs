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

#[path = "common/kernel_helper_cases.rs"]
mod kernel_helper_cases;
#[path = "common/psgi_support.rs"]
mod psgi_support;
#[path = "common/rack_support.rs"]
mod rack_support;

use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{total, DemoPool, Response};
use kernel_helper_cases::{
    assert_clean, assert_reconnects_stayed, get, kernel_pool, pid_in_slot, SupervisorStopped,
};
use psgi_support::{connect, kept_alive, read_response, reconnecting_at_once};
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

/// `kernel_pool` of the example worker; None when Ruby is missing.
fn ruby_pool(children: &str, extra: &[&str]) -> Option<DemoPool> {
    if !require_ruby() {
        return None;
    }
    kernel_pool(children.parse().unwrap(), extra, &ruby_worker())
}

/// `kernel_pool` (EXTRA pool options) of forkpool-rack (SERVER_ARGS) on
/// the Sinatra test app; None when Ruby, Rack or Sinatra is missing.
fn rack_pool(children: &str, extra: &[&str], server_args: &[&str]) -> Option<DemoPool> {
    if !require_sinatra() {
        return None;
    }
    kernel_pool(children.parse().unwrap(), extra, &rack_command(server_args))
}

/// The cases every helper passes (`common/kernel_helper_cases.rs`), on
/// the example worker.
fn on_the_example_worker(case: fn(&[&str])) {
    if require_ruby() {
        case(&ruby_worker());
    }
}

kernel_helper_cases::every_helper_case!(on_the_example_worker);

/// `--preload` or nothing.
fn preload_args(preload: bool) -> &'static [&'static str] {
    if preload {
        &["--preload"]
    } else {
        &[]
    }
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
        let _stopped = SupervisorStopped::new(pool);
        (0..10).map(|_| get(pool, "/").map(|r| r.slot)).collect()
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
    assert_clean(&status);
    for i in 0..5 {
        let r = get(pool, "/").unwrap_or_else(|e| panic!("request {i}: {e}"));
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
    assert_eq!(get(&pool, "/").map(|r| r.status), Ok(200));
    pool.signal(15);
    let exit = pool.wait_exit(PATIENCE).expect("the supervisor exited");
    assert!(exit.success(), "{exit:?}\n{}", pool.stderr.dump());
    let totals = common::final_totals(&pool);
    assert_eq!(total(&totals, "retired"), 3, "{totals}");
    assert_eq!(total(&totals, "killed"), 0, "{totals}");
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
        let _stopped = SupervisorStopped::new(pool);
        let slots: Vec<Option<usize>> = (0..10)
            .map(|_| get(pool, "/").expect("an answer").slot)
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
    assert_clean(&status);
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
    let mut kept = kept_alive(&pool);
    let (answer, waited) = {
        let _stopped = SupervisorStopped::new(&pool);
        let started = Instant::now();
        (get(&pool, "/?name=b"), started.elapsed())
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
    assert_clean(&status);
}

/// A client told `Connection: close` that reconnects the moment it has
/// the answer, without waiting for the close, lands on the same worker
/// every time: forkpool-rack goes idle just before a connection's last
/// answer goes out (`Worker#ending_connection`), not after the close, so
/// the kernel finds slot 0 idle again. Going idle after the close, the
/// reconnect races the worker's finish and lands on slot 1 (or the
/// overflow). Exec'd and under `--preload`, the supervisor stopped.
#[test]
fn a_client_reconnecting_at_once_finds_its_worker_idle() {
    const ROUNDS: usize = 100;
    for preload in [false, true] {
        let Some(pool) = rack_pool(
            "2",
            preload_args(preload),
            &["--no-access-log", "--max-requests-per-connection", "1"],
        ) else {
            return;
        };
        let answers = {
            let _stopped = SupervisorStopped::new(&pool);
            reconnecting_at_once(&pool, ROUNDS, b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        };
        assert_reconnects_stayed(&pool, &format!("preload {preload}"), &answers);
    }
}

/// REMOTE_ADDR and REMOTE_PORT name the client of each connection a
/// forkpool-rack worker accepts itself (its accept makes no Addrinfo: the
/// address comes from the connection): from its own socket, exec'd and
/// under `--preload`, with the supervisor stopped, and from the overflow
/// as it gives way.
#[test]
fn the_rack_server_names_the_client_of_what_it_accepts() {
    for preload in [false, true] {
        let Some(pool) = rack_pool("1", preload_args(preload), &["--keepalive-turn", "0"]) else {
            return;
        };
        let answers: Vec<(String, String)> = {
            let _stopped = SupervisorStopped::new(&pool);
            (0..3)
                .map(|_| {
                    let mut conn = connect(&pool);
                    conn.write_all(b"GET /env HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                        .unwrap();
                    let peer = conn.local_addr().unwrap().to_string();
                    (read_response(&mut conn, false).body_text(), peer)
                })
                .collect()
        };
        for (body, peer) in answers {
            assert!(
                body.ends_with(&format!(" {peer}\n")),
                "preload {preload}: {body:?} does not name {peer}"
            );
        }
        // A kept-alive connection holds the one worker; the next client
        // waits on the overflow, and the worker takes it from there.
        let mut kept = connect(&pool);
        kept.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        assert_eq!(read_response(&mut kept, false).status, 200);
        let (body, peer) = {
            let _stopped = SupervisorStopped::new(&pool);
            let mut waiting = connect(&pool);
            waiting
                .write_all(b"GET /env HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                .unwrap();
            let peer = waiting.local_addr().unwrap().to_string();
            (read_response(&mut waiting, false).body_text(), peer)
        };
        assert!(
            body.ends_with(&format!(" {peer}\n")),
            "preload {preload}: {body:?} does not name {peer}"
        );
        let status = pool
            .wait_status(PATIENCE, |s| total(s, "taken_next") >= 1)
            .unwrap_or_else(|| panic!("not taken from the overflow: {}", pool.status()));
        assert_clean(&status);
    }
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
        assert_eq!(get(&pool, "/").map(|r| r.status), Ok(200));
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
        let _stopped = SupervisorStopped::new(&pool);
        (0..3).map(|_| get(&pool, "/")).collect()
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
    assert_clean(&pool.status());
}

/// Writes a file that maps like a board of two slots: the magic, the
/// slot count, every other word zero.
fn write_two_slot_board(path: &std::path::Path) {
    let mut board = vec![0u8; 4096];
    board[..8].copy_from_slice(b"fkpbrd01");
    board[8..16].copy_from_slice(&2u64.to_le_bytes());
    std::fs::write(path, &board).unwrap();
}

/// Word 5 on a file mapped like the board (`clients/ruby/test/board_test.rb`):
/// a worker at or beyond the dispatch bound leaves the overflow alone; and
/// the record's words read as stored, through an IO::Buffer mapping and
/// through the Fiddle pointer alike.
#[test]
fn a_finishing_worker_keeps_to_the_dispatch_width() {
    if !require_ruby() {
        return;
    }
    rack_support::minitest(
        "test/board_test.rb",
        "2 runs, 12 assertions, 0 failures, 0 errors",
    );
}

/// The worker's two looks after a connection, on real descriptors
/// (`clients/ruby/test/worker_test.rb`): whether the descriptor at the
/// reserve's start is free (a copy asked for there lands on it only then,
/// and is closed again), and what waits, a message from the supervisor
/// before a connection.
#[test]
fn the_looks_after_a_connection_see_the_table_and_the_channel_first() {
    if !require_ruby() {
        return;
    }
    rack_support::minitest(
        "test/worker_test.rb",
        "4 runs, 15 assertions, 0 failures, 0 errors",
    );
}

/// The memory and lifetime limits a worker checks itself after each
/// connection (`clients/ruby/test/limits_test.rb`): its own memory past
/// the limit is seen, memory it shares with its parent is not, a lifetime
/// ends; `smaps_rollup` is read only when the rule says (every small case,
/// modelled runs of connections, a preloaded worker at most every 100 ms);
/// a worker past one stays busy, says `X` and waits until the supervisor
/// lets it go.
#[test]
fn a_worker_checks_its_own_limits_after_each_connection() {
    if !require_ruby() {
        return;
    }
    rack_support::minitest(
        "test/limits_test.rb",
        "13 runs, 30 assertions, 0 failures, 0 errors",
    );
}

/// A connection waiting on the overflow, on a file mapped like the board:
/// the ending's look sees it (the worker stays busy), and the finish takes
/// it without looking again; outside the dispatch width (word 5) neither
/// looks. Words 3 and 4 are never read nor written: Ruby has no atomic add
/// of its own, and without it the words would never say that nothing waits.
#[test]
fn the_endings_look_at_the_overflow_is_the_finishs() {
    if !require_ruby() {
        return;
    }
    let script = r##"require "forkpool/worker"
        $looks = 0
        Forkpool::Worker.prepend(Module.new { def connection_waiting?(*) = ($looks += 1; super) })
        file = File.open(ARGV[0], "r+")
        board = Forkpool::Board.new(file.fileno, 1)
        ours, _theirs = UNIXSocket.pair(:SEQPACKET)
        overflow = TCPServer.new("127.0.0.1", 0)
        worker = Forkpool::Worker.allocate
        { board: board, channel: ours, version: 1, max_requests: 0, served_here: 0, leaving: false,
          overflow: [overflow], serving: 0 }.each { |name, value| worker.instance_variable_set("@#{name}", value) }
        seen = []
        ending = lambda do
          board.busy!
          $looks = 0
          worker.ending_connection
          state = board.state
          following = worker.send(:finish_on_board, 0)
          worker.instance_variable_set(:@headroom_checked, false)
          seen << "#{state}/#{following ? "took" : "none"}/#{$looks}"
          following&.close
        end
        ending.call # nothing waits: idle early, no look at the finish
        client = TCPSocket.new("127.0.0.1", overflow.addr[1])
        ending.call # one waits: busy, taken at the finish, one look in all
        client.close
        client = TCPSocket.new("127.0.0.1", overflow.addr[1])
        file.pwrite([1].pack("Q<"), 40) # word 5: slot 1 is outside the width
        ending.call # neither looks; idle early
        puts "#{seen.join(" ")} #{file.pread(16, 24).unpack("Q<2").join(",")}""##;
    assert_eq!(
        ruby_on_a_board("overflow-look", script),
        "1/none/1 0/took/1 1/none/0 0,0"
    );
}

/// Told to quit, a worker serves what the kernel queued on its own socket
/// busy: a connection's ending there must not store idle (the kernel would
/// queue more on a worker about to exit). On a file mapped like the board,
/// the handler calls `Worker#ending_connection` and reads the state.
#[test]
fn a_connection_served_on_quit_never_goes_idle_early() {
    if !require_ruby() {
        return;
    }
    let script = r##"require "forkpool/worker"
        file = File.open(ARGV[0], "r+")
        board = Forkpool::Board.new(file.fileno, 1)
        ours, _theirs = UNIXSocket.pair(:SEQPACKET)
        own = TCPServer.new("127.0.0.1", 0)
        client = TCPSocket.new("127.0.0.1", own.addr[1])
        worker = Forkpool::Worker.allocate
        { board: board, channel: ours, version: 1, max_requests: 0, served_here: 0,
          leaving: false, listeners: [own] }.each { |name, value| worker.instance_variable_set("@#{name}", value) }
        seen = []
        worker.send(:drain_own_sockets, ->(_conn, _listener) { worker.ending_connection; seen << board.state })
        client.close
        puts "#{seen.join(" ")} #{board.state}""##;
    assert_eq!(ruby_on_a_board("ending-on-quit", script), "0 0");
}

/// Runs the Ruby `script` with the helper on its load path and, as
/// `ARGV[0]`, a fresh file mapped like a two-slot board; what it printed,
/// trimmed, once it has exited 0.
fn ruby_on_a_board(name: &str, script: &str) -> String {
    let path = common::temp_path(name);
    write_two_slot_board(&path);
    let out = Command::new("ruby")
        .args(["-I", RUBY_DIR, "-e", script])
        .arg(&path)
        .output()
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `Worker#ending_connection` on a file mapped like the board: a worker
/// whose connection is ending goes idle at once (and says `I` when word 2
/// asks), except when this connection is its share, when it is leaving,
/// or when a connection waits on the overflow listener it serves.
#[test]
fn a_connection_ending_goes_idle_early_only_when_nothing_else_is_due() {
    if !require_ruby() {
        return;
    }
    let script = r#"require "forkpool/worker"
        file = File.open(ARGV[0], "r+")
        board = Forkpool::Board.new(file.fileno, 1)
        ours, theirs = UNIXSocket.pair(:SEQPACKET)
        overflow = TCPServer.new("127.0.0.1", 0)
        ending = lambda do |max: 0, served: 0, leaving: false|
          worker = Forkpool::Worker.allocate
          { board: board, channel: ours, version: 1, max_requests: max, served_here: served,
            leaving: leaving, overflow: [overflow], serving: 0 }.each { |name, value| worker.instance_variable_set("@#{name}", value) }
          board.busy!
          worker.ending_connection
          board.state
        end
        seen = [ending.call, ending.call(max: 2, served: 1), ending.call(max: 3, served: 1),
                ending.call(leaving: true)]
        client = TCPSocket.new("127.0.0.1", overflow.addr[1]) # one waits on the overflow
        seen << ending.call
        overflow.accept.close
        client.close
        file.pwrite([1].pack("Q<"), 16) # word 2: the supervisor waits for I
        seen << ending.call
        seen << theirs.recv_nonblock(16, exception: false).inspect
        seen << theirs.recv_nonblock(16, exception: false).inspect
        puts seen.join(" ")"#;
    assert_eq!(
        ruby_on_a_board("ending", script),
        r#"1 0 1 0 0 1 "\x01I" :wait_readable"#
    );
}

/// When forkpool-rack's response calls `ending` (the worker going idle
/// early): before its one write when that write completes the answer and
/// is small, else after the last write; never on a kept-alive connection
/// or with `rack.after_reply` callbacks to run.
#[test]
fn a_last_answer_goes_idle_before_its_write_only_when_the_write_will_not_wait() {
    if !require_ruby() {
        return;
    }
    let script = r#"require "forkpool/rack_server"
        Conn = Struct.new(:events) do
          def write(_data, _timeout) = events << "write"
        end
        request = Forkpool::HTTP.parse_head("GET / HTTP/1.1\r\nHost: x\r\n\r\n".b, Forkpool::HTTP::Limits.defaults)
        run = lambda do |body, keepalive: false, length: true, after_reply: []|
          events = []
          response = Forkpool::RackResponse.new(Conn.new(events), request, 5.0, keepalive,
                                                -> { events << "ending" }, after_reply)
          headers = length ? { "content-length" => body.sum(&:bytesize).to_s } : {}
          response.send(200, headers, body, false)
          events.join(",")
        end
        big = "x" * (Forkpool::RackResponse::ENDING_WRITE_MAX + 1)
        puts [run.call(["hello
"]), run.call([big]), run.call(["a", "b"].each, length: false),
              run.call(["hello
"], keepalive: true), run.call(["hello
"], after_reply: [-> {}])].join(" ")"#;
    let out = Command::new("ruby")
        .args(["-I", RUBY_DIR, "-e", script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "ending,write write,ending write,write,ending write write"
    );
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
        write_two_slot_board(&path);
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
