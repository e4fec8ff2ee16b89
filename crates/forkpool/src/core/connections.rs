//! A connection or an accept order given to a child: the moves dispatch
//! makes, through the core like every other move.

use std::time::Instant;

use super::child::HasChild;
use super::Core;
use crate::scoreboard::own_move;

impl<L: HasChild> Core<L> {
    /// The child in `slot` was handed a connection (`handoff`).
    pub fn handed(&mut self, slot: usize, now: Instant) {
        own_move(self.board.hand_connection(slot, now));
    }

    /// The child in `slot` was ordered to accept on `listener` (`order`):
    /// it owes an answer, `Busy` or `Missed`.
    pub fn ordered_accept(&mut self, slot: usize, listener: usize, now: Instant) {
        if let Some(link) = self.board.link_mut(slot) {
            link.child_mut().role.ordered_on = Some(listener);
        }
        own_move(self.board.order_accept(slot, now));
    }
}
