//! Black-box tests of the session pool over loopback sockets, speaking the
//! demo line protocol. Threads only, no forking. Every wait is bounded.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use forkpool_cli::demo::line::{LineSession, GREETING, REFUSAL};
use forkpool_sessions::{
    Admission, CapPolicy, CloseReason, LoadHook, Session, SessionConfig, SessionPool,
    SessionStream, Step,
};

/// Upper bound on any single wait in these tests.
const PATIENCE: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------
// A session that speaks the demo protocol and lets the test watch it.

#[derive(Default)]
struct Watch {
    /// Steps begun, with a condvar to wait on.
    steps: Counter,
    /// `on_close` calls, and why.
    closes: Mutex<Vec<String>>,
    /// This many next steps panic instead of running.
    panics_left: AtomicUsize,
}

#[derive(Default)]
struct Counter {
    value: Mutex<usize>,
    changed: Condvar,
}

impl Counter {
    fn set(&self, value: usize) {
        *self.value.lock().unwrap() = value;
        self.changed.notify_all();
    }

    fn bump(&self) {
        *self.value.lock().unwrap() += 1;
        self.changed.notify_all();
    }

    fn get(&self) -> usize {
        *self.value.lock().unwrap()
    }

    /// Waits until `done(value)`; false if it takes longer than `PATIENCE`.
    fn wait_until(&self, done: impl Fn(usize) -> bool) -> bool {
        let guard = self.value.lock().unwrap();
        let (_guard, timeout) = self
            .changed
            .wait_timeout_while(guard, PATIENCE, |v| !done(*v))
            .unwrap();
        !timeout.timed_out()
    }
}

struct Probe {
    watch: Arc<Watch>,
    inner: LineSession,
}

impl Session for Probe {
    type Context = Watch;

    fn open(context: &Arc<Watch>, _stream: &SessionStream) -> Self {
        Probe {
            watch: Arc::clone(context),
            inner: LineSession::default(),
        }
    }

    fn on_open(&mut self, stream: &mut SessionStream) -> io::Result<Step> {
        self.inner.on_open(stream)
    }

    fn step(&mut self, stream: &mut SessionStream) -> io::Result<Step> {
        self.watch.steps.bump();
        let panic_now = self
            .watch
            .panics_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if panic_now {
            panic!("probe: panicking on purpose");
        }
        self.inner.step(stream)
    }

    fn on_close(&mut self, stream: &mut SessionStream, reason: &CloseReason) {
        self.watch.closes.lock().unwrap().push(reason.to_string());
        self.inner.on_close(stream, reason);
    }

    fn refuse(_context: &Watch, stream: &mut SessionStream) {
        LineSession::refuse(&(), stream);
    }
}

// ---------------------------------------------------------------------------
// Pool and client helpers.

struct Harness {
    pool: SessionPool<Probe>,
    watch: Arc<Watch>,
    /// Open sessions, as told by the load hook.
    open: Arc<Counter>,
    /// Every value the load hook was given, in order.
    load_log: Arc<Mutex<Vec<usize>>>,
    addr: SocketAddr,
}

fn config(name: &str, workers: usize) -> SessionConfig {
    SessionConfig {
        workers,
        name: name.to_string(),
        idle_timeout: None,
        ..SessionConfig::default()
    }
}

/// Starts a pool serving a fresh loopback listener.
fn serve(mut config: SessionConfig) -> Harness {
    let open = Arc::new(Counter::default());
    let load_log = Arc::new(Mutex::new(Vec::new()));
    let (gauge, log) = (Arc::clone(&open), Arc::clone(&load_log));
    config.on_load = Some(LoadHook::new(move |n| {
        log.lock().unwrap().push(n);
        gauge.set(n);
    }));
    let pool = SessionPool::<Probe>::start(config, Watch::default()).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    pool.serve(listener).unwrap();
    Harness {
        watch: Arc::clone(pool.context()),
        pool,
        open,
        load_log,
        addr,
    }
}

impl Harness {
    fn wait_open(&self, n: usize) {
        assert!(
            self.open.wait_until(|v| v == n),
            "open sessions stayed at {} instead of {n}",
            self.open.get()
        );
    }

    fn wait_steps(&self, n: usize) {
        assert!(
            self.watch.steps.wait_until(|v| v >= n),
            "only {} steps started, expected {n}",
            self.watch.steps.get()
        );
    }

    fn closes(&self) -> Vec<String> {
        self.watch.closes.lock().unwrap().clone()
    }

    /// A client that has read its greeting.
    fn client(&self) -> Client {
        let mut client = Client::connect(self.addr);
        client.expect(GREETING.trim_end());
        client
    }
}

struct Client<S = TcpStream> {
    reader: BufReader<S>,
}

impl Client<TcpStream> {
    fn connect(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        Client {
            reader: BufReader::new(stream),
        }
    }
}

impl<S: Read + Write> Client<S> {
    fn send(&mut self, text: &str) {
        self.reader.get_mut().write_all(text.as_bytes()).unwrap();
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("reply line");
        assert!(line.ends_with("\r\n"), "incomplete reply {line:?}");
        line.truncate(line.len() - 2);
        line
    }

    fn expect(&mut self, reply: &str) {
        assert_eq!(self.line(), reply);
    }

    fn command(&mut self, command: &str) -> String {
        self.send(&format!("{command}\r\n"));
        self.line()
    }

    /// The server closes the session for idleness, not before `at_least`
    /// after `since` and well within `PATIENCE`.
    fn expect_idle_close(&mut self, since: Instant, at_least: Duration) {
        self.expect("421 idle timeout, closing");
        let waited = since.elapsed();
        assert!(waited >= at_least, "closed after {waited:?}");
        assert!(waited < Duration::from_secs(3), "closed after {waited:?}");
        self.expect_closed();
    }

    /// The server closed the connection (end of file, or a reset when it
    /// closed with our input unread).
    fn expect_closed(&mut self) {
        let mut rest = Vec::new();
        match self.reader.read_to_end(&mut rest) {
            Ok(_) => assert!(rest.is_empty(), "unexpected bytes {rest:?}"),
            Err(err) => assert_eq!(err.kind(), io::ErrorKind::ConnectionReset),
        }
    }
}

/// Threads of this process whose name starts with `<pool>-`.
fn pool_threads(pool: &str) -> Vec<u32> {
    let prefix = format!("{pool}-");
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|entry| {
            let tid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).ok()?;
            comm.trim_end().starts_with(&prefix).then_some(tid)
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Tests.

#[test]
fn concurrent_sessions_each_get_their_own_replies_in_order() {
    let h = serve(SessionConfig {
        max_sessions: 100,
        ..config("t-many", 4)
    });
    let clients = 50;
    let barrier = Barrier::new(clients);
    thread::scope(|s| {
        for i in 0..clients {
            let (h, barrier) = (&h, &barrier);
            s.spawn(move || {
                let mut c = h.client();
                barrier.wait();
                // Pipelined: three commands in one write.
                c.send(&format!("NOOP\r\nWORK {}\nBOGUS{i}\r\n", i % 4));
                c.expect("250 ok");
                c.expect(&format!("250 worked {} ms", i % 4));
                c.expect("500 unknown command");
                // One at a time.
                for round in 0..5 {
                    let ms = (i + round) % 3;
                    assert_eq!(
                        c.command(&format!("WORK {ms}")),
                        format!("250 worked {ms} ms")
                    );
                }
                assert_eq!(c.command("QUIT"), "221 bye");
                c.expect_closed();
            });
        }
    });
    h.wait_open(0);
    let closes = h.closes();
    assert_eq!(closes.len(), clients);
    assert!(closes.iter().all(|r| r == "finished"), "{closes:?}");
}

#[test]
fn idle_sessions_hold_no_worker() {
    let h = serve(SessionConfig {
        max_sessions: 200,
        ..config("t-idle", 2)
    });
    let idle: Vec<Client> = (0..100).map(|_| h.client()).collect();
    h.wait_open(100);
    let mut fresh = h.client();
    let asked = Instant::now();
    assert_eq!(fresh.command("NOOP"), "250 ok");
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "NOOP took {:?} with 100 idle sessions",
        asked.elapsed()
    );
    assert_eq!(h.pool.open_sessions(), 101);
    assert_eq!(
        pool_threads("t-idle").len(),
        2,
        "2 workers and no other thread"
    );
    drop(idle);
}

#[test]
fn a_slow_step_leaves_the_other_workers_free() {
    let h = serve(config("t-slow", 2));
    let mut slow = h.client();
    let mut quick = h.client();
    let started = Instant::now();
    slow.send("WORK 1000\r\n");
    h.wait_steps(1);
    let asked = Instant::now();
    assert_eq!(quick.command("NOOP"), "250 ok");
    assert!(
        asked.elapsed() < Duration::from_millis(500),
        "NOOP waited {:?} behind a slow step",
        asked.elapsed()
    );
    slow.expect("250 worked 1000 ms");
    assert!(started.elapsed() >= Duration::from_millis(1000));
}

#[test]
fn with_every_worker_busy_the_next_step_waits() {
    let h = serve(config("t-bound", 2));
    let mut busy: Vec<Client> = (0..2).map(|_| h.client()).collect();
    let mut waiting = h.client();
    for c in &mut busy {
        c.send("WORK 600\r\n");
    }
    h.wait_steps(2);
    let asked = Instant::now();
    assert_eq!(waiting.command("NOOP"), "250 ok");
    let waited = asked.elapsed();
    assert!(
        waited >= Duration::from_millis(450),
        "NOOP answered after {waited:?} although both workers were busy for 600 ms"
    );
    assert!(waited < PATIENCE);
    for c in &mut busy {
        c.expect("250 worked 600 ms");
    }
    assert_eq!(
        pool_threads("t-bound").len(),
        2,
        "no extra worker was started"
    );
}

#[test]
fn a_peer_leaving_mid_step_is_closed_exactly_once() {
    let h = serve(config("t-gone", 2));
    let mut leaving = h.client();
    h.wait_open(1);
    leaving.send("WORK 300\r\n");
    h.wait_steps(1);
    drop(leaving);
    h.wait_open(0);
    let closes = h.closes();
    assert_eq!(closes.len(), 1, "{closes:?}");
    assert!(
        closes[0] == "finished" || closes[0].starts_with("failed"),
        "{closes:?}"
    );
    // The pool still serves, and shutting down does not close it again.
    assert_eq!(h.client().command("NOOP"), "250 ok");
    h.pool.shutdown();
    let closes = h.watch.closes.lock().unwrap();
    assert_eq!(closes.len(), 2, "{closes:?}");
}

#[test]
fn an_idle_session_is_closed_after_the_timeout_and_activity_resets_it() {
    let h = serve(SessionConfig {
        idle_timeout: Some(Duration::from_millis(500)),
        ..config("t-timeout", 2)
    });
    let mut idle = h.client();
    let greeted = Instant::now();
    let mut active = h.client();
    thread::scope(|s| {
        s.spawn(|| {
            // Pacing, not synchronisation: keep talking well within the
            // timeout, for longer than it.
            let mut answered = Instant::now();
            for _ in 0..8 {
                thread::sleep(Duration::from_millis(100));
                let sent = Instant::now();
                let reply = active.command("NOOP");
                // Says whether this thread was held up or the pool was.
                assert_eq!(
                    reply,
                    "250 ok",
                    "sent {:?} after the last answer, answered {:?} later",
                    sent - answered,
                    sent.elapsed()
                );
                answered = Instant::now();
            }
        });
        idle.expect_idle_close(greeted, Duration::from_millis(450));
    });
    assert_eq!(h.closes(), vec!["idle timeout".to_string()]);
    assert_eq!(active.command("NOOP"), "250 ok");
}

#[test]
fn beyond_the_cap_the_refuse_policy_explains_and_closes() {
    let h = serve(SessionConfig {
        max_sessions: 2,
        cap_policy: CapPolicy::Refuse,
        ..config("t-refuse", 2)
    });
    let mut first = h.client();
    let _second = h.client();
    h.wait_open(2);
    assert!(!h.pool.has_capacity());

    let mut refused = Client::connect(h.addr);
    refused.expect(REFUSAL.trim_end());
    refused.expect_closed();

    // A connection added by hand is refused the same way.
    let (ours, theirs) = UnixStream::pair().unwrap();
    assert_eq!(h.pool.add(ours).unwrap(), Admission::Refused);
    let mut peer = Client {
        reader: BufReader::new(theirs),
    };
    peer.expect(REFUSAL.trim_end());
    peer.expect_closed();
    assert_eq!(h.pool.open_sessions(), 2);

    assert_eq!(first.command("QUIT"), "221 bye");
    h.wait_open(1);
    assert_eq!(h.client().command("NOOP"), "250 ok");
    assert!(h.closes().iter().all(|r| r != "panicked"));
}

#[test]
fn beyond_the_cap_the_backlog_policy_leaves_peers_in_the_backlog() {
    let h = serve(SessionConfig {
        max_sessions: 2,
        cap_policy: CapPolicy::Backlog,
        ..config("t-backlog", 2)
    });
    let mut first = h.client();
    let _second = h.client();
    h.wait_open(2);

    // The kernel completes the handshake, but nobody greets us.
    let mut third = Client::connect(h.addr);
    third
        .reader
        .get_ref()
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut byte = [0u8; 1];
    let silent = third.reader.read(&mut byte).unwrap_err();
    assert!(
        matches!(
            silent.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ),
        "{silent}"
    );
    assert_eq!(h.pool.open_sessions(), 2);
    assert!(!h.pool.has_capacity());

    assert_eq!(first.command("QUIT"), "221 bye");
    third
        .reader
        .get_ref()
        .set_read_timeout(Some(PATIENCE))
        .unwrap();
    third.expect(GREETING.trim_end());
    assert_eq!(third.command("NOOP"), "250 ok");
    h.wait_open(2);
}

#[test]
fn under_the_backlog_policy_add_waits_for_a_place() {
    let mut config = config("t-add", 1);
    config.max_sessions = 1;
    let pool = SessionPool::<LineSession>::start(config, ()).unwrap();
    let (ours, theirs) = UnixStream::pair().unwrap();
    assert_eq!(pool.add(ours).unwrap(), Admission::Accepted);
    let mut first = Client {
        reader: BufReader::new(theirs),
    };
    first.expect(GREETING.trim_end());

    let (ours, theirs) = UnixStream::pair().unwrap();
    let mut second = Client {
        reader: BufReader::new(theirs),
    };
    thread::scope(|s| {
        let (done_tx, done_rx) = mpsc::channel();
        let pool = &pool;
        s.spawn(move || done_tx.send(pool.add(ours).unwrap()).unwrap());
        assert!(
            done_rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "add returned while the pool was full"
        );
        assert_eq!(first.command("QUIT"), "221 bye");
        assert_eq!(done_rx.recv_timeout(PATIENCE).unwrap(), Admission::Accepted);
    });
    second.expect(GREETING.trim_end());
    assert_eq!(second.command("NOOP"), "250 ok");
    pool.shutdown();
}

#[test]
fn a_panicking_step_closes_only_its_session() {
    let h = serve(config("t-panic", 2));
    let mut bystander = h.client();
    // Three panics: more than there are workers, so a lost worker would show.
    h.watch.panics_left.store(3, Ordering::SeqCst);
    for _ in 0..3 {
        let mut victim = h.client();
        victim.send("NOOP\r\n");
        victim.expect_closed();
    }
    assert_eq!(h.watch.panics_left.load(Ordering::SeqCst), 0);
    assert_eq!(bystander.command("NOOP"), "250 ok");
    let mut newcomer = h.client();
    assert_eq!(newcomer.command("WORK 1"), "250 worked 1 ms");
    h.wait_open(2);
    assert_eq!(h.closes(), vec!["panicked".to_string(); 3]);
    assert_eq!(
        pool_threads("t-panic").len(),
        2,
        "2 workers and no other thread"
    );
}

/// Per-thread CPU time (ns, from schedstat) and context switches.
fn thread_activity(tid: u32) -> (u64, u64) {
    let schedstat = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).unwrap();
    let cpu_ns = schedstat
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
    let switches = status
        .lines()
        .filter(|l| l.contains("ctxt_switches"))
        .map(|l| l.split_whitespace().last().unwrap().parse::<u64>().unwrap())
        .sum();
    (cpu_ns, switches)
}

fn activity(tids: &[u32]) -> HashMap<u32, (u64, u64)> {
    tids.iter().map(|&t| (t, thread_activity(t))).collect()
}

#[test]
fn an_idle_pool_uses_no_cpu() {
    let h = serve(config("t-cpu", 2));
    let clients: Vec<Client> = (0..20).map(|_| h.client()).collect();
    h.wait_open(20);
    let tids = pool_threads("t-cpu");
    assert_eq!(tids.len(), 2);
    // A window can catch the last hand-back settling; an idle pool shows a
    // quiet one quickly, a polling or spinning one never does.
    let mut windows = Vec::new();
    for _ in 0..5 {
        let before = activity(&tids);
        thread::sleep(Duration::from_millis(300));
        let after = activity(&tids);
        let cpu: u64 = tids.iter().map(|t| after[t].0 - before[t].0).sum();
        let wakeups: u64 = tids.iter().map(|t| after[t].1 - before[t].1).sum();
        windows.push((cpu, wakeups));
        if wakeups == 0 && cpu < 1_000_000 {
            drop(clients);
            return;
        }
    }
    panic!(
        "pool threads never stayed asleep for 300 ms: (cpu ns, wake-ups) per window {windows:?}"
    );
}

/// Times the pool's threads went to sleep (voluntary context switches).
fn sleeps(tids: &[u32]) -> u64 {
    tids.iter()
        .map(|tid| {
            let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
            status
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .unwrap()
                .trim()
                .parse::<u64>()
                .unwrap()
        })
        .sum()
}

/// Round trips of one session against a pool of `workers`: how often the
/// pool's threads slept, per command.
fn sleeps_per_command(name: &str, workers: usize) -> f64 {
    let h = serve(config(name, workers));
    let mut client = h.client();
    assert_eq!(client.command("NOOP"), "250 ok");
    let tids = pool_threads(name);
    assert_eq!(tids.len(), workers);
    const COMMANDS: u64 = 200;
    let before = sleeps(&tids);
    for _ in 0..COMMANDS {
        assert_eq!(client.command("NOOP"), "250 ok");
    }
    let slept = sleeps(&tids) - before;
    slept as f64 / COMMANDS as f64
}

#[test]
fn a_command_wakes_one_worker_which_answers_it() {
    // One worker sleeps in the poll, wakes for the command and answers it:
    // one sleep per command. (A dispatcher handing the step to a worker and
    // being handed the session back would sleep three times.)
    let one = sleeps_per_command("t-wake1", 1);
    assert!(one <= 1.5, "{one:.2} sleeps per command with one worker");
    // With two, the poller also passes the poll to the other worker before
    // it steps: two. (A dispatcher and two workers sharing a queue: four.)
    let two = sleeps_per_command("t-wake2", 2);
    assert!(two <= 2.5, "{two:.2} sleeps per command with two workers");
}

#[test]
fn a_session_parked_while_the_poller_sleeps_still_times_out() {
    // Two workers: the one that accepts and greets the only session parks
    // it while the other already sleeps in the poll, which had no deadline
    // to wake for when it went to sleep.
    let h = serve(SessionConfig {
        idle_timeout: Some(Duration::from_millis(300)),
        ..config("t-late", 2)
    });
    let greeted = Instant::now();
    let mut idle = h.client();
    idle.expect_idle_close(greeted, Duration::from_millis(250));
    assert_eq!(h.closes(), vec!["idle timeout".to_string()]);
}

#[test]
fn shutdown_finishes_running_steps_closes_sessions_and_joins_threads() {
    let h = serve(config("t-stop", 3));
    let mut idle: Vec<Client> = (0..5).map(|_| h.client()).collect();
    let mut working = h.client();
    working.send("WORK 300\r\n");
    h.wait_steps(1);
    let addr = h.addr;
    let watch = Arc::clone(&h.watch);
    assert_eq!(pool_threads("t-stop").len(), 3);

    let stopping = Instant::now();
    h.pool.shutdown();
    assert!(stopping.elapsed() < PATIENCE);
    assert!(
        pool_threads("t-stop").is_empty(),
        "threads left after shutdown"
    );

    working.expect("250 worked 300 ms");
    working.expect("421 shutting down");
    working.expect_closed();
    for c in &mut idle {
        c.expect("421 shutting down");
        c.expect_closed();
    }
    let closes = watch.closes.lock().unwrap();
    assert_eq!(*closes, vec!["pool shutdown".to_string(); 6]);
    assert!(TcpStream::connect(addr).is_err(), "listener still open");
}

#[test]
fn sessions_run_on_unix_sockets_and_bare_descriptors() {
    let pool = SessionPool::<LineSession>::start(config("t-unix", 2), ()).unwrap();
    // A Unix listener served by the pool.
    let path = std::env::temp_dir().join(format!("forkpool-sessions-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    pool.serve(UnixListener::bind(&path).unwrap()).unwrap();
    let stream = UnixStream::connect(&path).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut unix = Client {
        reader: BufReader::new(stream),
    };
    unix.expect(GREETING.trim_end());
    assert_eq!(unix.command("WORK 2"), "250 worked 2 ms");

    // A TCP connection handed over as a bare descriptor, as a supervisor
    // would pass it.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut tcp = Client::connect(listener.local_addr().unwrap());
    let (accepted, _) = listener.accept().unwrap();
    let stream = SessionStream::try_from(OwnedFd::from(accepted)).unwrap();
    assert!(matches!(stream, SessionStream::Tcp(_)));
    assert_eq!(pool.add(stream).unwrap(), Admission::Accepted);
    tcp.expect(GREETING.trim_end());
    assert_eq!(tcp.command("NOOP"), "250 ok");

    // A datagram socket is no session.
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    assert!(SessionStream::try_from(OwnedFd::from(udp)).is_err());

    assert_eq!(pool.open_sessions(), 2);
    pool.shutdown();
    let _ = std::fs::remove_file(&path);
}

#[test]
fn the_load_hook_hears_every_change_in_order() {
    let h = serve(config("t-load", 2));
    let mut clients: Vec<Client> = Vec::new();
    for n in 1..=3 {
        clients.push(h.client());
        h.wait_open(n);
    }
    for (left, mut c) in (0..3).rev().zip(clients) {
        assert_eq!(c.command("QUIT"), "221 bye");
        h.wait_open(left);
    }
    assert_eq!(*h.load_log.lock().unwrap(), vec![1, 2, 3, 2, 1, 0]);
    assert_eq!(h.pool.open_sessions(), 0);
}

#[test]
fn the_pool_handle_can_be_shared_between_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<SessionPool<LineSession>>();
    shareable::<SessionPool<Probe>>();
}

#[test]
fn a_bad_config_is_refused_with_the_field_named() {
    let err = SessionPool::<LineSession>::start(config("t-bad", 0), ()).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    assert!(err.to_string().contains("workers"), "{err}");
}

/// `running_sessions` counts the sessions a worker runs right now: a
/// `WORK` step holds a worker, and the count is back to 0 once it answered.
/// (A hook writes its answer a moment before it returns, so each count is
/// waited for, within `PATIENCE`.)
#[test]
fn running_sessions_counts_the_steps_in_progress() {
    let h = serve(config("running", 3));
    let wait_running = |n: usize, what: &str| {
        let deadline = Instant::now() + PATIENCE;
        while h.pool.running_sessions() != n {
            assert!(
                Instant::now() < deadline,
                "{what}: running stayed at {}",
                h.pool.running_sessions()
            );
            thread::sleep(Duration::from_millis(1));
        }
    };
    let mut slow = [h.client(), h.client()];
    wait_running(0, "two sessions opened, none working");
    for client in &mut slow {
        client.send("WORK 1500\r\n");
    }
    wait_running(2, "the two WORK steps");
    // An idle session costs no worker.
    let mut idle = h.client();
    assert_eq!(idle.command("NOOP"), "250 ok");
    wait_running(2, "a NOOP answered beside them");
    for client in &mut slow {
        assert!(client.line().starts_with("250"));
    }
    wait_running(0, "every step answered");
}
