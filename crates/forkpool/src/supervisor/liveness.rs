//! Deadlines: pings for idle children, start-up, busy and stop limits.

use std::time::Instant;

use super::Supervisor;
use crate::core::Input;

impl Supervisor {
    /// The core's deadlines (`core/liveness.rs`): first what only the
    /// shell can see is told to it (a channel that sent an empty datagram
    /// and has since been closed),
    /// then it is ticked and what it asks is carried out.
    pub(super) fn check_liveness(&mut self, now: Instant) {
        let mut hung_up = Vec::new();
        for slot in 0..self.core.board.span() {
            let Some(link) = self.core.board.link(slot) else {
                continue;
            };
            if link.child.channel_closed
                && !link.child.role.hung_up
                && super::reports::peer_hung_up(&link.channel)
            {
                hung_up.push(slot);
            }
        }
        for slot in hung_up {
            self.core.on(Input::HungUp { slot }, now);
        }
        self.core.on(Input::Tick, now);
        self.carry_out(now);
    }
}
