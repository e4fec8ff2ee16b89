//! Slow-request captures, played as the shell plays them: the children the
//! core names past `slow_threshold` are captured, a `busy_timeout` kill
//! waits for a capture of its child, and some workers write a stack
//! (every other pid, at the capture's start). The simulator keeps its own
//! record of when each capture began, so a capture the core forgets to
//! complete by [`STACK_WAIT`] (a deadline left out of `next_deadline`, or
//! a capture never given back) fails the seed, and so does a held kill
//! done on a child that moved on to another connection.

use std::time::{Duration, Instant};

use super::world::MS;
use super::Sim;
use crate::core::slow::STACK_WAIT;
use crate::core::CaptureOf;
use crate::observe::SlowCapture;
use crate::scoreboard::SlotState;
use crate::status::KillReason;

/// The slow threshold and busy timeout of seed `seed`: drawn from the
/// seed itself, not from the world's generator, so every other draw of
/// a seed stays what it was.
pub(super) fn thresholds(seed: u64) -> (Duration, Duration) {
    let slow = Duration::from_millis(200 + seed % 800);
    let busy = match seed % 3 {
        0 => Duration::from_secs(1),
        _ => Duration::ZERO,
    };
    (slow, busy)
}

/// A capture the simulator started: when, and the connection's start.
#[derive(Debug, Clone, Copy)]
pub(super) struct Started {
    of: CaptureOf,
    at: u64,
}

impl Sim {
    /// Once per turn: completes captures (doing the kills they held) and
    /// starts those the core asks for.
    pub(super) fn watch_slow(&mut self) -> Result<(), String> {
        let now = self.now();
        for done in self.core.captures_done(now) {
            let slot = done.record.slot;
            let i = (self.captures.iter())
                .position(|c| c.of.slot == slot && c.of.pid == done.record.pid)
                .ok_or_else(|| format!("a capture of slot {slot} completed, never started"))?;
            let started = self.captures.remove(i);
            if let Some((why, detail)) = done.kill {
                let on = self.core.board.get(slot);
                if !on.is_some_and(|s| {
                    s.pid == started.of.pid
                        && s.state == SlotState::Busy
                        && s.since == started.of.since
                }) {
                    return Err(format!(
                        "a capture's kill stands for slot {slot}, which moved on"
                    ));
                }
                self.core.kill(slot, why, detail, now);
                self.outcome.capture_kills += 1;
                self.carry_out()?;
            }
        }
        for of in self.core.slow_captures_due(now) {
            self.start_capture(of, None, now);
        }
        Ok(())
    }

    /// `Effect::BusyTooLong`: the kill waits for a capture when it can.
    pub(super) fn busy_too_long(&mut self, slot: usize, reason: KillReason, detail: String) {
        let now = self.now();
        let Some(kill) = self.core.hold_kill(slot, (reason, detail)) else {
            return;
        };
        match self.core.capture_before_kill(slot, now) {
            Some(of) => self.start_capture(of, Some(kill), now),
            None => self.core.kill(slot, kill.0, kill.1, now),
        }
    }

    fn start_capture(&mut self, of: CaptureOf, kill: Option<crate::core::HeldKill>, now: Instant) {
        let record = SlowCapture {
            slot: of.slot,
            pid: of.pid,
            peer: None,
            busy: now.saturating_duration_since(of.since),
            worker_stack: None,
            wchan: None,
            syscall: None,
            kernel_stack: None,
        };
        self.core.capture_started(of, record, kill, now);
        if of.pid % 2 == 0 {
            self.core.capture_line(of.slot, of.pid, "in handler", now);
        }
        self.captures.push(Started {
            of,
            at: self.world.now,
        });
        self.outcome.captures += 1;
    }

    /// The longest the loop may sleep for the captures under way.
    pub(super) fn captures_due_in(&self) -> Option<u64> {
        let wait = STACK_WAIT.as_nanos() as u64;
        let now = self.world.now;
        (self.captures.iter())
            .map(|c| (c.at + wait).saturating_sub(now))
            .min()
            .map(|d| d.max(MS / 1000))
    }
}
