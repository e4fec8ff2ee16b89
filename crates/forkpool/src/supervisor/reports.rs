//! What a child's report means for its slot. A report that does not fit
//! the child's state, or does not decode, gets the child killed; nothing a
//! child writes can stop the supervisor.

use std::os::fd::AsFd;
use std::time::Instant;

use tracing::debug;

use super::{Readiness, Supervisor};
use crate::channel::{Channel, Incoming};
use crate::policy::budget::MESSAGES_PER_SECOND;
use crate::policy::liveness::{closed_channel_grace, unverified_closed_grace, Deadlines};
use crate::policy::messages;
use crate::protocol::ChildMessage;
use crate::scoreboard::{IllegalTransition, SlotState};
use crate::status::KillReason;

/// How many reports to take from one child per loop turn, so one chatty
/// child cannot starve the others. A child with more waiting is read again
/// next turn: the channel is edge-triggered, so stopping short of
/// `WouldBlock` without noting it would leave those reports unread until
/// the child sent another, and a child whose channel is full sends nothing.
const REPORTS_PER_TURN: usize = 64;

impl Supervisor {
    /// Reads what the child in `slot` has sent.
    pub(super) fn read_reports(&mut self, slot: usize, now: Instant) {
        for read in 0..=REPORTS_PER_TURN {
            if read == REPORTS_PER_TURN {
                self.unread.push(slot);
                return;
            }
            let Some(link) = self.core.board.link(slot) else {
                return;
            };
            if link.child.channel_closed {
                return;
            }
            let (incoming, sender) = match link.receive() {
                Ok(received) => received,
                Err(e) => {
                    self.kill(
                        slot,
                        KillReason::ChannelFailed,
                        format!("back-channel read failed: {e}"),
                        now,
                    );
                    return;
                }
            };
            match incoming {
                Incoming::Message(msg, _) => {
                    if self.unverified(slot) {
                        match self.verify_worker(slot, sender, now) {
                            Ok(true) => {}
                            Ok(false) => return,
                            Err(why) => {
                                self.template_failed_worker(slot, why, now);
                                return;
                            }
                        }
                    }
                    let over_budget = self
                        .core
                        .board
                        .link_mut(slot)
                        .is_some_and(|l| !l.child.messages.spend(now, 1));
                    if over_budget {
                        let why = format!(
                            "sent more than {MESSAGES_PER_SECOND} messages a second on its back-channel"
                        );
                        self.kill(slot, KillReason::Misbehaved, why, now);
                        return;
                    }
                    self.core.board.heard_from(slot, now);
                    if let Err(why) = self.apply_report(slot, msg, now) {
                        self.kill(slot, KillReason::Misbehaved, why, now);
                        return;
                    }
                }
                Incoming::WouldBlock => return,
                Incoming::Closed => {
                    self.channel_closed(slot, now);
                    return;
                }
                Incoming::Malformed(why) => {
                    self.kill(
                        slot,
                        KillReason::Misbehaved,
                        format!("sent a malformed message: {why}"),
                        now,
                    );
                    return;
                }
            }
        }
    }

    /// Acts on one report from the child in `slot`: each kind of report is
    /// one verb below. An `Err` is why the child is killed as misbehaved.
    fn apply_report(&mut self, slot: usize, msg: ChildMessage, now: Instant) -> Result<(), String> {
        self.check_report_kind(&msg)?;
        messages::mode_allows(self.core.config.dispatch, &msg)?;
        match msg {
            ChildMessage::Ready { pid } => self.on_ready(slot, pid, now),
            ChildMessage::Idle => self.on_idle(slot, now),
            ChildMessage::Busy => self.on_busy(slot, now),
            ChildMessage::Next => self.on_next(slot, now),
            ChildMessage::Leaving => self.on_leaving(slot, now),
            ChildMessage::Missed => self.on_missed(slot, now),
            ChildMessage::Pong { seq } => self.on_pong(slot, seq),
            ChildMessage::Load {
                open,
                capacity,
                received,
            } => self.on_load(slot, open, capacity, received, now),
        }
    }

    /// `Ready`: the child is up. Checks it is who it says it is, gives a
    /// worker forked by a template its own process group, and records how
    /// long its start took.
    fn on_ready(&mut self, slot: usize, pid: u32, now: Instant) -> Result<(), String> {
        let expected = self.core.board.get(slot).map_or(0, |s| s.pid);
        if i64::from(pid) != i64::from(expected) {
            return Err(format!("said it is pid {pid}, but it is pid {expected}"));
        }
        if self
            .core
            .board
            .link(slot)
            .is_some_and(|l| l.child.version == crate::protocol::TEMPLATE_VERSION)
        {
            // Forked by a template, it is in the template's
            // process group; now it is the supervisor's child, it
            // gets a group of its own like every worker
            // (`containment.rs`).
            let _ = crate::sys::process::own_process_group(expected);
        }
        self.core.board.ready(slot, now).map_err(out_of_order)?;
        if let Some(link) = self.core.board.link_mut(slot) {
            link.child.readiness =
                Readiness::Said(now.saturating_duration_since(link.child.spawned_at));
        }
        self.child_available(now);
        Ok(())
    }

    /// `Pong`: the answer to a ping, possibly a late one.
    fn on_pong(&mut self, slot: usize, seq: u32) -> Result<(), String> {
        let link = self.core.board.link_mut(slot).expect("checked by caller");
        // Sequence numbers only grow, so any pong up to the last
        // ping sent is a real answer, possibly a late one (in
        // `shared` mode a ping can cross a `Busy`); a pong for a
        // ping never sent is a lie.
        if seq == 0 || seq > link.child.pinged_up_to {
            return Err(format!("sent pong {seq} for a ping it never got"));
        }
        messages::pong_is_new(seq, link.child.answered_up_to)?;
        link.child.answered_up_to = seq;
        if link
            .child
            .ping
            .is_some_and(|(outstanding, _)| seq >= outstanding)
        {
            link.child.ping = None;
        }
        Ok(())
    }

    /// `Idle`: the child finished its connection (or its start) and waits
    /// for work.
    fn on_idle(&mut self, slot: usize, now: Instant) -> Result<(), String> {
        self.note_connection_end(slot, now);
        let finished = self.core.board.idle(slot, now).map_err(out_of_order)?;
        if finished {
            self.after_connection(slot, now);
        }
        self.child_available(now);
        Ok(())
    }

    /// `Busy`: the child accepted a connection itself.
    fn on_busy(&mut self, slot: usize, now: Instant) -> Result<(), String> {
        self.core.board.busy(slot, now).map_err(out_of_order)?;
        debug!(slot, "child accepted a connection");
        // In `shared` mode a ping can cross this report: the child
        // answers it after its connection. Stop the clock, but still
        // accept that answer.
        let link = self.core.board.link_mut(slot).expect("checked by caller");
        link.child.ping = None;
        self.core.totals.accepted += 1;
        self.order_answered(slot);
        Ok(())
    }

    /// `Next`: the child finished one connection and took the next waiting
    /// one itself.
    fn on_next(&mut self, slot: usize, now: Instant) -> Result<(), String> {
        self.note_connection_end(slot, now);
        self.core.board.next(slot, now).map_err(out_of_order)?;
        self.core.totals.accepted += 1;
        self.core.totals.taken_next += 1;
        self.after_connection(slot, now);
        Ok(())
    }

    /// `Leaving`: the child is leaving on purpose; it is counted retired.
    fn on_leaving(&mut self, slot: usize, now: Instant) -> Result<(), String> {
        // Its connection, if it had one, is over: count it as an
        // `Idle` would, then the child is on its way out.
        if self.core.board.get(slot).map(|s| s.state) == Some(SlotState::Busy) {
            self.note_connection_end(slot, now);
            self.core.board.idle(slot, now).map_err(out_of_order)?;
        }
        self.let_leave(slot, now);
        Ok(())
    }

    /// `Missed`: the child was woken or ordered to accept but found no
    /// connection waiting (a futile wake-up).
    fn on_missed(&mut self, slot: usize, now: Instant) -> Result<(), String> {
        self.core.board.missed(slot, now).map_err(out_of_order)?;
        self.core.totals.futile_wakeups += 1;
        self.order_answered(slot);
        self.child_available(now);
        Ok(())
    }

    /// A child finished a connection: recycle it if it is past a limit
    /// (see `recycle.rs`).
    fn after_connection(&mut self, slot: usize, now: Instant) {
        self.recycle_after_connection(slot, now);
    }

    /// The child's end closed. The process is normally about to be reaped;
    /// stop talking to it and give it time to exit before SIGKILL.
    /// A 0-byte read: the child closed its channel, or sent an empty
    /// datagram (on `SOCK_SEQPACKET` the two read alike). Its end of the
    /// socket tells them apart: a child that closed it, asked to leave or
    /// not, is exiting and has `exit_timeout` for its tear-down (a large
    /// heap takes seconds); one that keeps it open sent the empty datagram
    /// the protocol forbids and has only a short grace
    /// (`policy::liveness::closed_channel_grace`). A stop deadline already
    /// set is only moved earlier.
    fn channel_closed(&mut self, slot: usize, now: Instant) {
        if self.unverified(slot) && self.claim_vanished(slot) {
            // Nothing will ever come from it, nor be reaped: free it now.
            self.give_up_unverified(slot, "closed its channel", now);
            return;
        }
        let unverified = self.unverified(slot);
        let Some(link) = self.core.board.link_mut(slot) else {
            return;
        };
        let limits = Deadlines::of(&self.core.config);
        let grace = if unverified {
            unverified_closed_grace(link.child.claimed.is_some(), &limits)
        } else {
            closed_channel_grace(peer_hung_up(&link.channel), &limits)
        };
        link.child.channel_closed = true;
        link.child.ping = None;
        link.child.leave_by(now + grace);
        if let Some(link) = self.core.board.link(slot) {
            self.deregister_channel(&link.channel);
        }
        // No more work can reach it: take it out of the idle set. Its
        // leaving cause is a closed channel, so the reaper reports a death.
        let state = self.core.board.get(slot).map(|s| s.state);
        if !matches!(state, Some(SlotState::Retiring | SlotState::Killed)) {
            crate::scoreboard::own_move(self.core.board.retire(slot, now));
        }
    }
}

/// Why a report that does not fit the child's state gets it killed.
fn out_of_order(e: IllegalTransition) -> String {
    format!("sent an out-of-order message: {e}")
}

/// Whether the child's end of `channel` is closed (or shut down for
/// writing), as the kernel reports it to a zero-timeout `poll`: after a
/// 0-byte read, a child that closed its channel shows `POLLRDHUP`, one that
/// sent an empty datagram does not.
pub(super) fn peer_hung_up(channel: &Channel) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    // nix names no POLLRDHUP (and its `revents()` reads a set with that bit
    // as none), so ask for it alone and count the ready descriptors: what
    // else the kernel reports unasked (POLLHUP, POLLERR) means hung up too.
    let rdhup = PollFlags::from_bits_retain(libc::POLLRDHUP);
    let mut polled = [PollFd::new(channel.as_fd(), rdhup)];
    matches!(poll(&mut polled, PollTimeout::ZERO), Ok(n) if n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{send, MsgFlags};
    use std::os::fd::AsRawFd;

    #[test]
    fn a_closed_end_hangs_up_and_an_empty_datagram_does_not() {
        let (parent, child) = Channel::pair().unwrap();
        assert!(!peer_hung_up(&parent));
        send(child.as_raw_fd(), b"", MsgFlags::empty()).unwrap();
        assert!(matches!(parent.recv_from_child(), Ok(Incoming::Closed)));
        assert!(!peer_hung_up(&parent), "an empty datagram is not a close");
        drop(child);
        assert!(peer_hung_up(&parent));
    }
}
