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
//! no child could take them, the dispatch latency) and works on the
//! [`Children`] it is lent (the core), moving a child only through the
//! core. It never kills a child or touches the poll: each pass ends in a
//! [`TurnEnd`] saying what the supervisor must do next.

pub(crate) mod handoff;
pub(crate) mod kernel;
pub(crate) mod order;

use std::collections::VecDeque;
use std::os::fd::{BorrowedFd, OwnedFd};

use socket2::SockAddr;
use std::time::Instant;

use prometheus_client::metrics::histogram::Histogram;

use crate::core::child::HasChild;
use crate::core::Core;
use crate::listener::Listener;
use crate::protocol::ParentMessage;

/// What dispatch needs of the children, and no more: which one has room,
/// a way to send it a connection or an order, and the two moves it makes
/// (through the core, like every move). The core over the supervisor's
/// links is one; dispatch knows nothing else of the supervisor.
pub(crate) trait Children {
    /// The lowest-numbered child with room for one more connection.
    fn lowest_with_room(&self) -> Option<usize>;
    /// The lowest-numbered idle child.
    fn lowest_idle(&self) -> Option<usize>;
    /// Whether the child in `slot` is idle.
    fn is_idle(&self, slot: usize) -> bool;
    /// The pid of the child in `slot`.
    fn pid(&self, slot: usize) -> Option<i32>;
    /// Sends `msg`, with `fd` (a connection) if given, to the child in
    /// `slot`.
    fn send(
        &self,
        slot: usize,
        msg: ParentMessage,
        fd: Option<BorrowedFd<'_>>,
    ) -> std::io::Result<()>;
    /// The child in `slot` was handed a connection.
    fn handed(&mut self, slot: usize, now: Instant);
    /// The child in `slot` was ordered to accept on `listener`.
    fn ordered(&mut self, slot: usize, listener: usize, now: Instant);
    /// Kernel dispatch: whether the child in `slot` keeps its record on
    /// the scoreboard (so handing it a connection claims it there first).
    fn keeps_board(&self, _slot: usize) -> bool {
        false
    }
}

/// A link the supervisor can send on: its channel.
pub(crate) trait Sends {
    /// Sends `msg`, with `fd` (a connection) if given.
    fn send(&self, msg: ParentMessage, fd: Option<BorrowedFd<'_>>) -> std::io::Result<()>;
}

impl<L: HasChild + Sends> Children for Core<L> {
    fn keeps_board(&self, slot: usize) -> bool {
        Core::keeps_board(self, slot)
    }

    /// A child that accepts by itself (`G`) is never handed or ordered
    /// a connection: the lowest idle one that is, then.
    fn lowest_with_room(&self) -> Option<usize> {
        match self.board().lowest_with_room() {
            Some(slot) if !self.takes_handed(slot) => Children::lowest_idle(self),
            lowest => lowest,
        }
    }

    fn lowest_idle(&self) -> Option<usize> {
        match self.board().lowest_idle() {
            Some(slot) if !self.takes_handed(slot) => self
                .board()
                .idle_slots()
                .find(|&slot| self.takes_handed(slot)),
            lowest => lowest,
        }
    }

    /// Idle, and able to take a handed connection: a kernel dispatch
    /// child on the messages path (`G`) takes its own socket's only.
    fn is_idle(&self, slot: usize) -> bool {
        self.board()
            .get(slot)
            .is_some_and(|s| s.state == crate::slot::SlotState::Idle)
            && self.takes_handed(slot)
    }

    fn pid(&self, slot: usize) -> Option<i32> {
        self.board().get(slot).map(|s| s.pid)
    }

    fn send(
        &self,
        slot: usize,
        msg: ParentMessage,
        fd: Option<BorrowedFd<'_>>,
    ) -> std::io::Result<()> {
        match self.board().link(slot) {
            Some(link) => link.send(msg, fd),
            None => Err(std::io::Error::other("no child in the slot")),
        }
    }

    fn handed(&mut self, slot: usize, now: Instant) {
        Core::handed(self, slot, now);
    }

    fn ordered(&mut self, slot: usize, listener: usize, now: Instant) {
        self.ordered_accept(slot, listener, now);
    }
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

    /// Kernel dispatch: accepts everything queued on `socket` (an empty
    /// slot's, for `listener`) and parks it for the next child with room;
    /// returns how many.
    pub fn park_all(&mut self, listener: usize, socket: BorrowedFd<'_>) -> u64 {
        let mut taken = 0;
        while let Ok((fd, peer)) = crate::sys::socket::accept_with_peer(socket) {
            self.parked.push_back(Accepted { listener, fd, peer });
            taken += 1;
        }
        taken
    }

    /// A child has room again: parked connections go to the lowest children
    /// with room, as long as there are both. `handed` hears of each one
    /// (slot, pid, descriptor) as it goes.
    pub fn hand_parked(
        &mut self,
        children: &mut impl Children,
        now: Instant,
        mut handed: impl FnMut(usize, i32, Option<&SockAddr>),
    ) -> TurnEnd {
        // Called on every report that frees a child: the queue, almost
        // always empty, is looked at before the slot table.
        while !self.parked.is_empty() {
            let Some(slot) = children.lowest_with_room() else {
                return TurnEnd::Done;
            };
            let accepted = self.parked.pop_front().expect("checked non-empty");
            if let Err(end) = self.hand_off(children, slot, accepted, now, &mut handed) {
                return end;
            }
        }
        TurnEnd::Done
    }
}
