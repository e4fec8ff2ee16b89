//! The load: many milter conversations held open at once, each behaving
//! like Postfix during one SMTP session: negotiate on connect, then
//! connect, HELO, MAIL, RCPT and DATA spaced out over the session, the
//! headers, end of headers and body back to back as they stream in, end
//! of message after a pause, QUIT after another; then a new conversation
//! takes its place. All on one `mio` event loop, so the client costs the
//! same whichever filter it talks to.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use mio::{Events, Interest, Poll, Token};

use forkpool_milter::{Command, Protocol, Reply};

use super::wire::{self, Replies};

/// What the conversations do.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// Conversations held open at once.
    pub conversations: usize,
    /// How long one conversation lasts, start to QUIT.
    pub session: Duration,
    /// A command unanswered this long ends its conversation as an error.
    pub timeout: Duration,
}

/// What a measurement window saw.
#[derive(Debug)]
pub struct LoadResult {
    /// Time from a command's write to its final reply, in microseconds.
    pub latency_us: Histogram<u64>,
    /// The same for end of message alone: the one command every filter
    /// answers, and where the work is.
    pub eom_latency_us: Histogram<u64>,
    /// Messages whose end of message was answered with the header added.
    pub messages: u64,
    /// Conversations the filter closed before QUIT.
    pub lost: u64,
    /// Connections refused or failed (the filter gone, or full).
    pub refused: u64,
    /// Commands unanswered in time, wrong replies, failed writes.
    pub errors: u64,
}

impl LoadResult {
    fn new() -> LoadResult {
        LoadResult {
            latency_us: Histogram::new_with_bounds(1, 60_000_000, 3).unwrap(),
            eom_latency_us: Histogram::new_with_bounds(1, 60_000_000, 3).unwrap(),
            messages: 0,
            lost: 0,
            refused: 0,
            errors: 0,
        }
    }
}

/// One step of the script: the command byte, and whether it comes after
/// a pause (an SMTP command) or at once (message content streaming in).
const SCRIPT: [(u8, bool); 14] = [
    (b'O', false),
    (b'C', true),
    (b'H', true),
    (b'M', true),
    (b'R', true),
    (b'T', true),
    (b'L', false),
    (b'L', false),
    (b'L', false),
    (b'L', false),
    (b'N', false),
    (b'B', false),
    (b'E', true),
    (b'Q', true),
];
/// Pauses in one conversation: the session is spread over them.
const PAUSES: u32 = 7;

/// The bytes of script step `step` of conversation `n` (macros first).
fn packets(step: usize, n: u64) -> Vec<u8> {
    let id = format!("Q{n:X}");
    let client = || b"client.forkpool.test".to_vec();
    wire::encode(&match step {
        0 => vec![wire::negotiate()],
        1 => vec![
            wire::macros(
                b'C',
                &[("j", "mta.forkpool.test"), ("{daemon_name}", "bench")],
            ),
            wire::connect("client.forkpool.test", 40000, "127.0.0.1"),
        ],
        2 => vec![Command::Helo(client())],
        3 => vec![
            wire::macros(b'M', &[("i", &id), ("{mail_addr}", "s@forkpool.test")]),
            Command::Mail {
                sender: b"<s@forkpool.test>".to_vec(),
                args: Vec::new(),
            },
        ],
        4 => vec![
            wire::macros(b'R', &[("{rcpt_addr}", "ok@example.org")]),
            Command::Rcpt {
                recipient: b"<ok@example.org>".to_vec(),
                args: Vec::new(),
            },
        ],
        5 => vec![Command::Data],
        6 => vec![wire::header("From", "<s@forkpool.test>")],
        7 => vec![wire::header("To", "<ok@example.org>")],
        8 => vec![wire::header("Subject", &format!("bench {id}"))],
        9 => vec![wire::header("Message-Id", &format!("<{id}@forkpool.test>"))],
        10 => vec![Command::Eoh],
        11 => vec![Command::Body(vec![b'x'; 1024])],
        12 => vec![Command::Eom(Vec::new())],
        _ => vec![Command::Quit],
    })
}

struct Conversation {
    stream: Option<mio::net::TcpStream>,
    replies: Replies,
    /// The script step sent last, or about to be.
    step: usize,
    /// The protocol steps negotiated: left out (`NO*`), unanswered (`NR_*`).
    agreed: Protocol,
    /// Waiting for a reply to the step since then.
    sent_at: Option<Instant>,
    header_added: bool,
    /// Bumped whenever a timer set for this conversation becomes stale.
    generation: u64,
    serial: u64,
}

/// The conversations and their timers.
struct Load {
    spec: LoadSpec,
    poll: Poll,
    addr: SocketAddr,
    all: Vec<Conversation>,
    timers: BinaryHeap<Reverse<(Instant, usize, u64)>>,
    result: LoadResult,
    serial: u64,
    rng: u64,
}

/// Holds `spec.conversations` conversations against `addr` for `warmup`
/// (not counted), then for `measure`; calls `sample` about once a second
/// of the measurement. Returns what the measurement saw.
pub fn run(
    addr: SocketAddr,
    spec: &LoadSpec,
    warmup: Duration,
    measure: Duration,
    mut sample: impl FnMut(),
) -> Result<LoadResult, String> {
    let poll = Poll::new().map_err(|e| format!("cannot create a poll: {e}"))?;
    let mut load = Load {
        spec: spec.clone(),
        poll,
        addr,
        all: Vec::with_capacity(spec.conversations),
        timers: BinaryHeap::new(),
        result: LoadResult::new(),
        serial: 0,
        rng: 0x9e37_79b9_7f4a_7c15,
    };
    let start = Instant::now();
    // Arrivals spread over one session, as a steady flow would have them.
    for i in 0..spec.conversations {
        load.all.push(Conversation {
            stream: None,
            replies: Replies::default(),
            step: 0,
            agreed: Protocol::NONE,
            sent_at: None,
            header_added: false,
            generation: 0,
            serial: 0,
        });
        let at = start + load.fraction(spec.session);
        load.timers.push(Reverse((at, i, 0)));
    }
    let measuring_from = start + warmup;
    let end = measuring_from + measure;
    let mut measuring = false;
    let mut next_sample = measuring_from;
    let mut events = Events::with_capacity(1024);
    let mut next_expiry = start;
    loop {
        let now = Instant::now();
        if !measuring && now >= measuring_from {
            measuring = true;
            load.result = LoadResult::new();
        }
        if measuring && now >= next_sample {
            sample();
            next_sample += Duration::from_secs(1);
        }
        if now >= end {
            return Ok(load.result);
        }
        load.fire_timers(now);
        let next = load
            .timers
            .peek()
            .map_or(end, |Reverse((at, _, _))| *at)
            .min(end)
            .min(next_sample);
        let wait = next.saturating_duration_since(Instant::now());
        load.poll
            .poll(&mut events, Some(wait))
            .map_err(|e| format!("poll: {e}"))?;
        for event in &events {
            load.on_readable(event.token().0);
        }
        // A scan of every conversation: ten times a second is enough.
        if Instant::now() >= next_expiry {
            load.expire(Instant::now());
            next_expiry = Instant::now() + Duration::from_millis(100);
        }
    }
}

impl Load {
    /// A uniform fraction of `period`.
    fn fraction(&mut self, period: Duration) -> Duration {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        period.mul_f64((self.rng >> 11) as f64 / (1u64 << 53) as f64)
    }

    /// One pause of a session, ±20%.
    fn pause(&mut self) -> Duration {
        let base = self.spec.session / PAUSES;
        base.mul_f64(0.8) + self.fraction(base.mul_f64(0.4))
    }

    fn fire_timers(&mut self, now: Instant) {
        while let Some(Reverse((at, i, generation))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            if generation != self.all[i].generation {
                continue;
            }
            if self.all[i].stream.is_none() {
                self.open(i);
            } else {
                self.send_step(i);
            }
        }
    }

    /// Starts conversation `i` (a new one in its slot).
    fn open(&mut self, i: usize) {
        let stream = TcpStream::connect_timeout(&self.addr, self.spec.timeout)
            .and_then(|s| s.set_nonblocking(true).map(|()| s));
        let mut stream = match stream {
            Ok(s) => mio::net::TcpStream::from_std(s),
            Err(_) => {
                self.result.refused += 1;
                self.later(i);
                return;
            }
        };
        if self
            .poll
            .registry()
            .register(&mut stream, Token(i), Interest::READABLE)
            .is_err()
        {
            self.result.errors += 1;
            self.later(i);
            return;
        }
        self.serial += 1;
        let c = &mut self.all[i];
        c.stream = Some(stream);
        c.replies = Replies::default();
        c.step = 0;
        c.agreed = Protocol::NONE;
        c.header_added = false;
        c.serial = self.serial;
        self.send_step(i);
    }

    /// Sets conversation `i`'s timer one pause from now.
    fn later(&mut self, i: usize) {
        let at = Instant::now() + self.pause();
        let c = &mut self.all[i];
        c.generation += 1;
        self.timers.push(Reverse((at, i, c.generation)));
    }

    /// Sends the current step of `i`, skipping what the filter negotiated
    /// away and going straight on past what it will not answer.
    fn send_step(&mut self, i: usize) {
        loop {
            let c = &mut self.all[i];
            let (command, _) = SCRIPT[c.step];
            if wire::has(c.agreed, wire::no_bit(command)) {
                if self.advance(i) {
                    continue;
                }
                return;
            }
            let bytes = packets(c.step, c.serial);
            let stream = c.stream.as_mut().expect("an open conversation");
            let sent_at = Instant::now();
            if write_now(stream, &bytes).is_err() {
                self.result.errors += 1;
                self.close(i);
                return;
            }
            if command == b'Q' {
                self.close(i);
                return;
            }
            if wire::has(c.agreed, wire::no_reply_bit(command)) {
                if self.advance(i) {
                    continue;
                }
                return;
            }
            c.sent_at = Some(sent_at);
            return;
        }
    }

    /// Moves `i` past a step that awaits no reply. A step that follows a
    /// pause still waits for it, as the SMTP client's next command would
    /// whatever the filter negotiated; returns whether to go on at once.
    fn advance(&mut self, i: usize) -> bool {
        let c = &mut self.all[i];
        c.step += 1;
        if SCRIPT[c.step].1 {
            self.later(i);
            return false;
        }
        true
    }

    fn on_readable(&mut self, i: usize) {
        let mut buf = [0u8; 4096];
        loop {
            let Some(stream) = self.all[i].stream.as_mut() else {
                return;
            };
            match stream.read(&mut buf) {
                Ok(0) => {
                    self.result.lost += 1;
                    self.close(i);
                    return;
                }
                Ok(n) => self.all[i].replies.push(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.result.lost += 1;
                    self.close(i);
                    return;
                }
            }
        }
        while self.all[i].stream.is_some() {
            match self.all[i].replies.next_reply() {
                Ok(Some(reply)) => self.on_reply(i, reply),
                Ok(None) => return,
                Err(_) => {
                    self.result.errors += 1;
                    self.close(i);
                }
            }
        }
    }

    fn on_reply(&mut self, i: usize, reply: Reply) {
        let c = &mut self.all[i];
        let Some(sent_at) = c.sent_at else {
            self.result.errors += 1;
            self.close(i);
            return;
        };
        if matches!(reply, Reply::AddHeader { .. }) {
            c.header_added = true;
        }
        if !reply.is_final() {
            return;
        }
        let micros = sent_at.elapsed().as_micros() as u64;
        let _ = self.result.latency_us.record(micros.max(1));
        c.sent_at = None;
        let (step, _) = SCRIPT[c.step];
        if step == b'E' {
            let _ = self.result.eom_latency_us.record(micros.max(1));
        }
        if step == b'O' {
            let Reply::Negotiate(agreed) = reply else {
                self.result.errors += 1;
                self.close(i);
                return;
            };
            c.agreed = agreed.options.protocol;
        } else if step == b'E' && matches!(reply, Reply::Continue | Reply::Accept) && c.header_added
        {
            self.result.messages += 1;
        }
        c.step += 1;
        if SCRIPT[c.step].1 {
            self.later(i);
        } else {
            self.send_step(i);
        }
    }

    /// Ends conversations whose reply is overdue.
    fn expire(&mut self, now: Instant) {
        for i in 0..self.all.len() {
            let overdue = self.all[i]
                .sent_at
                .is_some_and(|t| now.duration_since(t) > self.spec.timeout);
            if overdue {
                self.result.errors += 1;
                self.close(i);
            }
        }
    }

    /// Closes `i` and starts its successor after a pause.
    fn close(&mut self, i: usize) {
        if let Some(mut stream) = self.all[i].stream.take() {
            let _ = self.poll.registry().deregister(&mut stream);
        }
        self.all[i].sent_at = None;
        self.later(i);
    }
}

/// Writes `bytes` whole at once: a few hundred bytes always fit in an
/// idle socket's buffer, so anything less is a failure of the load.
fn write_now(stream: &mut mio::net::TcpStream, bytes: &[u8]) -> io::Result<()> {
    let n = stream.write(bytes)?;
    if n == bytes.len() {
        Ok(())
    } else {
        Err(io::Error::new(io::ErrorKind::WriteZero, "short write"))
    }
}
