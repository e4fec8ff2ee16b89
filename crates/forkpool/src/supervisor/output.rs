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

use super::event::{Event, Wake};
use super::Supervisor;
use crate::core::stderr::StderrLines;
use crate::core::Counted;
use crate::status::KillReason;
use crate::sys;

/// Bytes read from one pipe per loop turn, so a worker that writes
/// without pause cannot starve the loop.
pub(super) const BYTES_PER_TURN: usize = 64 * 1024;

/// The supervisor's end of one worker's stderr pipe, and what the core
/// makes of the bytes read (`core/stderr.rs`).
#[derive(Debug)]
pub(crate) struct ChildOutput {
    pipe: File,
    pub(super) lines: StderrLines,
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
            lines: StderrLines::default(),
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
            match self.pipe.read(&mut buf) {
                Ok(0) => {
                    self.lines.flush(now, &mut line);
                    return Ok(Left::Closed);
                }
                Ok(n) => {
                    taken += n;
                    self.lines.feed(&buf[..n], now, &mut line);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Left::Empty),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(Left::More)
    }

    /// The pipe's descriptor, to watch.
    pub(super) fn fd(&self) -> std::os::fd::RawFd {
        self.pipe.as_raw_fd()
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
        let now = Instant::now();
        let (output, tail) = (&mut link.output, &mut link.stderr_tail);
        let (dropped, flood) =
            read_turn(&self.wake, output, tail, Event::Output(slot), now, |line| {
                log_line(slot, pid, line);
                if let Some(stack) = stack.as_mut() {
                    stack.push(line.to_string());
                }
            });
        for line in stack.into_iter().flatten() {
            self.core.capture_line(slot, pid, &line, now);
        }
        self.core.count(dropped);
        if let Some(why) = flood {
            self.kill(slot, KillReason::Misbehaved, why, now);
        }
    }

    /// At reap: log what the worker in `slot`, `pid`, wrote before it
    /// died, then close the pipe.
    pub(super) fn drain_output(&mut self, slot: usize, pid: i32) {
        let Some(link) = self.core.link_mut(slot) else {
            return;
        };
        let (output, tail) = (&mut link.output, &mut link.stderr_tail);
        let now = Instant::now();
        if let Some(dropped) = finish(&self.wake, output, tail, now, |line| {
            log_line(slot, pid, line)
        }) {
            self.core.count(dropped);
        }
    }

    pub(super) fn forget_output(&self, output: &ChildOutput) {
        self.wake.forget(output.fd());
    }
}

/// One turn of reading `output`, watched as `event`: each line goes to
/// `line`; a pipe with more to read is watched again, and a closed one is
/// dropped, its last lines saved in `tail`. Returns the lines the budget
/// dropped, to count, and why the writer must end if it has flooded for
/// too long (its pipe is then left as it is).
pub(super) fn read_turn(
    wake: &Wake,
    output: &mut Option<ChildOutput>,
    tail: &mut Vec<String>,
    event: Event,
    now: Instant,
    line: impl FnMut(&str),
) -> (Counted, Option<String>) {
    let Some(pipe) = output.as_mut() else {
        return (Counted::StderrLinesDropped(0), None);
    };
    let left = pipe.read_lines(BYTES_PER_TURN, now, line);
    let (dropped, flood) = (pipe.lines.dropped(), pipe.lines.flood(now));
    match left {
        _ if flood.is_some() => {}
        Ok(Left::Empty) => {}
        Ok(Left::More) => {
            if let Err(e) = wake.rewatch(pipe.fd(), event) {
                warn!(?event, "cannot watch a stderr pipe any more: {e}");
            }
        }
        Ok(Left::Closed) | Err(_) => {
            if let Some(mut pipe) = output.take() {
                pipe.lines.save_tail(tail);
                wake.forget(pipe.fd());
            }
        }
    }
    (dropped, flood)
}

/// Once its writer is gone: reads what is left of `output` (the writer is
/// dead, so this ends at once unless a background process it left holds
/// the pipe, which the budget bounds), ends the line begun, saves the last
/// lines in `tail` and closes the pipe. Returns the lines the budget
/// dropped, to count; `None` when the pipe was closed already.
pub(super) fn finish(
    wake: &Wake,
    output: &mut Option<ChildOutput>,
    tail: &mut Vec<String>,
    now: Instant,
    mut line: impl FnMut(&str),
) -> Option<Counted> {
    let mut pipe = output.take()?;
    let _ = pipe.read_lines(BYTES_PER_TURN, now, &mut line);
    pipe.lines.flush(now, &mut line);
    pipe.lines.save_tail(tail);
    wake.forget(pipe.fd());
    Some(pipe.lines.dropped())
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
    fn a_turn_reads_within_its_budget_and_the_end_flushes() {
        let (r, w) = sys::fds::pipe().unwrap();
        let mut output = ChildOutput::new(r).unwrap();
        let mut w = File::from(w);
        w.write_all(&vec![b'x'; 3 * 4096]).unwrap();
        w.write_all(b"\nlast").unwrap();
        let (got, left) = lines_of(&mut output, 4096);
        assert!(got.is_empty());
        assert_eq!(left, Left::More);
        let (got, left) = lines_of(&mut output, 1 << 20);
        assert_eq!(got.len(), 2);
        assert_eq!(left, Left::Empty);
        drop(w);
        let (got, left) = lines_of(&mut output, 1 << 20);
        assert_eq!(got, ["last"]);
        assert_eq!(left, Left::Closed);
    }
}
