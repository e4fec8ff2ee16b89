//! The load: many sessions of the demo line protocol, most of them idle
//! (a `NOOP` every ~interval), a few busy (a `NOOP` every busy interval),
//! all on one `mio` event loop in the benchmark process, so that the
//! client costs the same whichever server it talks to.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use mio::{Events, Interest, Poll, Token};

/// The command every session sends.
const COMMAND: &[u8] = b"NOOP\r\n";
/// Its answer.
const ANSWER: &[u8] = b"250 ok";

/// What the sessions do during a measurement.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// Of all the sessions, this many are busy.
    pub busy: usize,
    /// An idle session sends a command about this often (±20%).
    pub interval: Duration,
    /// A busy session sends its next command this long after an answer.
    pub busy_interval: Duration,
}

/// What a measurement saw.
#[derive(Debug)]
pub struct LoadResult {
    /// Command latency (write to answer) in microseconds, every session.
    pub latency_us: Histogram<u64>,
    /// Commands answered by busy sessions.
    pub busy_answered: u64,
    /// Wrong answers, sessions closed by the server, writes that failed,
    /// and commands unanswered at the end.
    pub errors: u64,
}

struct Client {
    stream: mio::net::TcpStream,
    input: Vec<u8>,
    sent_at: Option<Instant>,
    busy: bool,
    closed: bool,
}

/// Open sessions, registered with one poll.
pub struct Clients {
    poll: Poll,
    clients: Vec<Client>,
    rng: XorShift,
}

impl Clients {
    /// Opens `count` sessions one after the other, each once its greeting
    /// has arrived, so that the server sees them as they would come.
    pub fn connect(addr: SocketAddr, count: usize, timeout: Duration) -> Result<Clients, String> {
        let poll = Poll::new().map_err(|e| format!("cannot create a poll: {e}"))?;
        let mut clients = Vec::with_capacity(count);
        for i in 0..count {
            let fail = |what: &str, e: io::Error| format!("session {i}: {what}: {e}");
            let mut stream =
                TcpStream::connect_timeout(&addr, timeout).map_err(|e| fail("connect", e))?;
            stream
                .set_read_timeout(Some(timeout))
                .map_err(|e| fail("set timeout", e))?;
            read_greeting(&mut stream).map_err(|e| fail("greeting", e))?;
            stream
                .set_nonblocking(true)
                .map_err(|e| fail("set non-blocking", e))?;
            let mut stream = mio::net::TcpStream::from_std(stream);
            poll.registry()
                .register(&mut stream, Token(i), Interest::READABLE)
                .map_err(|e| fail("register", e))?;
            clients.push(Client {
                stream,
                input: Vec::with_capacity(64),
                sent_at: None,
                busy: false,
                closed: false,
            });
        }
        Ok(Clients {
            poll,
            clients,
            rng: XorShift::seeded(),
        })
    }

    /// Sends commands as `spec` says for `duration`, then waits up to
    /// `timeout` for the last answers.
    pub fn run(&mut self, spec: &LoadSpec, duration: Duration, timeout: Duration) -> LoadResult {
        let mut result = LoadResult {
            latency_us: Histogram::new_with_bounds(1, 120_000_000, 3).expect("valid bounds"),
            busy_answered: 0,
            errors: 0,
        };
        let start = Instant::now();
        let end = start + duration;
        let mut due: BinaryHeap<Reverse<(Instant, usize)>> = BinaryHeap::new();
        for (i, client) in self.clients.iter_mut().enumerate() {
            client.busy = i < spec.busy;
            let period = if client.busy {
                spec.busy_interval
            } else {
                spec.interval
            };
            // Spread the first commands over one period.
            due.push(Reverse((start + self.rng.fraction_of(period), i)));
        }
        let mut events = Events::with_capacity(1024);
        loop {
            let now = Instant::now();
            let sending = now < end;
            if sending {
                while let Some(&Reverse((at, i))) = due.peek() {
                    if at > now {
                        break;
                    }
                    due.pop();
                    self.send(i, now, &mut result);
                }
            } else if self.clients.iter().all(|c| c.sent_at.is_none() || c.closed)
                || now >= end + timeout
            {
                break;
            }
            let until = if sending {
                due.peek().map_or(end, |Reverse((at, _))| (*at).min(end))
            } else {
                end + timeout
            };
            let wait = until.saturating_duration_since(now);
            if let Err(e) = self.poll.poll(&mut events, Some(wait)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    result.errors += 1;
                }
                continue;
            }
            let now = Instant::now();
            for event in events.iter() {
                let i = event.token().0;
                if self.receive(i, now, &mut result) {
                    let next = if self.clients[i].busy {
                        now + spec.busy_interval
                    } else {
                        now + self.rng.around(spec.interval)
                    };
                    due.push(Reverse((next, i)));
                }
            }
        }
        result.errors += self
            .clients
            .iter()
            .filter(|c| c.sent_at.is_some() && !c.closed)
            .count() as u64;
        result
    }

    fn send(&mut self, i: usize, now: Instant, result: &mut LoadResult) {
        let client = &mut self.clients[i];
        if client.closed || client.sent_at.is_some() {
            return;
        }
        match client.stream.write(COMMAND) {
            Ok(n) if n == COMMAND.len() => client.sent_at = Some(now),
            _ => {
                result.errors += 1;
                client.closed = true;
            }
        }
    }

    /// Reads what session `i` received at `now`; whether it answered the
    /// outstanding command.
    fn receive(&mut self, i: usize, now: Instant, result: &mut LoadResult) -> bool {
        let client = &mut self.clients[i];
        let mut buf = [0u8; 512];
        loop {
            match client.stream.read(&mut buf) {
                Ok(0) => {
                    if !client.closed {
                        client.closed = true;
                        result.errors += 1;
                    }
                    break;
                }
                Ok(n) => client.input.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    client.closed = true;
                    result.errors += 1;
                    break;
                }
            }
        }
        let mut answered = false;
        while let Some(end) = client.input.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = client.input.drain(..=end).collect();
            let ok = line.trim_ascii_end() == ANSWER;
            match client.sent_at.take() {
                Some(sent) if ok => {
                    let us = now.saturating_duration_since(sent).as_micros() as u64;
                    let _ = result.latency_us.record(us.max(1));
                    if client.busy {
                        result.busy_answered += 1;
                    }
                    answered = true;
                }
                _ => result.errors += 1,
            }
        }
        answered
    }

    /// Whether every session is still open.
    pub fn all_open(&self) -> bool {
        self.clients.iter().all(|c| !c.closed)
    }

    /// How many sessions there are.
    pub fn len(&self) -> usize {
        self.clients.len()
    }
}

/// Reads one line, the greeting, and checks it is one.
fn read_greeting(stream: &mut TcpStream) -> io::Result<()> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.last() != Some(&b'\n') {
        if stream.read(&mut byte)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed before its greeting",
            ));
        }
        line.push(byte[0]);
    }
    if line.starts_with(b"220 ") {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "unexpected greeting {:?}",
            String::from_utf8_lossy(&line)
        )))
    }
}

/// A small fast generator for send times; no need for cryptography.
struct XorShift(u64);

impl XorShift {
    fn seeded() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x9e37_79b9_7f4a_7c15, |d| d.as_nanos() as u64);
        XorShift(nanos | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A uniform fraction of `period`, in `[0, period)`.
    fn fraction_of(&mut self, period: Duration) -> Duration {
        let unit = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        period.mul_f64(unit)
    }

    /// `period` ±20%.
    fn around(&mut self, period: Duration) -> Duration {
        period.mul_f64(0.8) + self.fraction_of(period.mul_f64(0.4))
    }
}
