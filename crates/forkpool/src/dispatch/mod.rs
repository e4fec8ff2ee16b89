//! Where a connection goes.
//!
//! The choice is always the same: the **lowest-numbered child with room**
//! (see [`crate::policy::dispatch`]), so the same few children stay hot in
//! cache and memory while the highest ones idle and can be retired. How the
//! connection gets there depends on the mode
//! ([`DispatchMode`](crate::config::DispatchMode)):
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
//! When no child has room the supervisor stops watching the listener, and
//! new connections wait in the kernel's listen backlog, never in a busy
//! child's private queue.
//!
//! [`Dispatcher`] owns what dispatch alone needs (connections parked while
//! no child could take them, the dispatch latency) and works on the slot
//! table it is lent. It never kills a child or touches the poll: each pass
//! ends in a [`TurnEnd`] saying what the supervisor must do next.

pub(crate) mod handoff;
pub(crate) mod order;

use std::collections::VecDeque;
use std::os::fd::{BorrowedFd, OwnedFd};

use socket2::SockAddr;
use std::time::Instant;

use prometheus_client::metrics::histogram::Histogram;

use crate::listener::Listener;
use crate::protocol::ParentMessage;
use crate::scoreboard::Scoreboard;

/// What dispatch needs of the supervisor's side of a child, and no more:
/// a way to send it a connection or an order, and where to note the
/// listener it was ordered to accept from. The supervisor's `ChildLink`
/// is one; dispatch knows nothing else of the supervisor.
pub(crate) trait ChildEnd {
    /// Sends `msg`, with `fd` (a connection) if given.
    fn send(&self, msg: ParentMessage, fd: Option<BorrowedFd<'_>>) -> std::io::Result<()>;
    /// The listener the child was last ordered to accept from, until it
    /// answers.
    fn ordered_on(&mut self) -> &mut Option<usize>;
}

/// A listener and its dispatch state.
#[derive(Debug)]
pub(crate) struct WatchedListener {
    pub listener: Listener,
    /// Registered with the poll (handoff and order dispatch only).
    pub watched: bool,
    /// Accept paused until this time after running out of descriptors.
    pub resume_at: Option<Instant>,
    /// `order` dispatch: accept orders sent and not yet answered.
    pub orders_out: u32,
    /// Look at this listener in this turn's dispatch pass.
    pub recheck: bool,
}

impl WatchedListener {
    /// A listener not yet watched.
    pub fn new(listener: Listener) -> WatchedListener {
        WatchedListener {
            listener,
            watched: false,
            resume_at: None,
            orders_out: 0,
            recheck: false,
        }
    }
}

/// How one dispatch pass ended: what the supervisor does next.
#[derive(Debug, PartialEq, Eq)]
#[must_use]
pub(crate) enum TurnEnd {
    /// Nothing more waits for now.
    Done,
    /// No child has room: stop watching the listener; the rest wait in the
    /// kernel's backlog until a child has room again.
    Saturated,
    /// Out of descriptors or memory: stop accepting until then.
    Pause(Instant),
    /// The child in `slot` could not be sent to (its connection, if it was
    /// given one, is parked): kill it, then dispatch again.
    Unreachable {
        /// The child that could not be reached.
        slot: usize,
        /// What the send said.
        why: String,
    },
}

/// A connection the supervisor accepted, on its way to a child.
pub(crate) struct Accepted {
    /// The listener it came in on.
    listener: usize,
    /// The connection.
    fd: OwnedFd,
    /// Its peer, as `accept` gave it (for the status page).
    peer: SockAddr,
}

/// What dispatch keeps between turns.
pub(crate) struct Dispatcher {
    /// Connections accepted whose child could not take them; the next
    /// child with room gets them first.
    parked: VecDeque<Accepted>,
    /// From readiness to the connection (or the order) sent.
    latency: Histogram,
}

impl Default for Dispatcher {
    fn default() -> Self {
        Dispatcher {
            parked: VecDeque::new(),
            latency: crate::metrics::dispatch_latency_histogram(),
        }
    }
}

impl Dispatcher {
    /// How long dispatch took, readiness to send, for the metrics.
    pub fn latency(&self) -> &Histogram {
        &self.latency
    }

    /// How many accepted connections wait for a child.
    pub fn parked(&self) -> usize {
        self.parked.len()
    }

    /// Closes the parked connections (the pool is stopping); returns how
    /// many there were.
    pub fn close_parked(&mut self) -> usize {
        let count = self.parked.len();
        self.parked.clear();
        count
    }

    /// A child has room again: parked connections go to the lowest children
    /// with room, as long as there are both. `handed` hears of each one
    /// (slot, pid, descriptor) as it goes.
    pub fn hand_parked(
        &mut self,
        board: &mut Scoreboard<impl ChildEnd>,
        now: Instant,
        mut handed: impl FnMut(usize, i32, Option<&SockAddr>),
    ) -> TurnEnd {
        // Called on every report that frees a child: the queue, almost
        // always empty, is looked at before the slot table.
        while !self.parked.is_empty() {
            let Some(slot) = board.lowest_with_room() else {
                return TurnEnd::Done;
            };
            let accepted = self.parked.pop_front().expect("checked non-empty");
            if let Err(end) = self.hand_off(board, slot, accepted, now, &mut handed) {
                return end;
            }
        }
        TurnEnd::Done
    }
}
