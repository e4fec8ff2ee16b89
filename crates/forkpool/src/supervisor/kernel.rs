//! The supervisor's side of kernel dispatch: setting it up or falling
//! back to `handoff` (once, saying why), a socket per slot before each
//! fork, and what is left on a slot whose child is gone.

use std::os::fd::AsFd;
use std::time::Instant;

use mio::unix::SourceFd;
use mio::Interest;
use tracing::{info, warn};

use super::event::Event;
use super::Supervisor;
use crate::config::DispatchMode;
use crate::core::slot_limit;
use crate::core::Counted;
use crate::core::Input;
use crate::dispatch::kernel::board::{self, SlotWord};
use crate::dispatch::kernel::program::MAX_SLOTS;
use crate::dispatch::kernel::Kernel;
use crate::policy::width::WidthMove;
use crate::protocol::WorkerOrder;
use crate::scoreboard::SlotState;

impl Supervisor {
    /// Sets kernel dispatch up when it is asked for (`--dispatch kernel`);
    /// where it cannot run, falls back to `handoff` with one log line and
    /// the reason in status (`dispatch_fallback`). `refused` names children
    /// it does not serve yet, if these are such.
    pub(crate) fn settle_dispatch(&mut self, refused: Option<&str>) {
        if self.core.config().dispatch != DispatchMode::Kernel {
            return;
        }
        let slots = slot_limit(self.core.config().max_children, true);
        let attempt = match refused {
            Some(why) => Err(why.to_string()),
            None if slots > MAX_SLOTS => Err(format!(
                "{slots} slots (twice max_children, for reloads): the kernel program scans at most \
                 {MAX_SLOTS}; lower max_children to {} or less",
                MAX_SLOTS / 2
            )),
            None => {
                let fds: Vec<_> = self.listeners.iter().map(|l| l.listener.as_fd()).collect();
                Kernel::new(&fds, slots, self.core.config().backlog).map_err(|e| e.to_string())
            }
        };
        match attempt {
            Ok(kernel) => {
                info!(
                    slots,
                    "kernel dispatch: the kernel picks the lowest idle child for each connection"
                );
                self.kernel = Some(kernel);
            }
            Err(why) => {
                // Children it does not serve are a known limit; a kernel
                // that refuses is worth a warning.
                if refused.is_some() {
                    info!("kernel dispatch does not serve these children ({why}); using handoff");
                } else {
                    warn!("kernel dispatch cannot run ({why}); falling back to handoff");
                }
                self.core.fall_back_to_handoff();
                self.published.dispatch_fallback = Some(why);
            }
        }
    }

    /// The dispatch mode a reloaded configuration asks for, as this pool
    /// can run it: `kernel` stays what it became at start.
    pub(crate) fn settled_mode(&self, asked: DispatchMode) -> DispatchMode {
        match (asked, &self.published.dispatch_fallback) {
            (DispatchMode::Kernel, Some(_)) => DispatchMode::Handoff,
            (asked, _) => asked,
        }
    }

    /// Kernel dispatch: the slots' sockets take the listeners'
    /// `TCP_DEFER_ACCEPT` again (after a reload changed it).
    pub(crate) fn follow_defer_accept(&mut self) -> std::io::Result<()> {
        let Some(kernel) = self.kernel.as_mut() else {
            return Ok(());
        };
        let fds: Vec<_> = self.listeners.iter().map(|l| l.listener.as_fd()).collect();
        kernel.follow_defer_accept(&fds)
    }

    /// An upgrade starts: the listeners leave this pool's socket arrays,
    /// so the new supervisor can put them in its own (a socket is in one
    /// at a time); this pool's children keep their sockets.
    pub(crate) fn release_listeners_for_successor(&self) {
        if let Some(kernel) = &self.kernel {
            if let Err(e) = kernel.release_listeners() {
                warn!("kernel dispatch: cannot release the listeners to the new supervisor: {e}");
            }
        }
    }

    /// The upgrade failed: the listeners are this pool's overflow again.
    pub(crate) fn reclaim_listeners_from_successor(&self) {
        if let Some(kernel) = &self.kernel {
            let fds: Vec<_> = self.listeners.iter().map(|l| l.listener.as_fd()).collect();
            if let Err(e) = kernel.restore_listeners(&fds) {
                warn!("kernel dispatch: cannot take the listeners back after the upgrade: {e}");
            }
        }
    }

    /// The slots kernel dispatch was set up for (0 without it).
    pub(crate) fn kernel_slots(&self) -> usize {
        self.kernel.as_ref().map_or(0, |k| k.board().slots())
    }

    /// Before forking into `slot`: its sockets exist (made the first time
    /// a child takes the slot), and the supervisor stops watching them
    /// (the child will).
    pub(crate) fn seat_child(&mut self, slot: usize) -> std::io::Result<()> {
        let Some(kernel) = self.kernel.as_mut() else {
            return Ok(());
        };
        kernel.seat(slot)?;
        kernel.board().reset(slot);
        // The supervisor keeps watching the sockets until the child takes
        // connections itself (`watch_until_ready`): one that reaches them
        // while it starts (a late handshake for the child before it) is
        // handed on rather than left waiting for the start-up.
        Ok(())
    }

    /// A worker forked by a template said `K`: its slot's sockets (made
    /// now if need be) and the scoreboard go to it with `S`, and its share
    /// of connections. A failed send is a failed send to the child.
    pub(crate) fn send_seat(&mut self, slot: usize, now: Instant) {
        let sent = self.seat_child(slot).and_then(|()| {
            let share = self.core.limits(slot).max_requests;
            let (Some(kernel), Some(link)) = (self.kernel.as_ref(), self.core.board().link(slot))
            else {
                return Ok(());
            };
            let mut fds: Vec<_> = kernel.sockets(slot).map(|(_, fd)| fd).collect();
            fds.push(kernel.board_map());
            let seat = WorkerOrder::Seat {
                listeners: u16::try_from(self.listeners.len()).unwrap_or(u16::MAX),
                max_requests: share,
            };
            link.channel.send_order_with_fds(seat, &fds)
        });
        if let Err(e) = sent {
            self.core.on(
                Input::SendFailed {
                    slot,
                    peer_gone: super::children::is_peer_gone(&e),
                    detail: format!("cannot send its sockets: {e}"),
                },
                now,
            );
        }
    }

    /// A child on the messages path (`G`) said it is idle or busy: its
    /// record on the scoreboard says so, as a `K` child's own store would.
    pub(crate) fn mark_board(&self, slot: usize, idle: bool) {
        let Some(kernel) = &self.kernel else {
            return;
        };
        if idle {
            kernel.board().set_idle(slot);
        } else {
            kernel.board().set_busy(slot);
        }
    }

    /// Kernel dispatch: takes the worker in `slot` on the scoreboard
    /// (idle to busy) before it is made the template, if it is idle; true
    /// if it was claimed.
    pub(crate) fn claim_for_refork(&self, slot: usize) -> bool {
        match &self.kernel {
            Some(kernel) if self.core.keeps_board(slot) => kernel.board().claim(slot),
            _ => false,
        }
    }

    /// The refork did not happen after all: a worker claimed for it is
    /// idle again.
    pub(crate) fn unclaim_for_refork(&self, slot: usize, claimed: bool) {
        if let (Some(kernel), true) = (&self.kernel, claimed) {
            kernel.board().set_idle(slot);
        }
    }

    /// A child has left `slot`: nothing more is queued on its sockets (its
    /// word busy), and the supervisor watches them, so a connection the
    /// kernel gave the child just before it left (or whose handshake ends
    /// later) is accepted and handed on like an overflow connection.
    pub(crate) fn unseat_child(&mut self, slot: usize, now: Instant) {
        let Some(kernel) = self.kernel.as_ref() else {
            return;
        };
        kernel.board().set_busy(slot);
        self.watch_slot_sockets(slot, now);
    }

    /// The supervisor watches `slot`'s sockets and takes what waits there
    /// (to hand it on), until the slot's next child takes connections
    /// itself (`watch_until_ready`).
    fn watch_slot_sockets(&mut self, slot: usize, now: Instant) {
        let Some(kernel) = self.kernel.as_ref() else {
            return;
        };
        let registry = self.wake.poll.registry();
        for (listener, fd) in kernel.sockets(slot) {
            let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
            if registry
                .register(
                    &mut SourceFd(&raw),
                    Event::SlotSocket(slot, listener).token(),
                    Interest::READABLE,
                )
                .is_ok()
            {
                self.wake.orphaned_sockets.push((slot, listener));
            }
        }
        for (s, listener) in self.wake.orphaned_sockets.clone() {
            if s == slot {
                self.take_orphaned(slot, listener, now);
            }
        }
    }

    /// Stops watching the sockets of each slot whose child now takes its
    /// connections itself (ready, on the board or by messages).
    fn watch_until_ready(&mut self) {
        if self.wake.orphaned_sockets.is_empty() {
            return;
        }
        let ready: Vec<usize> = self
            .wake
            .orphaned_sockets
            .iter()
            .map(|&(slot, _)| slot)
            .filter(|&slot| {
                self.core.serves_own_socket(slot)
                    && self
                        .core
                        .board()
                        .get(slot)
                        .is_some_and(|s| matches!(s.state, SlotState::Idle | SlotState::Busy))
            })
            .collect();
        for slot in ready {
            self.unwatch_slot_sockets(slot);
        }
    }

    fn unwatch_slot_sockets(&mut self, slot: usize) {
        let Some(kernel) = self.kernel.as_ref() else {
            return;
        };
        let registry = self.wake.poll.registry();
        self.wake.orphaned_sockets.retain(|&(s, listener)| {
            if s != slot {
                return true;
            }
            if let Some((_, fd)) = kernel.sockets(slot).find(|&(l, _)| l == listener) {
                let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
                let _ = registry.deregister(&mut SourceFd(&raw));
            }
            false
        });
    }

    /// An empty slot's socket is readable: accept what waits there and
    /// hand it on (to the lowest idle child, or parked until one is).
    pub(crate) fn take_orphaned(&mut self, slot: usize, listener: usize, now: Instant) {
        let Some(kernel) = self.kernel.as_ref() else {
            return;
        };
        let Some((_, fd)) = kernel.sockets(slot).find(|&(l, _)| l == listener) else {
            return;
        };
        // A pool of messages children could never be handed them: they
        // wait on the socket for the slot's next child, which the core
        // starts for them.
        if !self.core.hands_on() {
            if kernel.queued_on(slot) > 0 {
                self.core.left_on_socket(slot);
            }
            return;
        }
        let taken = self.dispatcher.park_all(listener, fd);
        self.core.count(Counted::Accepted(taken));
        if taken > 0 {
            info!(
                slot,
                listener, taken, "connections left on a leaving child's socket, handed on"
            );
            self.child_available(now);
        }
    }
}

impl Supervisor {
    /// Kernel dispatch: reads every child's record on the scoreboard into
    /// the core (children report nothing per connection), then carries out
    /// what that asks (a parked connection for a child now idle, a recycle).
    pub(crate) fn read_board(&mut self, now: Instant) {
        let Some(kernel) = self.kernel.as_ref() else {
            return;
        };
        let board = kernel.board();
        // Each turn of the loop: no allocation, one record read per slot
        // in use (`sampled` leaves an empty slot alone).
        let span = self.core.board().span().min(board.slots());
        for slot in 0..span {
            self.core.sampled(slot, board.sample(slot), now);
        }
        // Reservations: the young ones hold children the core counts
        // idle, and the old ones are given back so their slots come first
        // again. What never reached a child is counted, not logged.
        let now_ns = board::kernel_clock_ns();
        let look = kernel.look_at_reservations(span, now_ns, self.core.config().defer_accept);
        self.core.board_read(look, now);
        board.set_spread(self.core.spread_over());
        self.watch_until_ready();
        self.carry_out(now);
        if self.core.behind_look_due(now) {
            self.take_what_waits_behind(now);
        }
    }

    /// After the program took a reservation over, its own connection may
    /// have come after all, and wait on that (now busy) child's socket
    /// behind the other: the core hears how many wait so (scaling counts
    /// them), and they go to an idle child, as the overflow's do.
    fn take_what_waits_behind(&mut self, now: Instant) {
        let Some(kernel) = self.kernel.as_ref() else {
            return;
        };
        let behind: Vec<(usize, u32)> = self
            .core
            .board()
            .iter()
            .filter(|&(slot, s)| s.state == SlotState::Busy && self.core.serves_own_socket(slot))
            .map(|(slot, _)| (slot, kernel.queued_on(slot)))
            .filter(|&(_, queued)| queued > 0)
            .collect();
        self.core
            .looked_behind(behind.iter().map(|&(_, n)| n).sum(), now);
        for (slot, _) in behind {
            if !self.has_room_for_overflow() {
                return;
            }
            let Some(kernel) = self.kernel.as_ref() else {
                return;
            };
            let mut taken = 0;
            for (listener, fd) in kernel.sockets(slot) {
                taken += self.dispatcher.park_all(listener, fd);
            }
            if taken > 0 {
                self.core.count(Counted::Accepted(taken));
                self.child_available(now);
            }
        }
    }

    /// Whether a connection taken from a listener now would find a child.
    /// In kernel dispatch the core's idle children are as of the last
    /// reading of the scoreboard (up to 100 ms old); a child that keeps its
    /// record may be busy or reserved since, so the board decides for it.
    /// Without this the supervisor, seeing room the board does not have,
    /// watched the overflow, woke, found no child, and stopped watching it,
    /// thousands of times a second while the pool was saturated.
    pub(crate) fn has_room_for_overflow(&self) -> bool {
        if self.core.hosts_sessions() {
            return self.core.board().has_room();
        }
        // A child that accepts by itself (`G`) has no room for one.
        let mut takers = self
            .core
            .board()
            .idle_slots()
            .filter(|&slot| self.core.takes_handed(slot));
        let Some(kernel) = &self.kernel else {
            return takers.next().is_some();
        };
        let board = kernel.board();
        let now_ns = board::kernel_clock_ns();
        takers.any(|slot| {
            !self.core.keeps_board(slot)
                || (slot < board.slots() && {
                    let word = board.state(slot);
                    word == SlotWord::Idle || word.dead_at(now_ns)
                })
        })
    }

    /// Kernel dispatch: moves the dispatch width by how the serving
    /// children use the CPUs (`policy::width`), and puts its bound on the
    /// scoreboard, where the program and the children read it. Returns
    /// whether it widened: the waiting connections then have children
    /// again (the overflow is watched for them), and the CPUs' use is
    /// measured afresh before it widens by one more.
    ///
    /// The measure is over every serving child, busy or idle (a look at
    /// most every 20 ms, while connections end): a child the kernel woke
    /// for a connection waits for a CPU before it accepts and marks itself
    /// busy, so on CPUs the clients share most of a pool's waiting is
    /// where the busy children's measure (the scaling hold's) never looks.
    pub(crate) fn steer_width(&mut self, now: Instant) -> bool {
        if self.kernel.is_none() {
            return false;
        }
        let cpus = u32::try_from(self.core.pool_watch().cpus()).unwrap_or(u32::MAX);
        let last_look = if self.core.config().hold_when_cpu_bound {
            self.look_at_pool_waiting(now)
        } else {
            None
        };
        let cpu = self.core.pool_watch().use_at(now);
        let Some(kernel) = self.kernel.as_ref() else {
            return false;
        };
        let listeners = &self.listeners;
        // What waits on the overflow, and behind busy children after a
        // takeover (as last looked at).
        let behind = self.core.queued_behind(now);
        let queued = || listeners.iter().map(|l| l.listener.queued()).sum::<u32>() + behind;
        let moved = self.core.steer_width(cpu, last_look, queued, cpus, now);
        kernel.board().set_bound(self.core.board().dispatch_bound());
        if moved != WidthMove::Widened {
            return false;
        }
        self.core.pool_changed();
        if self.has_room_for_overflow() {
            self.child_available(now);
            self.rewatch_listeners(now);
        }
        true
    }

    /// At the end of a turn: while connections wait for a child (parked,
    /// or in the listener's backlog because no child had room), children
    /// going idle are asked to say so (`I`); set first, then the
    /// scoreboard read again, so a child that went idle just before is
    /// not missed.
    pub(crate) fn ask_for_idle_children(&mut self, now: Instant) {
        let Some(kernel) = self.kernel.as_ref() else {
            return;
        };
        // A listener not watched (no child had room) with nothing queued
        // needs no wake-up: a child finishing a connection looks at the
        // overflow itself before it goes idle. Only connections the
        // supervisor holds, or ones queued on the overflow, do.
        let waiting = self.core.shutdown().is_none()
            && (self.dispatcher.parked() > 0
                || self
                    .listeners
                    .iter()
                    .any(|l| !l.watched && l.listener.queued() > 0));
        kernel.board().set_waiting(waiting);
        self.core.connections_waiting(waiting);
        if waiting {
            self.read_board(now);
            if self.has_room_for_overflow() {
                self.child_available(now);
                self.rewatch_listeners(now);
            }
        }
    }
}
