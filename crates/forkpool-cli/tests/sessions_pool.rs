//! Children that hold many sessions each (`forkpool demo --sessions`): a new
//! connection goes to the lowest child with room, the pool grows and
//! shrinks by spare capacity, and children that die are replaced.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{kill9, DemoPool};

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

/// Waits until every slot in `slots` has sent its first load report.
fn wait_ready(pool: &DemoPool, slots: &[usize]) {
    for slot in slots {
        assert!(
            pool.stderr
                .wait_for(&format!("load report slot={slot} open=0"), WAIT),
            "slot {slot} never reported its load\n{}",
            pool.stderr.dump()
        );
    }
}

/// Waits until the supervisor has heard slot `slot` report `open` sessions
/// for the `nth` time with nothing on its way.
fn wait_load(pool: &DemoPool, slot: usize, open: u32, nth: usize) {
    let needle = format!("load report slot={slot} open={open} capacity=");
    let settled = |line: &str| line.contains(&needle) && line.ends_with("in_flight=0");
    let deadline = Instant::now() + WAIT;
    while pool.stderr.dump().lines().filter(|l| settled(l)).count() < nth {
        assert!(
            Instant::now() < deadline,
            "slot {slot} never reported {open} open\n{}",
            pool.stderr.dump()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
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
        wait_load(&pool, 0, n, 1);
    }
    let slots: Vec<usize> = first.iter().map(|c| c.slot).collect();
    assert_eq!(slots, vec![0, 0, 0], "{}", pool.stderr.dump());
    let next: Vec<LineClient> = (0..2).map(|_| LineClient::connect(pool.addr)).collect();
    let slots: Vec<usize> = next.iter().map(|c| c.slot).collect();
    assert_eq!(slots, vec![1, 1], "slot 0 is full");

    // One of slot 0's sessions ends: once the supervisor knows, slot 0 is
    // the lowest with room again.
    first.pop().unwrap().quit();
    wait_load(&pool, 0, 2, 2);
    let again = LineClient::connect(pool.addr);
    assert_eq!(again.slot, 0, "{}", pool.stderr.dump());
    assert_eq!(again.pid, first[0].pid);

    // The sessions all still talk.
    for client in first.iter_mut() {
        assert_eq!(client.command("NOOP"), "250 ok");
    }

    // Status shows each child's load against its capacity.
    wait_load(&pool, 0, 3, 1);
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

    // Each full child leaves less than one child's worth of free places:
    // a new child is started, and the next sessions go there.
    // (Each report is let settle: see the first test.)
    let mut on_0: Vec<LineClient> = Vec::new();
    for n in 1..=2 {
        on_0.push(LineClient::connect(pool.addr));
        wait_load(&pool, 0, n, 1);
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
        wait_load(&pool, 1, n, 1);
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
        pool.stderr
            .wait_for("child exited (surplus idle child) slot=2", WAIT),
        "{}",
        pool.stderr.dump()
    );
    assert!(pool.wait_children(WAIT, |n| n == 2));

    // One free place on slot 0 plus slot 1's two are one child's worth and
    // a half: within the band, nothing changes.
    on_0.pop().unwrap().quit();
    wait_load(&pool, 0, 1, 2);
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(pool.children().len(), 2, "{}", pool.stderr.dump());
    // Both empty: the highest goes, never below min_children.
    on_0.pop().unwrap().quit();
    assert!(
        pool.stderr
            .wait_for("child exited (surplus idle child) slot=1", WAIT),
        "{}",
        pool.stderr.dump()
    );
    assert!(pool.wait_children(WAIT, |n| n == 1));
    assert_eq!(LineClient::connect(pool.addr).slot, 0);
    assert_eq!(
        pool.stderr
            .count("child exited (surplus idle child) slot=0"),
        0
    );
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
    assert!(pool
        .stderr
        .wait_for("child died unexpectedly; a replacement", WAIT));
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
    let mut pool = DemoPool::start(&["--sessions", "--shutdown-timeout", "20s"]);
    let mut client = LineClient::connect(pool.addr);
    pool.signal(15);
    assert!(pool.stderr.wait_for("shutting down", WAIT));
    // The child took its Quit and waits for this session to end.
    std::thread::sleep(Duration::from_millis(200));
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
