//! A small SMTP client for the mail tests: one command at a time (no
//! pipelining), every reply kept with its code, every read bounded in time.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// One SMTP reply: its code and its lines' text (after `NNN-` / `NNN `).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The three-digit code (`250`, `451`, `550`, ...).
    pub code: u16,
    /// The text of each line.
    pub lines: Vec<String>,
}

impl Reply {
    /// Whether the code is a success (2xx or 3xx).
    pub fn is_ok(&self) -> bool {
        (200..400).contains(&self.code)
    }

    /// The first line's text, which starts with the enhanced status code
    /// (`5.7.1 ...`) when the server announces ENHANCEDSTATUSCODES.
    pub fn text(&self) -> &str {
        self.lines.first().map_or("", String::as_str)
    }
}

/// What the server answered to each step of one mail transaction.
#[derive(Debug, Clone)]
pub struct Transaction {
    /// The reply to `MAIL FROM`.
    pub mail: Reply,
    /// The reply to each `RCPT TO`, in order (none if MAIL failed).
    pub rcpts: Vec<Reply>,
    /// The reply to `DATA` (none if no recipient was accepted).
    pub data: Option<Reply>,
    /// The reply after the message's final `.` (none if DATA failed).
    pub end: Option<Reply>,
}

impl Transaction {
    /// The queue id Postfix gave the message (`250 2.0.0 Ok: queued as ID`).
    pub fn queue_id(&self) -> Option<&str> {
        let end = self.end.as_ref().filter(|r| r.code == 250)?;
        end.text().rsplit(' ').next()
    }
}

/// An SMTP connection.
pub struct Smtp {
    reader: BufReader<TcpStream>,
    /// The greeting (`220 ...`).
    pub greeting: Reply,
}

impl Smtp {
    /// Connects to `addr` and reads the greeting; every later read and
    /// write fails after `timeout`.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> std::io::Result<Smtp> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let mut reader = BufReader::new(stream);
        let greeting = read_reply(&mut reader)?;
        Ok(Smtp { reader, greeting })
    }

    /// Sends one command line and reads its reply.
    pub fn command(&mut self, line: &str) -> std::io::Result<Reply> {
        let stream = self.reader.get_mut();
        stream.write_all(line.as_bytes())?;
        stream.write_all(b"\r\n")?;
        read_reply(&mut self.reader)
    }

    /// Sends the message text (lines ending in `\n` or `\r\n`, dot-stuffed
    /// here) and the final `.`; reads the reply.
    pub fn message(&mut self, text: &str) -> std::io::Result<Reply> {
        let mut out = String::with_capacity(text.len() + 16);
        for line in text.lines() {
            if line.starts_with('.') {
                out.push('.');
            }
            out.push_str(line);
            out.push_str("\r\n");
        }
        out.push_str(".\r\n");
        self.reader.get_mut().write_all(out.as_bytes())?;
        read_reply(&mut self.reader)
    }

    /// One transaction: MAIL, each RCPT, then DATA and the message if a
    /// recipient was accepted. Stops at the first step that cannot go on.
    pub fn send(&mut self, from: &str, rcpts: &[&str], text: &str) -> std::io::Result<Transaction> {
        let mail = self.command(&format!("MAIL FROM:<{from}>"))?;
        let mut outcome = Transaction {
            mail,
            rcpts: Vec::new(),
            data: None,
            end: None,
        };
        if !outcome.mail.is_ok() {
            return Ok(outcome);
        }
        for rcpt in rcpts {
            let reply = self.command(&format!("RCPT TO:<{rcpt}>"))?;
            outcome.rcpts.push(reply);
        }
        if !outcome.rcpts.iter().any(Reply::is_ok) {
            self.command("RSET")?;
            return Ok(outcome);
        }
        let data = self.command("DATA")?;
        let go_on = data.code == 354;
        outcome.data = Some(data);
        if go_on {
            outcome.end = Some(self.message(text)?);
        }
        Ok(outcome)
    }

    /// Says QUIT and reads the answer, if any.
    pub fn quit(mut self) {
        let _ = self.command("QUIT");
    }
}

/// Reads one reply, possibly multi-line (`NNN-text` lines, then `NNN text`).
fn read_reply(reader: &mut impl BufRead) -> std::io::Result<Reply> {
    let mut lines = Vec::new();
    // Bounded: an SMTP reply has a few lines, never hundreds.
    for _ in 0..100 {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("connection closed after {lines:?}"),
            ));
        }
        let line = line.trim_end_matches(['\r', '\n']);
        let code = line
            .get(..3)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| bad(format!("not an SMTP reply line: {line:?}")))?;
        lines.push(line.get(4..).unwrap_or("").to_string());
        if line.as_bytes().get(3) != Some(&b'-') {
            return Ok(Reply { code, lines });
        }
    }
    Err(bad("an SMTP reply of more than 100 lines".into()))
}

fn bad(message: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, message)
}

/// A message with a `Subject:` of `token` and a last body line naming it,
/// so [`Transaction`]s and delivered copies can be matched by token.
pub fn message_text(from: &str, to: &str, token: &str) -> String {
    format!(
        "From: <{from}>\r\nTo: <{to}>\r\nSubject: {token}\r\nMessage-Id: <{token}@forkpool.test>\r\n\
         \r\nA test message.\r\n.A line starting with a dot.\r\nend of {token}\r\n"
    )
}
