//! The built-in HTTP load generator.
//!
//! A closed loop at fixed concurrency: each of `concurrency` connections
//! sends a request, waits for the whole response, records it, and sends the
//! next one at once. The connections are spread over a few client threads,
//! each running its own `mio` event loop (non-blocking sockets), so 256
//! connections cost two threads on a two-core machine rather than 256
//! blocked threads whose context switches would be charged to the server
//! under test.
//!
//! A run is a warm-up followed by a measurement window. Only what completes
//! inside the window counts: requests still in flight when it closes are
//! dropped, so `requests / window` is the throughput.
//!
//! Latency is measured from the moment the client starts a request until its
//! last byte arrives. In `close` mode that includes `connect()` (and so the
//! time the connection waits in the server's accept backlog); in `keepalive`
//! mode it is from writing the request, except for the first request on each
//! connection, which also includes its connect. Being a closed loop, a stalled
//! server slows the clients down instead of piling up requests, so latencies
//! under overload are optimistic (coordinated omission), like wrk's.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use serde::{Deserialize, Serialize};

use super::http::{self, Response};
use super::latency;
use super::target::Target;

/// How requests use connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConnectionMode {
    /// A new connection per request, `Connection: close`.
    Close,
    /// Requests follow each other on one connection while the server agrees.
    KeepAlive,
}

impl ConnectionMode {
    /// The name used in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            ConnectionMode::Close => "close",
            ConnectionMode::KeepAlive => "keepalive",
        }
    }
}

/// One load run.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// The server and the path to request.
    pub target: Target,
    /// Close per request or keep-alive.
    pub connection: ConnectionMode,
    /// Connections open at once, each with one request outstanding.
    pub concurrency: usize,
    /// Load before the window opens; nothing in it is counted.
    pub warmup: Duration,
    /// The measurement window.
    pub duration: Duration,
    /// A request not answered this long after it started is a `timeout`
    /// error; its connection is dropped and a new one opened.
    pub timeout: Duration,
    /// A request unanswered this long when the window closes is `stalled`.
    pub stall: Duration,
    /// Client threads (at least 1, at most `concurrency`).
    pub threads: usize,
    /// Keep every completed response as a [`Sample`] (for the scale-up run).
    pub trace: bool,
}

impl LoadSpec {
    /// A spec with the usual timeout and one client thread per core (at most
    /// one per connection).
    pub fn new(
        target: Target,
        connection: ConnectionMode,
        concurrency: usize,
        warmup: Duration,
        duration: Duration,
    ) -> LoadSpec {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        LoadSpec {
            target,
            connection,
            concurrency,
            warmup,
            duration,
            timeout: Duration::from_secs(5),
            stall: Duration::from_secs(1),
            threads: cores.min(concurrency).max(1),
            trace: false,
        }
    }
}

/// Failed requests inside the window, by what went wrong.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ErrorCounts {
    /// `connect()` refused (nothing listening, or the backlog overflowed).
    pub refused: u64,
    /// The connection was reset or closed before a whole response arrived.
    pub reset: u64,
    /// No whole response within the timeout.
    pub timeout: u64,
    /// Still unanswered when the window closed, after more than
    /// [`LoadSpec::stall`]: a request stuck for longer than the rest of the
    /// window would otherwise leave no trace.
    pub stalled: u64,
    /// A whole response whose status was not 200.
    pub bad_status: u64,
    /// Bytes that are not an HTTP response we can frame.
    pub malformed: u64,
    /// Any other socket error.
    pub other: u64,
}

impl ErrorCounts {
    /// All errors.
    pub fn total(&self) -> u64 {
        self.refused
            + self.reset
            + self.timeout
            + self.stalled
            + self.bad_status
            + self.malformed
            + self.other
    }

    fn add(&mut self, other: &ErrorCounts) {
        self.refused += other.refused;
        self.reset += other.reset;
        self.timeout += other.timeout;
        self.stalled += other.stalled;
        self.bad_status += other.bad_status;
        self.malformed += other.malformed;
        self.other += other.other;
    }

    fn count(&mut self, kind: Failure) {
        let slot = match kind {
            Failure::Refused => &mut self.refused,
            Failure::Reset => &mut self.reset,
            Failure::Timeout => &mut self.timeout,
            Failure::Stalled => &mut self.stalled,
            Failure::BadStatus => &mut self.bad_status,
            Failure::Malformed => &mut self.malformed,
            Failure::Other => &mut self.other,
        };
        *slot += 1;
    }
}

/// One completed response, kept when [`LoadSpec::trace`] is set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// When the request started, from the start of the run.
    pub sent: Duration,
    /// How long until its last byte arrived.
    pub latency: Duration,
    /// The response status.
    pub status: u16,
    /// The `X-Forkpool-Slot` that answered, if the server said.
    pub slot: Option<u32>,
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct LoadOutcome {
    /// When the load started; [`Sample::sent`] counts from here.
    pub started: Instant,
    /// Status-200 responses completed inside the window.
    pub requests: u64,
    /// The window's length.
    pub window: Duration,
    /// Latencies of those requests, in microseconds.
    pub latency: Histogram<u64>,
    /// Failures inside the window.
    pub errors: ErrorCounts,
    /// Whole responses of any status over the entire run, warm-up included
    /// (for checking the generator against a server's own count).
    pub completed: u64,
    /// Every completed response, in no particular order, if traced.
    pub samples: Vec<Sample>,
}

impl LoadOutcome {
    /// Requests per second in the window.
    pub fn rate(&self) -> f64 {
        self.requests as f64 / self.window.as_secs_f64().max(1e-9)
    }
}

/// A moment in a run, reported to the caller from the coordinating thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The warm-up is over; counting starts now.
    WindowStart,
    /// Counting stops now.
    WindowEnd,
}

/// Runs the load described by `spec`, calling `on_phase` as the measurement
/// window opens and closes (so the caller can take its own snapshots there).
pub fn run(spec: &LoadSpec, on_phase: &mut dyn FnMut(Phase)) -> Result<LoadOutcome, String> {
    if spec.concurrency == 0 {
        return Err("concurrency must be at least 1".to_string());
    }
    let threads = spec.threads.clamp(1, spec.concurrency);
    let start = Instant::now();
    let clock = Clock {
        start,
        window_start: start + spec.warmup,
        window_end: start + spec.warmup + spec.duration,
    };
    let request = http::request(&spec.target, spec.connection == ConnectionMode::KeepAlive);
    let tallies = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let connections =
                    spec.concurrency / threads + usize::from(t < spec.concurrency % threads);
                let request = &request;
                std::thread::Builder::new()
                    .name(format!("loadgen-{t}"))
                    .spawn_scoped(scope, move || {
                        Client::new(spec, request, clock, connections)?.run()
                    })
                    .map_err(|e| format!("cannot start a client thread: {e}"))
            })
            .collect();
        sleep_until(clock.window_start);
        on_phase(Phase::WindowStart);
        sleep_until(clock.window_end);
        on_phase(Phase::WindowEnd);
        workers
            .into_iter()
            .map(|w| {
                w?.join()
                    .map_err(|_| "a client thread panicked".to_string())?
            })
            .collect::<Result<Vec<Tally>, String>>()
    })?;
    let mut outcome = LoadOutcome {
        started: start,
        requests: 0,
        window: spec.duration,
        latency: latency::histogram(),
        errors: ErrorCounts::default(),
        completed: 0,
        samples: Vec::new(),
    };
    for tally in tallies {
        outcome.requests += tally.requests;
        outcome.completed += tally.completed;
        outcome.errors.add(&tally.errors);
        outcome
            .latency
            .add(&tally.latency)
            .map_err(|e| format!("cannot merge histograms: {e}"))?;
        outcome.samples.extend(tally.samples);
    }
    Ok(outcome)
}

fn sleep_until(when: Instant) {
    let now = Instant::now();
    if when > now {
        std::thread::sleep(when - now);
    }
}

#[derive(Debug, Clone, Copy)]
struct Clock {
    start: Instant,
    window_start: Instant,
    window_end: Instant,
}

impl Clock {
    fn in_window(&self, t: Instant) -> bool {
        t >= self.window_start && t < self.window_end
    }
}

/// Why a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    Refused,
    Reset,
    Timeout,
    Stalled,
    BadStatus,
    Malformed,
    Other,
}

impl Failure {
    fn of(e: &io::Error) -> Failure {
        match e.kind() {
            io::ErrorKind::ConnectionRefused => Failure::Refused,
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof => Failure::Reset,
            io::ErrorKind::TimedOut => Failure::Timeout,
            _ => Failure::Other,
        }
    }
}

/// What one client thread counted.
struct Tally {
    requests: u64,
    completed: u64,
    errors: ErrorCounts,
    latency: Histogram<u64>,
    samples: Vec<Sample>,
}

/// Where a connection is in its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Connecting,
    Writing,
    Reading,
    /// After a failure: reconnect at the next housekeeping pass, so a dead
    /// server costs a connect attempt per connection every few milliseconds
    /// rather than a busy loop.
    Backoff,
}

struct Conn {
    stream: Option<TcpStream>,
    stage: Stage,
    sent_at: Instant,
    written: usize,
    buf: Vec<u8>,
}

/// How often a client thread looks for timed-out requests and backed-off
/// connections; also the longest it sleeps in `poll`.
const HOUSEKEEPING: Duration = Duration::from_millis(5);

/// One client thread: an event loop over its share of the connections.
struct Client<'a> {
    spec: &'a LoadSpec,
    request: &'a [u8],
    clock: Clock,
    poll: Poll,
    conns: Vec<Conn>,
    tally: Tally,
}

impl<'a> Client<'a> {
    fn new(
        spec: &'a LoadSpec,
        request: &'a [u8],
        clock: Clock,
        connections: usize,
    ) -> Result<Self, String> {
        let poll = Poll::new().map_err(|e| format!("cannot create a poller: {e}"))?;
        let conns = (0..connections)
            .map(|_| Conn {
                stream: None,
                stage: Stage::Backoff,
                sent_at: clock.start,
                written: 0,
                buf: Vec::with_capacity(1024),
            })
            .collect();
        Ok(Client {
            spec,
            request,
            clock,
            poll,
            conns,
            tally: Tally {
                requests: 0,
                completed: 0,
                errors: ErrorCounts::default(),
                latency: latency::histogram(),
                samples: Vec::new(),
            },
        })
    }

    fn run(mut self) -> Result<Tally, String> {
        let mut events = Events::with_capacity(1024);
        for i in 0..self.conns.len() {
            self.open(i);
        }
        let mut next_housekeeping = Instant::now() + HOUSEKEEPING;
        loop {
            let now = Instant::now();
            if now >= self.clock.window_end {
                self.count_stalled(now);
                return Ok(self.tally);
            }
            if now >= next_housekeeping {
                self.housekeeping(now);
                next_housekeeping = now + HOUSEKEEPING;
            }
            let wait = next_housekeeping
                .min(self.clock.window_end)
                .saturating_duration_since(now);
            match self.poll.poll(&mut events, Some(wait)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("poll failed: {e}")),
            }
            for event in events.iter() {
                self.advance(event.token().0);
            }
        }
    }

    /// Times out stalled requests and reopens backed-off connections.
    fn housekeeping(&mut self, now: Instant) {
        for i in 0..self.conns.len() {
            let Conn { stage, sent_at, .. } = self.conns[i];
            if stage == Stage::Backoff {
                self.open(i);
            } else if now.saturating_duration_since(sent_at) >= self.spec.timeout {
                self.fail(i, Failure::Timeout);
                self.open(i);
            }
        }
    }

    /// Counts the requests left unanswered for long at the window's end.
    fn count_stalled(&mut self, now: Instant) {
        let stall = self.spec.stall;
        let stalled = self
            .conns
            .iter()
            .filter(|c| {
                c.stage != Stage::Backoff && now.saturating_duration_since(c.sent_at) >= stall
            })
            .count();
        for _ in 0..stalled {
            self.tally.errors.count(Failure::Stalled);
        }
    }

    /// Starts a request on a fresh connection.
    fn open(&mut self, i: usize) {
        self.close(i);
        let conn = &mut self.conns[i];
        conn.sent_at = Instant::now();
        conn.written = 0;
        conn.buf.clear();
        let registered = TcpStream::connect(self.spec.target.addr).and_then(|mut stream| {
            let interest = Interest::READABLE | Interest::WRITABLE;
            self.poll
                .registry()
                .register(&mut stream, Token(i), interest)?;
            Ok(stream)
        });
        match registered {
            Ok(stream) => {
                // Requests are single small writes; Nagle would only delay them.
                let _ = stream.set_nodelay(true);
                conn.stream = Some(stream);
                conn.stage = Stage::Connecting;
            }
            Err(e) => self.fail(i, Failure::of(&e)),
        }
    }

    fn close(&mut self, i: usize) {
        if let Some(mut stream) = self.conns[i].stream.take() {
            let _ = self.poll.registry().deregister(&mut stream);
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// Counts a failure of connection `i`'s request and backs it off.
    fn fail(&mut self, i: usize, failure: Failure) {
        self.close(i);
        self.conns[i].stage = Stage::Backoff;
        if self.clock.in_window(Instant::now()) {
            self.tally.errors.count(failure);
        }
    }

    /// Moves connection `i` on as far as its socket allows.
    fn advance(&mut self, i: usize) {
        if self.conns[i].stage == Stage::Connecting {
            match self.connect_result(i) {
                Ok(true) => self.conns[i].stage = Stage::Writing,
                Ok(false) => return,
                Err(e) => return self.fail(i, Failure::of(&e)),
            }
        }
        match self.conns[i].stage {
            Stage::Writing => self.send(i),
            Stage::Reading => self.read_response(i),
            Stage::Connecting | Stage::Backoff => {}
        }
    }

    /// Writes the request; once it is all out, waits for the response (its
    /// arrival is a fresh readable edge, so there is nothing to read yet).
    fn send(&mut self, i: usize) {
        match self.write_request(i) {
            Ok(true) => self.conns[i].stage = Stage::Reading,
            Ok(false) => {}
            Err(e) => self.fail(i, Failure::of(&e)),
        }
    }

    /// Whether the non-blocking connect has finished (`Ok(false)`: not yet).
    fn connect_result(&mut self, i: usize) -> io::Result<bool> {
        let Some(stream) = self.conns[i].stream.as_ref() else {
            return Ok(false);
        };
        if let Some(e) = stream.take_error()? {
            return Err(e);
        }
        match stream.peer_addr() {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Writes what is left of the request (`Ok(false)`: the socket is full).
    fn write_request(&mut self, i: usize) -> io::Result<bool> {
        let conn = &mut self.conns[i];
        let Some(stream) = conn.stream.as_mut() else {
            return Ok(false);
        };
        while conn.written < self.request.len() {
            match stream.write(&self.request[conn.written..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => conn.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Reads until the socket is drained or a whole response is in.
    fn read_response(&mut self, i: usize) {
        let mut chunk = [0u8; 4096];
        loop {
            let conn = &mut self.conns[i];
            let Some(stream) = conn.stream.as_mut() else {
                return;
            };
            match stream.read(&mut chunk) {
                // Closed before a whole response: a server that drops a
                // keep-alive connection without saying `Connection: close`
                // lands here too, and it did lose our request.
                Ok(0) => return self.fail(i, Failure::Reset),
                Ok(n) => conn.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return self.fail(i, Failure::of(&e)),
            }
            match http::parse_response(&conn.buf) {
                Ok(Some(response)) => return self.complete(i, response),
                Ok(None) => {}
                Err(_) => return self.fail(i, Failure::Malformed),
            }
        }
    }

    /// Records a whole response and starts the connection's next request.
    fn complete(&mut self, i: usize, response: Response) {
        let now = Instant::now();
        let sent_at = self.conns[i].sent_at;
        let latency = now - sent_at;
        self.tally.completed += 1;
        if self.spec.trace {
            self.tally.samples.push(Sample {
                sent: sent_at - self.clock.start,
                latency,
                status: response.status,
                slot: response.slot,
            });
        }
        if self.clock.in_window(now) {
            if response.status == 200 {
                self.tally.requests += 1;
                latency::record(&mut self.tally.latency, latency);
            } else {
                self.tally.errors.count(Failure::BadStatus);
            }
        }
        let reuse = self.spec.connection == ConnectionMode::KeepAlive
            && response.keep_alive
            && self.conns[i].buf.len() == response.len;
        if !reuse {
            return self.open(i);
        }
        let conn = &mut self.conns[i];
        conn.buf.clear();
        conn.written = 0;
        conn.sent_at = now;
        conn.stage = Stage::Writing;
        self.send(i);
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_server::TestServer;
    use super::*;

    fn spec(server: &TestServer, connection: ConnectionMode) -> LoadSpec {
        let mut spec = LoadSpec::new(
            Target::at(server.addr(), "/"),
            connection,
            4,
            Duration::ZERO,
            Duration::from_millis(1000),
        );
        spec.threads = 2;
        spec
    }

    fn check_counts_agree(connection: ConnectionMode) {
        let server = TestServer::start();
        let mut phases = vec![];
        let outcome = run(&spec(&server, connection), &mut |p| phases.push(p)).unwrap();
        // Let the server finish writing what it had in hand.
        std::thread::sleep(Duration::from_millis(50));
        let served = server.responses();
        assert_eq!(phases, [Phase::WindowStart, Phase::WindowEnd]);
        assert_eq!(outcome.errors, ErrorCounts::default(), "{connection:?}");
        assert!(
            outcome.requests > 100,
            "{connection:?}: only {} requests",
            outcome.requests
        );
        // No warm-up and all 200: only what completed in the last batch of
        // events after the window closed is left out.
        assert!(outcome.requests <= outcome.completed && outcome.completed <= outcome.requests + 4);
        assert_eq!(outcome.latency.len(), outcome.requests);
        // A response the server wrote as the window closed may be unread.
        assert!(
            served >= outcome.completed && served <= outcome.completed + 4,
            "{connection:?}: server wrote {served}, client completed {}",
            outcome.completed
        );
        let connections = server.connections();
        match connection {
            ConnectionMode::Close => assert!(connections >= outcome.completed),
            ConnectionMode::KeepAlive => assert_eq!(connections, 4),
        }
    }

    #[test]
    fn counts_agree_with_the_server_closing_per_request() {
        check_counts_agree(ConnectionMode::Close);
    }

    #[test]
    fn counts_agree_with_the_server_keeping_alive() {
        check_counts_agree(ConnectionMode::KeepAlive);
    }

    #[test]
    fn warmup_is_not_counted_and_slots_are_traced() {
        let server = TestServer::start();
        let mut spec = spec(&server, ConnectionMode::KeepAlive);
        spec.warmup = Duration::from_millis(200);
        spec.duration = Duration::from_millis(300);
        spec.trace = true;
        let outcome = run(&spec, &mut |_| {}).unwrap();
        assert!(outcome.requests > 0 && outcome.requests < outcome.completed);
        assert_eq!(outcome.samples.len() as u64, outcome.completed);
        assert!(outcome
            .samples
            .iter()
            .all(|s| s.status == 200 && s.slot.is_some()));
        let rate = outcome.rate();
        assert!((rate - outcome.requests as f64 / 0.3).abs() < 1e-6);
    }

    #[test]
    fn errors_by_kind() {
        // Nothing listens on a port we bound and released.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let mut spec = LoadSpec::new(
            Target::at(closed, "/"),
            ConnectionMode::Close,
            2,
            Duration::ZERO,
            Duration::from_millis(100),
        );
        let outcome = run(&spec, &mut |_| {}).unwrap();
        assert_eq!(outcome.requests, 0);
        assert!(outcome.errors.refused > 0);
        assert_eq!(outcome.errors.total(), outcome.errors.refused);

        let server = TestServer::start();
        spec.target = Target::at(server.addr(), "/status/503");
        let outcome = run(&spec, &mut |_| {}).unwrap();
        assert_eq!(outcome.requests, 0);
        assert!(outcome.errors.bad_status > 0);
        assert_eq!(outcome.errors.total(), outcome.errors.bad_status);

        spec.target = Target::at(server.addr(), "/?work_ms=300");
        spec.timeout = Duration::from_millis(50);
        spec.duration = Duration::from_millis(200);
        let outcome = run(&spec, &mut |_| {}).unwrap();
        assert!(outcome.errors.timeout >= 2, "{:?}", outcome.errors);

        spec.target = Target::at(server.addr(), "/?work_ms=5000");
        spec.timeout = Duration::from_secs(5);
        spec.duration = Duration::from_millis(300);
        spec.stall = Duration::from_secs(1);
        let outcome = run(&spec, &mut |_| {}).unwrap();
        assert_eq!(outcome.errors.stalled, 0, "{:?}", outcome.errors);
        spec.stall = Duration::from_millis(100);
        let outcome = run(&spec, &mut |_| {}).unwrap();
        assert_eq!(outcome.errors.stalled, 2, "{:?}", outcome.errors);
        assert_eq!(outcome.errors.total(), 2, "{:?}", outcome.errors);

        spec.target = Target::at(server.addr(), "/truncate");
        spec.timeout = Duration::from_secs(5);
        let outcome = run(&spec, &mut |_| {}).unwrap();
        assert!(outcome.errors.reset > 0, "{:?}", outcome.errors);
        assert_eq!(outcome.errors.total(), outcome.errors.reset);
    }
}
