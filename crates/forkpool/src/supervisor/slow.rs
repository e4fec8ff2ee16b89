//! Slow-request captures: a child busy on one connection longer than
//! `slow_threshold` is captured once for that connection, without being
//! stopped; a child about to be killed for `busy_timeout` is captured
//! first, so every such kill says where the child was stuck.
//!
//! A capture reads `/proc` at once (wchan, syscall, kernel stack). For an
//! exec'd worker, whose stderr the supervisor reads, it also sends
//! `SIGURG` (the Python and Perl helpers dump their stack to stderr on it,
//! see docs/protocol.md "Stack dumps"), and the core gathers the stderr
//! lines that follow until the capture completes (`core/slow.rs` decides
//! which child, when it completes and whether its kill stands). The loop
//! never waits for the stack: the capture is logged as one record when it
//! completes.

use std::time::Instant;

use nix::sys::signal::Signal;
use tracing::{debug, warn};

use super::Supervisor;
use crate::core::{CaptureOf, Counted, HeldKill};
use crate::observe::SlowCapture;
use crate::status::KillReason;

impl Supervisor {
    /// Logs the captures that completed (doing the kills they held) and
    /// starts those the core asks for; called once per turn of the loop.
    pub(super) fn watch_slow(&mut self, now: Instant) {
        for done in self.core.captures_done(now) {
            let (slot, kill) = (done.record.slot, done.kill);
            self.log_capture(done.record);
            if let Some((why, detail)) = kill {
                self.kill(slot, why, detail, now);
            }
        }
        for of in self.core.slow_captures_due(now) {
            self.start_capture(of, None, now);
        }
    }

    /// Carries out [`crate::core::Effect::BusyTooLong`]: where the child
    /// is stuck is captured first, and the kill follows the capture (at
    /// once when nothing is to be waited for).
    pub(super) fn busy_too_long(
        &mut self,
        slot: usize,
        why: KillReason,
        detail: String,
        now: Instant,
    ) {
        let Some(kill) = self.core.hold_kill(slot, (why, detail)) else {
            return;
        };
        let kill = match self.core.capture_before_kill(slot, now) {
            Some(of) => self.start_capture(of, Some(kill), now),
            None => Some(kill),
        };
        if let Some((why, detail)) = kill {
            self.core.kill(slot, why, detail, now);
        }
    }

    /// Takes the `/proc` part and, for a worker whose stderr is read,
    /// asks for its stack: the core then holds the capture and
    /// `then_kill`. Otherwise logs it now and gives `then_kill` back.
    fn start_capture(
        &mut self,
        of: CaptureOf,
        then_kill: Option<HeldKill>,
        now: Instant,
    ) -> Option<HeldKill> {
        let CaptureOf { slot, pid, since } = of;
        let link = self.core.board().link(slot);
        let peer = link.and_then(|l| l.figures.peer_name());
        let record = SlowCapture::take(slot, pid, peer, now.saturating_duration_since(since));
        let asked = link
            .filter(|l| l.output.is_some())
            .map(|l| super::children::signal_child(l, pid, Signal::SIGURG));
        match asked {
            Some(Ok(())) => {
                self.core.capture_started(of, record, then_kill, now);
                return None;
            }
            Some(Err(e)) => debug!(slot, pid, "cannot send the stack-dump signal: {e}"),
            None => {}
        }
        self.log_capture(record);
        then_kill
    }

    fn log_capture(&mut self, capture: SlowCapture) {
        let suppressed = self.core.take_captures_suppressed();
        let (slot, pid) = (capture.slot, capture.pid);
        let record = capture.to_string();
        warn!(slot, pid, suppressed, "{record}");
        self.core.count(Counted::SlowCapture);
        if self.core.board().get(slot).is_some_and(|s| s.pid == pid) {
            if let Some(link) = self.core.link_mut(slot) {
                link.figures.last_capture = Some(record);
            }
        }
    }
}
