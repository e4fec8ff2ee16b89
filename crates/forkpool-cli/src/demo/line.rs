//! The demo protocol served by `forkpool demo --sessions` and the
//! `line_sessions` example: a small SMTP-like line protocol, here to show a
//! [`Session`] from end to end and to give tests and benchmarks something
//! real to talk to.
//!
//! - On connect the server sends `220 ...` ([`GREETING`], or the line given
//!   to [`LineSession::with_greeting`]).
//! - Each command line (ending in LF or CRLF) gets exactly one reply line,
//!   in order, even when several arrive in one packet (pipelining).
//! - `NOOP` answers `250 ok`.
//! - `WORK <ms>` keeps the worker busy for `ms` milliseconds (0 to
//!   [`MAX_WORK_MS`], think time spent sleeping) and answers
//!   `250 worked <ms> ms`.
//! - `QUIT` answers `221 bye` and the server closes the connection.
//! - Anything else, including `WORK` without a valid number, answers
//!   `500 ...`.
//! - A line longer than [`MAX_LINE`] bytes answers `500 line too long` and
//!   the server closes the connection.
//! - An idle session hears `421 idle timeout` before it is closed, a peer
//!   beyond the pool's cap hears `421 too many sessions` (with
//!   [`CapPolicy::Refuse`](forkpool::sessions::CapPolicy::Refuse)), and every session
//!   hears `421 shutting down` when the pool stops.
//!
//! Commands are case-insensitive. One step answers one command, so a peer
//! that pipelines many commands takes turns with the others.

use std::io::{self, Read, Write};
use std::sync::Arc;
use std::time::Duration;

use forkpool::sessions::{CloseReason, Session, SessionStream, Step};

/// The longest command line, not counting its line ending.
pub const MAX_LINE: usize = 1024;

/// The longest `WORK` accepted, in milliseconds.
pub const MAX_WORK_MS: u64 = 60_000;

const READ_CHUNK: usize = 4096;

/// The greeting sent on connect.
pub const GREETING: &str = "220 forkpool line demo ready\r\n";

/// What a peer beyond the pool's cap is told.
pub const REFUSAL: &str = "421 too many sessions, try again later\r\n";

/// One conversation of the demo protocol.
#[derive(Debug, Default)]
pub struct LineSession {
    /// Received bytes not yet answered.
    input: Vec<u8>,
    /// Reply bytes the socket has not taken yet.
    output: Vec<u8>,
    /// The peer sent its last byte.
    peer_closed: bool,
    /// Close once `output` is flushed (after `QUIT` or an overlong line).
    closing: bool,
    /// The greeting line, without its line ending, if not [`GREETING`].
    greeting: Option<String>,
}

/// The head of the input buffer.
enum Head {
    /// A complete line (without its ending) and the bytes it occupies.
    Line(Vec<u8>),
    /// A line longer than [`MAX_LINE`], complete or not.
    TooLong,
    /// Not a complete line yet.
    Partial,
}

impl Session for LineSession {
    type Context = ();

    fn open(_context: &Arc<()>, _stream: &SessionStream) -> Self {
        LineSession::default()
    }

    fn on_open(&mut self, stream: &mut SessionStream) -> io::Result<Step> {
        match self.greeting.take() {
            Some(greeting) => self.reply(&greeting),
            None => self.output.extend_from_slice(GREETING.as_bytes()),
        }
        if self.flush(stream)? {
            Ok(Step::Wait)
        } else {
            Ok(Step::WaitWritable)
        }
    }

    fn step(&mut self, stream: &mut SessionStream) -> io::Result<Step> {
        // A reply left over from last time goes out before anything else.
        if !self.flush(stream)? {
            return Ok(Step::WaitWritable);
        }
        if self.closing {
            return Ok(Step::Close);
        }
        if !self.has_line() && !self.peer_closed {
            self.fill(stream)?;
        }
        match self.take_head() {
            Head::Line(line) => self.answer(&line),
            Head::TooLong => {
                self.reply("500 line too long");
                self.closing = true;
            }
            Head::Partial if self.peer_closed => return Ok(Step::Close),
            Head::Partial => return Ok(Step::Wait),
        }
        if !self.flush(stream)? {
            return Ok(Step::WaitWritable);
        }
        Ok(if self.closing || (self.peer_closed && !self.has_line()) {
            Step::Close
        } else if self.has_line() {
            Step::Continue
        } else {
            Step::Wait
        })
    }

    fn on_close(&mut self, stream: &mut SessionStream, reason: &CloseReason) {
        let farewell = match reason {
            CloseReason::IdleTimeout => "421 idle timeout, closing",
            CloseReason::Shutdown => "421 shutting down",
            _ => return,
        };
        self.reply(farewell);
        // Best effort: the socket is closed right after either way.
        let _ = self.flush(stream);
    }

    fn refuse(_context: &(), stream: &mut SessionStream) {
        let _ = stream.write(REFUSAL.as_bytes());
    }
}

impl LineSession {
    /// A session that greets its peer with `greeting` (a line without its
    /// ending, such as `220 example.org ready`) instead of [`GREETING`]. A
    /// wrapping session builds it in its own [`Session::open`], from its
    /// context.
    pub fn with_greeting(greeting: impl Into<String>) -> Self {
        LineSession {
            greeting: Some(greeting.into()),
            ..LineSession::default()
        }
    }

    /// Answers one command line.
    fn answer(&mut self, line: &[u8]) {
        let Ok(text) = std::str::from_utf8(line) else {
            return self.reply("500 command is not UTF-8");
        };
        let mut words = text.split_ascii_whitespace();
        let verb = words.next().unwrap_or("").to_ascii_uppercase();
        let arg = words.next();
        let extra = words.next();
        match (verb.as_str(), arg, extra) {
            ("NOOP", None, None) => self.reply("250 ok"),
            ("QUIT", None, None) => {
                self.reply("221 bye");
                self.closing = true;
            }
            ("WORK", Some(ms), None) => match ms.parse::<u64>() {
                Ok(ms) if ms <= MAX_WORK_MS => {
                    std::thread::sleep(Duration::from_millis(ms));
                    self.reply(&format!("250 worked {ms} ms"));
                }
                _ => self.reply(&format!(
                    "500 WORK takes milliseconds from 0 to {MAX_WORK_MS}"
                )),
            },
            ("", _, _) => self.reply("500 empty line"),
            _ => self.reply("500 unknown command"),
        }
    }

    fn reply(&mut self, line: &str) {
        self.output.extend_from_slice(line.as_bytes());
        self.output.extend_from_slice(b"\r\n");
    }

    fn has_line(&self) -> bool {
        self.input.contains(&b'\n')
    }

    /// Reads until a line is complete, the socket has nothing more, the
    /// peer closes, or the buffer already holds more than any line may.
    fn fill(&mut self, stream: &mut SessionStream) -> io::Result<()> {
        let mut chunk = [0u8; READ_CHUNK];
        while self.input.len() <= MAX_LINE + 1 {
            match stream.read(&mut chunk) {
                Ok(0) => {
                    self.peer_closed = true;
                    return Ok(());
                }
                Ok(n) => {
                    self.input.extend_from_slice(&chunk[..n]);
                    if chunk[..n].contains(&b'\n') {
                        return Ok(());
                    }
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }

    /// Takes the first line off the input buffer, if there is one.
    fn take_head(&mut self) -> Head {
        match self.input.iter().position(|&b| b == b'\n') {
            Some(end) => {
                let mut line: Vec<u8> = self.input.drain(..=end).collect();
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                if line.len() > MAX_LINE {
                    Head::TooLong
                } else {
                    Head::Line(line)
                }
            }
            // MAX_LINE bytes and a '\r' can still end well.
            None if self.input.len() > MAX_LINE + 1 => Head::TooLong,
            None => Head::Partial,
        }
    }

    /// Writes pending output; `Ok(false)` if the socket took only part.
    fn flush(&mut self, stream: &mut SessionStream) -> io::Result<bool> {
        stream.write_pending(&mut self.output)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;
    use std::os::unix::net::UnixStream;

    /// A session on one end of a socket pair, driven by hand (no pool).
    struct Bench {
        session: LineSession,
        server: SessionStream,
        client: io::BufReader<UnixStream>,
    }

    impl Bench {
        fn new() -> Self {
            let (server, client) = UnixStream::pair().unwrap();
            server.set_nonblocking(true).unwrap();
            let mut server = SessionStream::from(server);
            let mut session = LineSession::open(&Arc::new(()), &server);
            assert_eq!(session.on_open(&mut server).unwrap(), Step::Wait);
            let mut bench = Bench {
                session,
                server,
                client: io::BufReader::new(client),
            };
            assert_eq!(bench.line(), GREETING.trim_end());
            bench
        }

        fn send(&mut self, bytes: &[u8]) {
            self.client.get_mut().write_all(bytes).unwrap();
        }

        /// Steps until the session waits or closes; returns the last step.
        fn run(&mut self) -> Step {
            for _ in 0..100 {
                match self.session.step(&mut self.server).unwrap() {
                    Step::Continue => continue,
                    other => return other,
                }
            }
            panic!("session kept asking to continue");
        }

        fn line(&mut self) -> String {
            let mut line = String::new();
            self.client.read_line(&mut line).unwrap();
            line.trim_end_matches(['\r', '\n']).to_string()
        }
    }

    #[test]
    fn pipelined_commands_are_answered_in_order() {
        let mut bench = Bench::new();
        bench.send(b"NOOP\r\nwork 0\nBOGUS\r\nWORK x\nWORK 1 2\n\nNOOP\n");
        assert_eq!(bench.run(), Step::Wait);
        for expected in [
            "250 ok",
            "250 worked 0 ms",
            "500 unknown command",
            "500 WORK takes milliseconds from 0 to 60000",
            "500 unknown command",
            "500 empty line",
            "250 ok",
        ] {
            assert_eq!(bench.line(), expected);
        }
    }

    #[test]
    fn a_custom_greeting_replaces_the_default() {
        let (server, client) = UnixStream::pair().unwrap();
        server.set_nonblocking(true).unwrap();
        let mut server = SessionStream::from(server);
        let mut session = LineSession::with_greeting("220 slot 3 ready");
        assert_eq!(session.on_open(&mut server).unwrap(), Step::Wait);
        let mut line = String::new();
        io::BufReader::new(client).read_line(&mut line).unwrap();
        assert_eq!(line, "220 slot 3 ready\r\n");
    }

    #[test]
    fn one_command_per_step() {
        let mut bench = Bench::new();
        bench.send(b"NOOP\nNOOP\n");
        assert_eq!(
            bench.session.step(&mut bench.server).unwrap(),
            Step::Continue
        );
        assert_eq!(bench.session.step(&mut bench.server).unwrap(), Step::Wait);
    }

    #[test]
    fn a_line_split_across_packets_waits_for_its_end() {
        let mut bench = Bench::new();
        bench.send(b"NO");
        assert_eq!(bench.run(), Step::Wait);
        bench.send(b"OP\r\n");
        assert_eq!(bench.run(), Step::Wait);
        assert_eq!(bench.line(), "250 ok");
    }

    #[test]
    fn quit_says_bye_and_closes() {
        let mut bench = Bench::new();
        bench.send(b"QUIT\r\nNOOP\r\n");
        assert_eq!(bench.run(), Step::Close);
        assert_eq!(bench.line(), "221 bye");
    }

    #[test]
    fn an_overlong_line_is_refused_and_closed() {
        let mut bench = Bench::new();
        let mut long = vec![b'x'; MAX_LINE + 1];
        long.extend_from_slice(b"\r\n");
        bench.send(&long);
        assert_eq!(bench.run(), Step::Close);
        assert_eq!(bench.line(), "500 line too long");
    }

    #[test]
    fn an_overlong_line_is_caught_before_its_end_arrives() {
        let mut bench = Bench::new();
        bench.send(&vec![b'x'; 3 * MAX_LINE]);
        assert_eq!(bench.run(), Step::Close);
        assert_eq!(bench.line(), "500 line too long");
    }

    #[test]
    fn a_line_of_exactly_the_limit_is_fine() {
        let mut bench = Bench::new();
        let mut line = vec![b'x'; MAX_LINE];
        line.extend_from_slice(b"\r\n");
        bench.send(&line);
        assert_eq!(bench.run(), Step::Wait);
        assert_eq!(bench.line(), "500 unknown command");
    }

    #[test]
    fn buffered_commands_are_answered_after_the_peer_half_closes() {
        let mut bench = Bench::new();
        bench.send(b"NOOP\nWORK 0\n");
        bench
            .client
            .get_ref()
            .shutdown(std::net::Shutdown::Write)
            .unwrap();
        // The end of input is noticed on the step after the last command.
        assert_eq!(bench.run(), Step::Wait);
        assert_eq!(bench.run(), Step::Close);
        assert_eq!(bench.line(), "250 ok");
        assert_eq!(bench.line(), "250 worked 0 ms");
    }
}
