//! Kernel dispatch: what the scoreboard says of a child, read by the
//! supervisor, in place of the reports a child sends in other modes. The
//! child writes its own record, so what it says is bounded here like any
//! message: counts that go back or jump are not believed.

use std::time::Instant;

use super::child::HasChild;
use super::effect::Effect;
use super::Core;
use crate::scoreboard::SlotState;

/// The most connections one reading believes a child finished or took
/// since the last (the supervisor reads at least every 100 ms).
pub(crate) const MOST_PER_SAMPLE: u64 = 1_000_000;

/// One slot's record on the scoreboard, as the supervisor read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sample {
    /// Serving a connection (a reservation reads as idle).
    pub busy: bool,
    /// Connections taken from its own socket since it started.
    pub taken: u64,
    /// Connections finished since it started.
    pub served: u64,
    /// Of those taken, the ones taken from the overflow as it finished one.
    pub next: u64,
}

/// How far a count moved, as believed: never back, never by more than
/// [`MOST_PER_SAMPLE`].
fn moved(before: u64, now: u64) -> u64 {
    now.saturating_sub(before).min(MOST_PER_SAMPLE)
}

impl<L: HasChild> Core<L> {
    /// The record of the child in `slot` reads `sample`: its state follows
    /// (idle to busy, busy to idle, counting what it finished), and the
    /// connections it took count as accepted. A child not yet ready, on
    /// its way out, or that does not keep its record (it said `R`, not
    /// `K`) is left as it is.
    pub fn sampled(&mut self, slot: usize, sample: Sample, now: Instant) {
        let Some(state) = self.board.get(slot).map(|s| s.state) else {
            return;
        };
        if !matches!(state, SlotState::Idle | SlotState::Busy) || !self.keeps_board(slot) {
            return;
        }
        let child = self.board.link_mut(slot).expect("occupied").child_mut();
        let (taken_before, served_before, next_before) = child.board_counts;
        let taken = moved(taken_before, sample.taken);
        let mut served = moved(served_before, sample.served);
        let next = moved(next_before, sample.next).min(taken);
        child.board_counts = (sample.taken, sample.served, sample.next);
        self.totals.accepted += taken;
        self.totals.taken_next += next;
        // The state was checked above, so both moves are legal; were one
        // refused, the slot is left as it was until the next reading.
        match (state, sample.busy) {
            (SlotState::Idle, true) => {
                // Busy now: a ping sent while it looked idle is answered
                // after its connection.
                child.ping = None;
                if self.board.busy(slot, now).is_err() {
                    return;
                }
            }
            (SlotState::Busy, false) => {
                // `idle` counts the connection the core saw begin.
                if self.board.idle(slot, now).is_err() {
                    return;
                }
                served = served.saturating_sub(1);
                self.effects.push(Effect::Room);
                self.effects.push(Effect::Served { slot });
            }
            _ => {}
        }
        if served > 0 {
            self.board.add_served(slot, served, now);
            self.effects.push(Effect::Served { slot });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_never_go_back_or_jump() {
        assert_eq!(moved(5, 7), 2);
        assert_eq!(moved(7, 5), 0);
        assert_eq!(moved(0, u64::MAX), MOST_PER_SAMPLE);
    }
}
