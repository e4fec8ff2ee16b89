//! What a child's report means for its slot, and what its silence means
//! (the core's deadlines, `core/liveness.rs`, ticked each turn). A report
//! that does not fit the child's state, or does not decode, gets the child
//! killed; nothing a child writes can stop the supervisor.

use std::os::fd::AsFd;
use std::time::Instant;

use super::Supervisor;
use crate::channel::{Channel, Incoming};
use crate::core::Input;
use crate::protocol::ChildMessage;
use crate::scoreboard::SlotState;
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
                self.wake.unread.push(slot);
                return;
            }
            let Some(link) = self.core.board().link(slot) else {
                return;
            };
            if link.child.channel_closed {
                return;
            }
            let (incoming, sender) = match link.receive() {
                Ok(received) => received,
                Err(e) => {
                    let detail = format!("back-channel read failed: {e}");
                    self.broken(slot, KillReason::ChannelFailed, detail, now);
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
                    let leaving = msg == ChildMessage::Leaving;
                    if leaving {
                        self.judge_leaving(slot, now);
                    }
                    self.core.on(Input::Report { slot, msg }, now);
                    if leaving {
                        self.let_go(slot);
                    }
                    self.carry_out(now);
                }
                Incoming::WouldBlock => return,
                Incoming::Closed => {
                    self.channel_closed(slot, now);
                    return;
                }
                Incoming::Malformed(why) => {
                    let detail = format!("sent a malformed message: {why}");
                    self.broken(slot, KillReason::Misbehaved, detail, now);
                    return;
                }
            }
            if self
                .core
                .board()
                .get(slot)
                .is_none_or(|s| s.state == SlotState::Killed)
            {
                return;
            }
        }
    }

    /// What the child sent cannot be read: it is killed for `reason`.
    fn broken(&mut self, slot: usize, reason: KillReason, detail: String, now: Instant) {
        let input = Input::Broken {
            slot,
            reason,
            detail,
        };
        self.core.on(input, now);
        self.carry_out(now);
    }

    /// A 0-byte read on the child's channel: see
    /// [`crate::core::Input::ChannelClosed`].
    fn channel_closed(&mut self, slot: usize, now: Instant) {
        let claimed_is_child = !self.claim_vanished(slot);
        let Some(link) = self.core.board().link(slot) else {
            return;
        };
        let hung_up = peer_hung_up(&link.channel);
        let input = Input::ChannelClosed {
            slot,
            hung_up,
            claimed_is_child,
        };
        self.core.on(input, now);
        self.carry_out(now);
    }
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

impl Supervisor {
    /// The core's deadlines (`core/liveness.rs`): first what only the
    /// shell can see is told to it (a channel that sent an empty datagram
    /// and has since been closed),
    /// then it is ticked and what it asks is carried out.
    pub(super) fn check_liveness(&mut self, now: Instant) {
        let mut hung_up = Vec::new();
        for slot in 0..self.core.board().span() {
            let Some(link) = self.core.board().link(slot) else {
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
