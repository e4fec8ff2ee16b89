//! Exec'd workers' standard error, logged line by line with the slot.
//!
//! Each exec'd worker's fd 2 is the write end of a pipe; the supervisor
//! watches the read end in its loop and logs every line as
//! `worker stderr: …` with the worker's slot and pid, so an error message
//! (a traceback, "cannot run") sits next to the exit status the reaper
//! logs. Standard output is not captured: workers share the supervisor's,
//! and what they print there appears as is.
//!
//! When a worker is reaped, whatever it wrote before exiting is read and
//! logged, and the pipe is closed. A background process the worker left
//! behind that still writes to it then gets `EPIPE`.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Instant;

use tracing::{info, warn};

use super::event::Event;
use super::Supervisor;
use crate::core::Counted;
use crate::policy::budget::{Admit, OutputGate, STDERR_FLOOD_LIMIT, STDERR_LINES_PER_SECOND};
use crate::status::KillReason;
use crate::sys;

/// Longer lines are logged in pieces of this size.
const MAX_LINE: usize = 8 * 1024;
/// Bytes read from one pipe per loop turn, so a worker that writes
/// without pause cannot starve the loop.
pub(super) const BYTES_PER_TURN: usize = 64 * 1024;
/// Lines kept from the end of a worker's stderr, to quote when a reload
/// fails because the worker could not start.
const TAIL_LINES: usize = 5;
/// Characters kept of each of those lines.
const TAIL_LINE_CHARS: usize = 300;

/// The supervisor's end of one worker's stderr pipe.
#[derive(Debug)]
pub(crate) struct ChildOutput {
    pub(super) pipe: File,
    /// The start of a line whose end has not arrived yet.
    partial: Vec<u8>,
    /// The last few lines, shortened.
    tail: std::collections::VecDeque<String>,
    /// The stderr budget: lines over it are counted, not logged.
    pub(super) gate: OutputGate,
}

/// Where a read left the pipe.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Left {
    /// Nothing more to read for now.
    Empty,
    /// The budget ran out with more waiting.
    More,
    /// Every writer has closed it.
    Closed,
}

impl ChildOutput {
    /// Wraps the read end, made non-blocking (it is ours alone).
    pub fn new(read: OwnedFd) -> io::Result<ChildOutput> {
        sys::socket::set_nonblocking(read.as_fd(), true)?;
        Ok(ChildOutput {
            pipe: File::from(read),
            partial: Vec::new(),
            tail: Default::default(),
            gate: OutputGate::default(),
        })
    }

    /// Reads up to `budget` bytes and hands each complete line within the
    /// stderr budget to `line` (and, for a flood, one line saying so).
    pub(super) fn read_lines(
        &mut self,
        budget: usize,
        now: Instant,
        mut line: impl FnMut(&str),
    ) -> io::Result<Left> {
        let mut buf = [0u8; 4096];
        let mut taken = 0;
        while taken < budget {
            let n = match self.pipe.read(&mut buf) {
                Ok(0) => {
                    self.flush_partial(now, &mut line);
                    return Ok(Left::Closed);
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Left::Empty),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            taken += n;
            for mut piece in buf[..n].split_inclusive(|b| *b == b'\n') {
                while !piece.is_empty() {
                    let room = MAX_LINE - self.partial.len();
                    let (head, rest) = piece.split_at(piece.len().min(room));
                    self.partial.extend_from_slice(head);
                    piece = rest;
                    if self.partial.ends_with(b"\n") || self.partial.len() >= MAX_LINE {
                        self.flush_partial(now, &mut line);
                    }
                }
            }
        }
        Ok(Left::More)
    }

    pub(super) fn flush_partial(&mut self, now: Instant, line: &mut impl FnMut(&str)) {
        if self.partial.is_empty() {
            return;
        }
        let text = String::from_utf8_lossy(&self.partial);
        let text = text.trim_end_matches(['\n', '\r']);
        match self.gate.admit(now, text.len()) {
            Admit::Log => line(text),
            Admit::Drop { first: true } => line(&format!(
                "(over {STDERR_LINES_PER_SECOND} lines a second: further output is dropped \
                 until the worker slows down, and the worker is killed if it keeps on \
                 for {STDERR_FLOOD_LIMIT:?})"
            )),
            Admit::Drop { first: false } => {}
        }
        if self.tail.len() == TAIL_LINES {
            self.tail.pop_front();
        }
        self.tail
            .push_back(text.chars().take(TAIL_LINE_CHARS).collect());
        self.partial.clear();
    }

    /// Moves the last lines read to the end of `into`, keeping at most
    /// `TAIL_LINES` there.
    pub(super) fn save_tail(&mut self, into: &mut Vec<String>) {
        into.extend(self.tail.drain(..));
        let extra = into.len().saturating_sub(TAIL_LINES);
        into.drain(..extra);
    }
}

impl ChildOutput {
    /// The pipe's descriptor, to watch.
    pub(super) fn fd(&self) -> std::os::fd::RawFd {
        self.pipe.as_raw_fd()
    }

    /// After a turn of [`ChildOutput::read_lines`]: the lines the gate
    /// dropped, for the core to count, and why the writer must end when it
    /// has flooded its stderr for too long.
    pub(super) fn flooded(&mut self, now: Instant) -> (Counted, Option<String>) {
        let dropped = Counted::StderrLinesDropped(std::mem::take(&mut self.gate.dropped));
        let flood = self.gate.flooding_too_long(now).then(|| {
            format!(
                "wrote more than {STDERR_LINES_PER_SECOND} lines a second to stderr \
                 for {STDERR_FLOOD_LIMIT:?}"
            )
        });
        (dropped, flood)
    }
}

impl Supervisor {
    /// Starts watching a new worker's output pipe.
    pub(super) fn register_output(&self, slot: usize, output: &ChildOutput) -> io::Result<()> {
        self.wake.watch(output.fd(), Event::Output(slot))
    }

    /// The worker in `slot` wrote to its stderr.
    pub(super) fn read_output(&mut self, slot: usize) {
        let pid = self.core.board().get(slot).map_or(0, |s| s.pid);
        // A capture gathering this worker's stack takes its lines too.
        let mut stack = self.core.capture_gathering(slot).then(Vec::new);
        let Some(link) = self.core.link_mut(slot) else {
            return;
        };
        let Some(output) = link.output.as_mut() else {
            return;
        };
        let now = Instant::now();
        let left = output.read_lines(BYTES_PER_TURN, now, |line| {
            log_line(slot, pid, line);
            if let Some(stack) = stack.as_mut() {
                stack.push(line.to_string());
            }
        });
        let (dropped, flood) = output.flooded(now);
        match left {
            _ if flood.is_some() => {}
            Ok(Left::Empty) => {}
            Ok(Left::More) => {
                if let Err(e) = self.wake.rewatch(output.fd(), Event::Output(slot)) {
                    warn!(slot, pid, "cannot watch the worker's stderr any more: {e}");
                }
            }
            Ok(Left::Closed) | Err(_) => {
                if let Some(mut output) = link.output.take() {
                    output.save_tail(&mut link.stderr_tail);
                    self.forget_output(&output);
                }
            }
        }
        for line in stack.into_iter().flatten() {
            self.core.capture_line(slot, pid, &line, now);
        }
        self.core.count(dropped);
        if let Some(why) = flood {
            self.kill(slot, KillReason::Misbehaved, why, now);
        }
    }

    /// At reap: log what the worker wrote before it died, then close.
    pub(super) fn drain_output(
        &mut self,
        slot: usize,
        pid: i32,
        output: &mut Option<ChildOutput>,
        tail: &mut Vec<String>,
    ) {
        if let Some(mut output) = output.take() {
            // The writer is dead, so this ends at once unless it left a
            // background process holding the pipe, which the budget bounds.
            let now = Instant::now();
            let _ = output.read_lines(BYTES_PER_TURN, now, |line| log_line(slot, pid, line));
            output.flush_partial(now, &mut |line| log_line(slot, pid, line));
            self.core.count(Counted::StderrLinesDropped(std::mem::take(
                &mut output.gate.dropped,
            )));
            output.save_tail(tail);
            self.forget_output(&output);
        }
    }

    pub(super) fn forget_output(&self, output: &ChildOutput) {
        self.wake.forget(output.fd());
    }
}

fn log_line(slot: usize, pid: i32, line: &str) {
    info!(slot, pid, "worker stderr: {line}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn lines_of(output: &mut ChildOutput, budget: usize) -> (Vec<String>, Left) {
        let mut got = Vec::new();
        let left = output
            .read_lines(budget, Instant::now(), |l| got.push(l.to_string()))
            .unwrap();
        (got, left)
    }

    #[test]
    fn lines_are_split_joined_and_flushed_at_the_end() {
        let (r, w) = sys::fds::pipe().unwrap();
        let mut output = ChildOutput::new(r).unwrap();
        let mut w = File::from(w);
        w.write_all(b"first\nsecond\r\nthi").unwrap();
        let (got, left) = lines_of(&mut output, 1 << 20);
        assert_eq!(got, ["first", "second"]);
        assert_eq!(left, Left::Empty);
        w.write_all(b"rd\nunfinished").unwrap();
        drop(w);
        let (got, left) = lines_of(&mut output, 1 << 20);
        assert_eq!(got, ["third", "unfinished"]);
        assert_eq!(left, Left::Closed);
    }

    #[test]
    fn long_lines_come_in_pieces_and_the_budget_holds() {
        let (r, w) = sys::fds::pipe().unwrap();
        let mut output = ChildOutput::new(r).unwrap();
        let mut w = File::from(w);
        w.write_all(&vec![b'x'; MAX_LINE + 10]).unwrap();
        w.write_all(b"\n").unwrap();
        let (got, left) = lines_of(&mut output, 4096);
        assert!(got.is_empty());
        assert_eq!(left, Left::More);
        let (got, _) = lines_of(&mut output, 1 << 20);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].len(), MAX_LINE);
        assert_eq!(got[1].len(), 10);
    }
}
