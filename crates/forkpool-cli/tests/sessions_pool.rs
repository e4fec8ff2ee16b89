//! Children that hold many sessions each (`forkpool demo --sessions`): a new
//! connection goes to the lowest child with room, the pool grows and
//! shrinks by spare capacity, and children that die are replaced.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{kill9, total, DemoPool};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(10);

/// One session of the demo line protocol.
struct LineClient {
    reader: BufReader<TcpStream>,
    slot: usize,
    pid: i32,
}

impl LineClient {
    /// Connects and reads the greeting, `220 forkpool slot N pid P ready`.
    fn connect(addr: SocketAddr) -> LineClient {
        Self::try_connect(addr, WAIT).expect("a greeting")
    }

    /// Connects; `None` if no greeting arrives within `patience`.
    fn try_connect(addr: SocketAddr, patience: Duration) -> Option<LineClient> {
        let stream = TcpStream::connect_timeout(&addr, WAIT).expect("connect");
        stream.set_read_timeout(Some(patience)).unwrap();
        let mut client = LineClient {
            reader: BufReader::new(stream),
            slot: usize::MAX,
            pid: 0,
        };
        let mut greeting = String::new();
        client.reader.read_line(&mut greeting).ok()?;
        client
            .reader
            .get_ref()
            .set_read_timeout(Some(WAIT))
            .unwrap();
        client.parse_greeting(&greeting);
        Some(client)
    }

    /// Waits for the greeting of a connection that was kept waiting.
    fn finish_connect(mut self) -> LineClient {
        self.reader.get_ref().set_read_timeout(Some(WAIT)).unwrap();
        let greeting = self.line();
        self.parse_greeting(&greeting);
        self
    }

    fn parse_greeting(&mut self, greeting: &str) {
        let words: Vec<&str> = greeting.split_whitespace().collect();
        match words.as_slice() {
            ["220", "forkpool", "slot", slot, "pid", pid, "ready"] => {
                self.slot = slot.parse().unwrap();
                self.pid = pid.parse().unwrap();
            }
            _ => panic!("unexpected greeting {greeting:?}"),
        }
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("a reply line");
        line.trim_end_matches(['\r', '\n']).to_string()
    }

    fn command(&mut self, command: &str) -> String {
        write!(self.reader.get_mut(), "{command}\r\n").unwrap();
        self.line()
    }

    /// `QUIT`, then the server closes the connection.
    fn quit(mut self) {
        assert_eq!(self.command("QUIT"), "221 bye");
        assert_eq!(self.line(), "", "the server closes after QUIT");
    }
}

/// Slot `slot` in a status snapshot, if occupied.
fn slot_of(status: &Value, slot: usize) -> Option<&Value> {
    status["slots"]
        .as_array()?
        .iter()
        .find(|s| s["slot"] == slot)
}

/// The sessions the supervisor counts slot `slot` as holding (open, plus
/// any on their way to it), if the slot is occupied and has reported.
fn held(status: &Value, slot: usize) -> Option<u64> {
    slot_of(status, slot)?["sessions"][0].as_u64()
}

/// Waits until every slot in `slots` is started and holds no session.
fn wait_ready(pool: &DemoPool, slots: &[usize]) {
    for &slot in slots {
        assert!(
            pool.wait_status(WAIT, |s| {
                slot_of(s, slot).is_some_and(|e| e["state"] != "starting")
                    && held(s, slot) == Some(0)
            })
            .is_some(),
            "slot {slot} never became ready: {}\n{}",
            pool.status(),
            pool.stderr.dump()
        );
    }
}

/// Waits until the supervisor counts slot `slot` as holding `open`
/// sessions with nothing on its way (a child counts a session as open a
/// moment before it counts the connection as received, so the count
/// settles at the truth from above).
fn wait_load(pool: &DemoPool, slot: usize, open: u64) {
    assert!(
        pool.wait_status(WAIT, |s| held(s, slot) == Some(open))
            .is_some(),
        "slot {slot} never held {open}: {}\n{}",
        pool.status(),
        pool.stderr.dump()
    );
}

/// Whether everything sent to `pid` on its back-channel (the one
/// `SOCK_SEQPACKET` socket it holds) has been read: `ss` shows the
/// receive queue. `None` if that cannot be told.
fn channel_read(pid: i32) -> Option<bool> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|t| {
            let t = t.to_str()?.to_string();
            Some(t.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let out = Command::new("ss").args(["-x", "-a", "-n"]).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let queues: Vec<u64> = text
        .lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            // u_seq STATE RECV-Q SEND-Q * INODE * PEER
            (cols.first() == Some(&"u_seq")
                && inodes.iter().any(|i| cols.get(5) == Some(&i.as_str())))
            .then(|| cols.get(2)?.parse().ok())
            .flatten()
        })
        .collect();
    (!queues.is_empty()).then(|| queues.iter().all(|q| *q == 0))
}

#[test]
fn connections_go_to_the_lowest_child_with_room() {
    let pool = DemoPool::start(&[
        "--sessions",
        "--sessions-per-child",
        "3",
        "--min-children",
        "2",
    ]);
    wait_ready(&pool, &[0, 1]);
    // A child counts a new session in `open` a moment before it counts the
    // connection as received, so for that moment the supervisor sees it one
    // fuller than it is (never emptier, which could overfill it). Let each
    // report settle, so the test checks the policy, not that moment.
    let mut first: Vec<LineClient> = Vec::new();
    for n in 1..=3 {
        first.push(LineClient::connect(pool.addr));
        wait_load(&pool, 0, n);
    }
    let slots: Vec<usize> = first.iter().map(|c| c.slot).collect();
    assert_eq!(slots, vec![0, 0, 0], "{}", pool.stderr.dump());
    let next: Vec<LineClient> = (0..2).map(|_| LineClient::connect(pool.addr)).collect();
    let slots: Vec<usize> = next.iter().map(|c| c.slot).collect();
    assert_eq!(slots, vec![1, 1], "slot 0 is full");

    // One of slot 0's sessions ends: once the supervisor knows, slot 0 is
    // the lowest with room again.
    first.pop().unwrap().quit();
    wait_load(&pool, 0, 2);
    let again = LineClient::connect(pool.addr);
    assert_eq!(again.slot, 0, "{}", pool.stderr.dump());
    assert_eq!(again.pid, first[0].pid);

    // The sessions all still talk.
    for client in first.iter_mut() {
        assert_eq!(client.command("NOOP"), "250 ok");
    }

    // Status shows each child's load against its capacity.
    wait_load(&pool, 0, 3);
    let status = pool.status();
    let slot = |n: usize| {
        status["slots"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["slot"] == n)
            .cloned()
            .unwrap()
    };
    assert_eq!(slot(0)["sessions"], serde_json::json!([3, 3]), "{status}");
    assert_eq!(slot(1)["sessions"], serde_json::json!([2, 3]), "{status}");
}

#[test]
fn the_line_protocol_works_end_to_end() {
    let pool = DemoPool::start(&["--sessions", "--session-workers", "2"]);
    let mut client = LineClient::connect(pool.addr);
    assert_eq!(client.command("NOOP"), "250 ok");
    assert_eq!(client.command("work 20"), "250 worked 20 ms");
    assert_eq!(client.command("BOGUS"), "500 unknown command");
    assert_eq!(
        client.command("WORK soon"),
        "500 WORK takes milliseconds from 0 to 60000"
    );
    // Pipelined commands are answered in order.
    write!(client.reader.get_mut(), "NOOP\r\nWORK 1\r\nNOOP\r\n").unwrap();
    assert_eq!(client.line(), "250 ok");
    assert_eq!(client.line(), "250 worked 1 ms");
    assert_eq!(client.line(), "250 ok");
    client.quit();
}

#[test]
fn grows_when_capacity_runs_short_and_shrinks_when_sessions_close() {
    let pool = DemoPool::start(&[
        "--sessions",
        "--sessions-per-child",
        "2",
        "--min-children",
        "1",
        "--min-spare",
        "1",
        "--max-spare",
        "1",
        "--retire-grace",
        "200ms",
    ]);
    wait_ready(&pool, &[0]);
    assert!(pool.wait_children(WAIT, |n| n == 1));
    let first_pid = slot_of(&pool.status(), 0).unwrap()["pid"].clone();

    // Each full child leaves less than one child's worth of free places:
    // a new child is started, and the next sessions go there.
    // (Each report is let settle: see the first test.)
    let mut on_0: Vec<LineClient> = Vec::new();
    for n in 1..=2 {
        on_0.push(LineClient::connect(pool.addr));
        wait_load(&pool, 0, n);
    }
    assert!(on_0.iter().all(|c| c.slot == 0));
    assert!(
        pool.wait_children(WAIT, |n| n == 2),
        "{}",
        pool.stderr.dump()
    );
    let mut on_1: Vec<LineClient> = Vec::new();
    for n in 1..=2 {
        on_1.push(LineClient::connect(pool.addr));
        wait_load(&pool, 1, n);
    }
    assert!(on_1.iter().all(|c| c.slot == 1), "{}", pool.stderr.dump());
    assert!(
        pool.wait_children(WAIT, |n| n == 3),
        "{}",
        pool.stderr.dump()
    );
    wait_ready(&pool, &[2]);

    // Slot 1 empties: two children's worth of free places is one too many,
    // and the highest empty child (slot 2) is retired.
    for client in on_1 {
        client.quit();
    }
    assert!(
        pool.wait_status(WAIT, |s| slot_of(s, 2).is_none()
            && total(s, "retired") == 1)
            .is_some(),
        "{}",
        pool.stderr.dump()
    );
    assert!(pool.wait_children(WAIT, |n| n == 2));

    // One free place on slot 0 plus slot 1's two are one child's worth and
    // a half: within the band, nothing changes.
    on_0.pop().unwrap().quit();
    wait_load(&pool, 0, 1);
    // Nothing to wait for: watch a while that nothing is retired.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(pool.children().len(), 2, "{}", pool.stderr.dump());
    assert_eq!(total(&pool.status(), "retired"), 1);
    // Both empty: the highest goes, never below min_children.
    on_0.pop().unwrap().quit();
    let status = pool
        .wait_status(WAIT, |s| {
            slot_of(s, 1).is_none() && total(s, "retired") == 2
        })
        .unwrap_or_else(|| panic!("{}", pool.stderr.dump()));
    assert_eq!(total(&status, "killed"), 0, "{status}");
    assert!(pool.wait_children(WAIT, |n| n == 1));
    assert_eq!(LineClient::connect(pool.addr).slot, 0);
    // Slot 0 was never retired: the first child still holds it.
    assert_eq!(slot_of(&pool.status(), 0).unwrap()["pid"], first_pid);
}

#[test]
fn at_max_children_new_sessions_wait_in_the_backlog() {
    let pool = DemoPool::start(&[
        "--sessions",
        "--sessions-per-child",
        "2",
        "--min-children",
        "1",
        "--max-children",
        "1",
        "--min-spare",
        "0",
    ]);
    wait_ready(&pool, &[0]);
    let mut held: Vec<LineClient> = (0..2).map(|_| LineClient::connect(pool.addr)).collect();
    // The third connects (the kernel queues it) but is not served...
    let stream = TcpStream::connect_timeout(&pool.addr, WAIT).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut waiting = LineClient {
        reader: BufReader::new(stream),
        slot: usize::MAX,
        pid: 0,
    };
    let mut nothing = String::new();
    assert!(
        waiting.reader.read_line(&mut nothing).is_err(),
        "served beyond capacity: {nothing:?}"
    );
    // ...until a session ends.
    held.pop().unwrap().quit();
    waiting = waiting.finish_connect();
    assert_eq!(waiting.slot, 0);
    assert_eq!(waiting.command("NOOP"), "250 ok");
    assert_eq!(held[0].command("NOOP"), "250 ok");
}

#[test]
fn a_killed_child_is_replaced_and_new_sessions_still_work() {
    let pool = DemoPool::start(&[
        "--sessions",
        "--sessions-per-child",
        "4",
        "--min-children",
        "1",
    ]);
    wait_ready(&pool, &[0]);
    let mut doomed: Vec<LineClient> = (0..2).map(|_| LineClient::connect(pool.addr)).collect();
    let victim = doomed[0].pid;
    assert!(doomed.iter().all(|c| c.slot == 0 && c.pid == victim));
    kill9(victim);
    for client in doomed.iter_mut() {
        assert_eq!(client.line(), "", "the session ends with its child");
    }
    assert!(pool.wait_total("died", 1, WAIT), "{}", pool.stderr.dump());
    assert!(pool.wait_child_pids(WAIT, |pids| !pids.contains(&victim) && !pids.is_empty()));
    // The replacement may be forked before the dead child's slot is
    // free, so it can sit in another slot; it serves all the same.
    let mut fresh = LineClient::connect(pool.addr);
    assert_ne!(fresh.pid, victim);
    assert!(pool.children().contains(&fresh.pid));
    assert_eq!(fresh.command("WORK 5"), "250 worked 5 ms");
    fresh.quit();
}

#[test]
fn shutdown_lets_open_sessions_finish() {
    // `ss` (iproute2) tells when the child has read its Quit.
    if common::require_program("ss", "run bash .ci/deps/system-tools.sh (iproute2)").is_none() {
        return;
    }
    let mut pool = DemoPool::start(&["--sessions", "--shutdown-timeout", "20s"]);
    let mut client = LineClient::connect(pool.addr);
    pool.signal(15);
    // The supervisor sent the child its Quit...
    assert!(pool
        .wait_status(WAIT, |s| s["leaving"].as_u64() >= Some(1))
        .is_some());
    // ...and the child has read it (its back-channel queue is empty), so
    // the session below runs in a child that is draining.
    let deadline = Instant::now() + WAIT;
    while channel_read(client.pid) != Some(true) {
        assert!(Instant::now() < deadline, "the child never read its Quit");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(client.command("NOOP"), "250 ok");
    assert!(pool.wait_exit(Duration::from_millis(300)).is_none());
    client.quit();
    let status = pool
        .wait_exit(WAIT)
        .expect("the pool exits once sessions end");
    assert!(status.success(), "{status:?}\n{}", pool.stderr.dump());
}

#[test]
fn other_dispatch_modes_are_refused() {
    for mode in ["order", "shared"] {
        let out = Command::new(common::forkpool_bin())
            .args(["demo", "--listen", "127.0.0.1:0", "--sessions"])
            .args(["--dispatch", mode])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!(
                "dispatch {mode} cannot serve children that hold many connections"
            )) && stderr.contains("use handoff"),
            "{stderr}"
        );
        assert!(out.stdout.is_empty(), "nothing was bound");
    }
}

/// Status shows per child how many of its sessions a worker is running:
/// two `WORK` steps in progress on one child read as 2 running of 3 open
/// (within the child's 100 ms look), and 0 once they answered.
#[test]
fn status_shows_how_many_sessions_are_running() {
    let pool = DemoPool::start(&["--sessions", "--session-workers", "3"]);
    wait_ready(&pool, &[0]);
    let running = |s: &Value| slot_of(s, 0).and_then(|e| e["sessions_running"].as_u64());
    let mut idle = LineClient::connect(pool.addr);
    let mut slow: Vec<LineClient> = (0..2).map(|_| LineClient::connect(pool.addr)).collect();
    assert!(slow.iter().all(|c| c.slot == 0) && idle.slot == 0);
    assert_eq!(idle.command("NOOP"), "250 ok");
    for client in &mut slow {
        write!(client.reader.get_mut(), "WORK 3000\r\n").unwrap();
    }
    assert!(
        pool.wait_status(WAIT, |s| running(s) == Some(2) && held(s, 0) == Some(3))
            .is_some(),
        "status never showed 2 running of 3: {}",
        pool.status()
    );
    for client in &mut slow {
        assert_eq!(client.line(), "250 worked 3000 ms");
    }
    assert!(
        pool.wait_status(WAIT, |s| running(s) == Some(0)).is_some(),
        "status kept showing sessions running: {}",
        pool.status()
    );
}
