//! Slow-request captures: a child busy on one connection longer than
//! `slow_threshold` is captured once for that connection, without being
//! stopped; a child about to be killed for `busy_timeout` is captured
//! first, so every such kill says where the child was stuck.
//!
//! A capture reads `/proc` at once (wchan, syscall, kernel stack). For an
//! exec'd worker, whose stderr the supervisor reads, it also sends
//! `SIGURG` (the Python and Perl helpers dump their stack to stderr on it,
//! see docs/protocol.md "Stack dumps") and gathers the stderr lines that
//! follow: until they stop coming for [`QUIET`], or [`STACK_WAIT`] at most.
//! The loop never waits for them: the capture stays pending, and is logged
//! as one record when it completes.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tracing::{debug, warn};

use super::Supervisor;
use crate::core::{CaptureOf, Counted};
use crate::observe::SlowCapture;
use crate::scoreboard::SlotState;
use crate::status::KillReason;

/// The longest a capture waits for the worker's stack.
pub(crate) const STACK_WAIT: Duration = Duration::from_secs(2);
/// A stack is complete once the worker wrote nothing more for this long.
pub(crate) const QUIET: Duration = Duration::from_millis(300);
/// The most stack text kept from one dump.
const MAX_STACK_BYTES: usize = 64 * 1024;

/// A capture waiting for the worker's stack.
#[derive(Debug)]
struct Pending {
    capture: SlowCapture,
    /// The connection it is about: the slot's busy-since instant.
    connection: Instant,
    /// Stack lines gathered so far.
    stack: String,
    started: Instant,
    last_line: Option<Instant>,
    /// A kill that waits for the capture (busy_timeout).
    then_kill: Option<(KillReason, String)>,
}

impl Pending {
    /// When the capture is complete, given what arrived so far.
    fn done_at(&self) -> Instant {
        let limit = self.started + STACK_WAIT;
        self.last_line.map_or(limit, |t| (t + QUIET).min(limit))
    }
}

/// The captures waiting for a stack (which connection to capture is the
/// core's decision, `core/slow.rs`).
#[derive(Debug, Default)]
pub(crate) struct SlowWatch {
    pending: Vec<Pending>,
}

impl SlowWatch {
    /// Whether a capture of `slot` is waiting for its stack.
    pub fn pending_for(&self, slot: usize) -> bool {
        self.pending.iter().any(|p| p.capture.slot == slot)
    }

    /// A line the worker in `slot` wrote to its stderr.
    pub fn line(&mut self, slot: usize, pid: i32, line: &str, now: Instant) {
        for p in &mut self.pending {
            if p.capture.slot == slot && p.capture.pid == pid {
                if p.stack.len() + line.len() < MAX_STACK_BYTES {
                    p.stack.push_str(line);
                    p.stack.push('\n');
                }
                p.last_line = Some(now);
            }
        }
    }

    /// The earliest moment a capture completes.
    pub fn deadline(&self) -> Option<Instant> {
        self.pending.iter().map(Pending::done_at).min()
    }
}

impl Supervisor {
    /// Starts the captures the core asks for and completes those whose
    /// stack has arrived; called once per turn of the loop.
    pub(super) fn watch_slow(&mut self, now: Instant) {
        self.complete_captures(now);
        for of in self.core.slow_captures_due(now) {
            self.start_capture(of, None, now);
        }
    }

    /// A child is about to be killed for `busy_timeout`: capture it first.
    /// Returns whether to kill it now; otherwise the kill follows when the
    /// capture completes.
    pub(super) fn capture_before_kill(
        &mut self,
        slot: usize,
        why: KillReason,
        detail: String,
        now: Instant,
    ) -> Option<(KillReason, String)> {
        if self.slow.pending_for(slot) {
            // Already capturing: the kill waits for it (or is attached).
            if let Some(p) = self
                .slow
                .pending
                .iter_mut()
                .find(|p| p.capture.slot == slot)
            {
                p.then_kill.get_or_insert((why, detail));
            }
            return None;
        }
        let Some(of) = self.core.capture_before_kill(slot, now) else {
            return Some((why, detail));
        };
        if self.start_capture(of, Some((why, detail.clone())), now) {
            None
        } else {
            Some((why, detail))
        }
    }

    /// Takes the `/proc` part and, for a worker whose stderr is read,
    /// asks for its stack. Returns whether the capture is pending (a kill
    /// it carries will follow); one that completes at once is not.
    fn start_capture(
        &mut self,
        CaptureOf { slot, pid, since }: CaptureOf,
        then_kill: Option<(KillReason, String)>,
        now: Instant,
    ) -> bool {
        let peer = self
            .core
            .board()
            .link(slot)
            .and_then(|l| l.figures.peer_name());
        let busy = now.saturating_duration_since(since);
        let capture = SlowCapture::take(slot, pid, peer, busy);
        let reads_stderr = self
            .core
            .board()
            .link(slot)
            .is_some_and(|l| l.output.is_some());
        let mut pending = Pending {
            capture,
            connection: since,
            stack: String::new(),
            started: now,
            last_line: None,
            then_kill,
        };
        if reads_stderr {
            let sent = match self.core.board().link(slot) {
                Some(link) => super::children::signal_child(link, pid, Signal::SIGURG),
                None => Ok(()),
            };
            match sent {
                Ok(()) => {
                    self.slow.pending.push(pending);
                    self.core.set_capturing(slot, pid, true);
                    return true;
                }
                Err(e) => debug!(slot, pid, "cannot send the stack-dump signal: {e}"),
            }
        }
        // Nothing to wait for: log the /proc part now (any kill is the
        // caller's to do).
        pending.then_kill = None;
        self.log_capture(pending);
        false
    }

    /// Logs captures whose stack is complete, and does the kills they held.
    fn complete_captures(&mut self, now: Instant) {
        let mut i = 0;
        while i < self.slow.pending.len() {
            if self.slow.pending[i].done_at() > now {
                i += 1;
                continue;
            }
            let mut p = self.slow.pending.swap_remove(i);
            let kill = p.then_kill.take();
            let (slot, pid) = (p.capture.slot, p.capture.pid);
            self.core.set_capturing(slot, pid, false);
            // The kill stands only if the child is still on that connection.
            let connection = p.connection;
            let still_stuck = self.core.board().get(slot).is_some_and(|s| {
                s.pid == pid && s.state == SlotState::Busy && s.since == connection
            });
            self.log_capture(p);
            if let Some((why, detail)) = kill.filter(|_| still_stuck) {
                self.kill(slot, why, detail, now);
            }
        }
    }

    fn log_capture(&mut self, mut p: Pending) {
        if !p.stack.is_empty() {
            p.capture.worker_stack = Some(std::mem::take(&mut p.stack).trim_end().to_string());
        }
        let suppressed = self.core.take_captures_suppressed();
        let record = p.capture.to_string();
        warn!(
            slot = p.capture.slot,
            pid = p.capture.pid,
            suppressed,
            "{record}"
        );
        self.core.count(Counted::SlowCapture);
        let (slot, pid) = (p.capture.slot, p.capture.pid);
        if self.core.board().get(slot).is_some_and(|s| s.pid == pid) {
            if let Some(link) = self.core.link_mut(slot) {
                link.figures.last_capture = Some(record);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(started: Instant) -> Pending {
        Pending {
            capture: SlowCapture {
                slot: 1,
                pid: 10,
                peer: None,
                busy: Duration::ZERO,
                worker_stack: None,
                wchan: None,
                syscall: None,
                kernel_stack: None,
            },
            connection: started,
            stack: String::new(),
            started,
            last_line: None,
            then_kill: None,
        }
    }

    #[test]
    fn a_silent_worker_gets_the_whole_wait_and_a_quiet_one_less() {
        let t0 = Instant::now();
        let mut w = SlowWatch::default();
        w.pending.push(pending(t0));
        assert_eq!(w.deadline(), Some(t0 + STACK_WAIT));
        let at = t0 + Duration::from_millis(100);
        w.line(1, 10, "File \"x.py\", line 3 in crunch", at);
        assert_eq!(w.deadline(), Some(at + QUIET));
        assert!(w.pending[0].stack.contains("crunch"));
        // Lines of another slot or pid are not this capture's.
        w.line(2, 10, "other", at);
        w.line(1, 11, "other", at);
        assert!(!w.pending[0].stack.contains("other"));
    }

    #[test]
    fn a_worker_that_never_stops_writing_is_cut_off() {
        let t0 = Instant::now();
        let mut w = SlowWatch::default();
        w.pending.push(pending(t0));
        for ms in (0..5000).step_by(100) {
            w.line(1, 10, &"x".repeat(1000), t0 + Duration::from_millis(ms));
        }
        assert_eq!(w.deadline(), Some(t0 + STACK_WAIT));
        assert!(w.pending[0].stack.len() <= MAX_STACK_BYTES);
    }
}
