//! Every timer is the core's: the simulator knows, independently of the
//! core, how long the loop may sleep after a turn (the board is read every
//! 100 ms in kernel dispatch, every 12 ms while a connection may wait
//! behind another; while the dispatch width leaves children out, its look
//! comes every 20 ms; a round of `/proc` samples begins every second, its
//! next group 10 ms after the last; a change of the board is in the
//! "child states" line within a second), and fails a seed whose loop
//! slept longer. The loop
//! sleeps until the core's `next_deadline` or the world's next happening,
//! so a timer the core leaves out of `next_deadline` shows here.

use super::world::MS;
use super::Sim;
use crate::core::paced::STATUS_LINE_INTERVAL;
use crate::core::samples::{BETWEEN_CHUNKS, CHILDREN_PER_TURN, SAMPLE_INTERVAL};
use crate::policy::cpu_wait::LOOK_INTERVAL;
use crate::policy::reservations::{BEHIND_READ_INTERVAL, READ_INTERVAL};
use crate::scoreboard::SlotState;

/// What the clock may overshoot a timer by (the world's own steps).
const SLACK: u64 = MS;

fn nanos(d: std::time::Duration) -> u64 {
    d.as_nanos() as u64
}

impl Sim {
    /// At the end of a turn: the longest the loop may sleep now, and why.
    pub(super) fn timers_at_turn_end(&mut self) {
        let now = self.now();
        let now_ns = self.world.now;
        let mut longest = (u64::MAX, "nothing");
        let mut consider = |limit: u64, what: &'static str| {
            if limit < longest.0 {
                longest = (limit, what);
            }
        };
        if self.scenario.kernel && self.core.shutdown.is_none() {
            consider(nanos(READ_INTERVAL), "the board's reading");
            if self.core.may_wait_behind(now) {
                consider(nanos(BEHIND_READ_INTERVAL), "the look behind busy children");
            }
        }
        if self.core.board.width().is_some() && self.core.shutdown.is_none() {
            consider(nanos(LOOK_INTERVAL), "the dispatch width's look");
        }
        match self.samples {
            Some((_, true)) => consider(nanos(BETWEEN_CHUNKS), "the round of samples' next group"),
            Some((began, false)) => consider(
                (began + nanos(SAMPLE_INTERVAL)).saturating_sub(now_ns),
                "the next round of samples",
            ),
            None => {}
        }
        if let (Some(at), shown) = self.status_line {
            if shown != self.core.board.changes() {
                let due = (at + nanos(STATUS_LINE_INTERVAL)).saturating_sub(now_ns);
                consider(due, "the status line's change held back");
            }
        }
        if let Some(due) = self.captures_due_in() {
            consider(due, "a slow-request capture's completion");
        }
        self.last_turn = Some((self.world.now, longest.0, longest.1));
    }

    /// Once per turn, as the shell does: the group of children the core
    /// names is sampled. Each is alive, known by its pid and not killed,
    /// and no group is larger than the shell may read in one turn.
    pub(super) fn sample(&mut self) -> Result<(), String> {
        let Some(turn) = self.core.samples_due(self.now()) else {
            return Ok(());
        };
        if turn.children.len() > CHILDREN_PER_TURN {
            return Err(format!(
                "{} children sampled in one turn",
                turn.children.len()
            ));
        }
        for &slot in &turn.children {
            let entry = self.core.board.get(slot);
            if !entry.is_some_and(|s| s.pid > 0 && s.state != SlotState::Killed) {
                return Err(format!("slot {slot} sampled, with no child to read"));
            }
        }
        let began = match self.samples {
            Some((began, true)) => began,
            _ => self.world.now,
        };
        self.samples = Some((began, !turn.round_done));
        Ok(())
    }

    /// Once per turn, as the shell does: the "child states" line, when
    /// the core says it is due.
    pub(super) fn status_line(&mut self) {
        if self.core.status_line_due(self.now()).is_some() {
            self.status_line = (Some(self.world.now), self.core.board.changes());
        }
    }

    /// At the start of a turn: the loop did not sleep past a timer.
    pub(super) fn check_timers_kept(&self) -> Result<(), String> {
        let Some((at, longest, what)) = self.last_turn else {
            return Ok(());
        };
        let slept = self.world.now.saturating_sub(at);
        if longest != u64::MAX && slept > longest + SLACK {
            return Err(format!(
                "the loop slept {} ms, past {what} due {} ms after the last turn: \
                 a timer the core does not report",
                slept / MS,
                longest / MS
            ));
        }
        Ok(())
    }
}
