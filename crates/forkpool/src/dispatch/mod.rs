//! Where a connection goes.
//!
//! The choice is always the same: the **lowest-numbered idle child**
//! ([`Scoreboard::lowest_idle`](crate::scoreboard::Scoreboard::lowest_idle)),
//! so the same few children stay hot in cache and memory while the highest
//! ones idle and can be retired. Children that serve many connections at
//! once fill up the same way: a connection goes to the lowest-numbered child
//! under its capacity
//! ([`Scoreboard::lowest_with_room`](crate::scoreboard::Scoreboard::lowest_with_room)),
//! in `handoff` dispatch, the only one they use. How the connection gets there depends on
//! the mode ([`DispatchMode`](crate::config::DispatchMode)):
//! - [`handoff`]: the supervisor accepts and passes the descriptor; a
//!   child finishing a connection takes a connection still waiting in the
//!   backlog itself (see [`crate::worker`]), since it would be handed to
//!   the very child that is about to become idle;
//! - [`order`]: the supervisor tells the child to accept;
//! - `shared` and `herd`: the children accept by themselves (see
//!   [`crate::worker`]); the supervisor only counts and scales;
//! - `none`: exec'd programs accept by themselves and report nothing; the
//!   supervisor keeps their number fixed (see [`crate::exec`]).
//!
//! When no child is idle the supervisor stops watching the listener, and new
//! connections wait in the kernel's listen backlog, never in a busy child's
//! private queue.

pub(crate) mod handoff;
pub(crate) mod order;

use std::time::Instant;

use crate::config::DispatchMode;
use crate::supervisor::Supervisor;

impl Supervisor {
    /// A watched listener became readable.
    pub(crate) fn dispatch(&mut self, listener: usize, now: Instant) {
        if listener >= self.listeners.len() {
            return;
        }
        match self.config.dispatch {
            DispatchMode::Handoff => self.accept_and_hand_off(listener, now),
            DispatchMode::Order => self.order_accepts(listener, now),
            DispatchMode::Shared | DispatchMode::None => {}
            #[cfg(feature = "herd")]
            DispatchMode::Herd => {}
        }
    }

    /// A child became idle (or has room again): it takes a parked
    /// connection first, if any. Paused listeners are watched again by the
    /// loop.
    pub(crate) fn child_available(&mut self, now: Instant) {
        while !self.parked.is_empty() {
            let Some(slot) = self.board.lowest_with_room() else {
                return;
            };
            let (listener, fd) = self.parked.pop_front().expect("checked non-empty");
            self.hand_off(slot, listener, fd, now);
        }
    }
}
