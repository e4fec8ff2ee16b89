//! Deadlines: pings for idle children, start-up, busy and stop limits, as
//! `policy::liveness` decides them.

use std::time::Instant;

use super::child::HasChild;
use super::effect::Effect;
use super::Core;
use crate::policy::liveness::{self, Check, ChildFacts, Deadlines};
use crate::protocol::ParentMessage;
use crate::status::KillReason;

impl<L: HasChild> Core<L> {
    /// Pings idle children that have been quiet for `ping_interval`, and
    /// kills children that missed a deadline: a ping not answered within
    /// `ping_timeout`, a start-up that never said `Ready`, an accept order
    /// not answered within `ping_timeout`, a connection held past
    /// `busy_timeout`, a stop that never happened, an exit that took longer
    /// than `exit_timeout`.
    pub fn check_liveness(&mut self, now: Instant) {
        let limits = Deadlines::of(&self.config);
        for slot in 0..self.board.span() {
            match self.next_check(slot, &limits) {
                Some((due, Check::PingDue)) if now >= due => self.ping(slot, now),
                Some((due, check)) if now >= due => {
                    let (reason, detail) = self.describe(slot, check, now);
                    if check == Check::Busy {
                        // The shell may capture where it is stuck first.
                        self.effects.push(Effect::BusyTooLong {
                            slot,
                            reason,
                            detail,
                        });
                        continue;
                    }
                    let ordered_on = self
                        .board
                        .link(slot)
                        .and_then(|l| l.child().role.ordered_on);
                    self.kill(slot, reason, detail, now);
                    // The connection it was ordered to take is still in the
                    // backlog: order another child at once.
                    if let Some(listener) = ordered_on {
                        self.effects.push(Effect::Redispatch { listener });
                    }
                }
                _ => {}
            }
        }
    }

    /// The earliest liveness deadline, for the loop's timer.
    pub fn liveness_deadline(&self) -> Option<Instant> {
        let limits = Deadlines::of(&self.config);
        (0..self.board.span())
            .filter_map(|slot| self.next_check(slot, &limits).map(|(due, _)| due))
            .min()
    }

    /// The one rule that applies to the child in `slot` next, and when
    /// (`policy::liveness`). Both acting on deadlines and setting the
    /// loop's timer use this, so the rules are stated once.
    fn next_check(&self, slot: usize, limits: &Deadlines) -> Option<(Instant, Check)> {
        let entry = self.board.get(slot)?;
        let child = entry.link.child();
        let facts = ChildFacts {
            state: entry.state,
            since: entry.since,
            last_heard: entry.last_heard,
            leave_deadline: child.leave_deadline(),
            ping_sent: child.ping.map(|(_, sent)| sent),
            many_connections: entry.load.is_some(),
            capture_pending: child.role.capturing,
        };
        liveness::next_check(&facts, limits)
    }

    /// Why a child that missed `check` is killed, for the log and totals.
    fn describe(&self, slot: usize, check: Check, now: Instant) -> (KillReason, String) {
        let child = self.board.link(slot).map(|l| l.child());
        let channel_closed = child.is_some_and(|c| c.channel_closed);
        let hung_up = child.is_some_and(|c| c.role.hung_up);
        match check {
            Check::Stop => match liveness::missed_exit(channel_closed, hung_up) {
                KillReason::ExitTimeout => (
                    KillReason::ExitTimeout,
                    format!(
                        "closed its back-channel but was still running {:?} later \
                         (exit_timeout; a large heap takes long to tear down)",
                        self.config.exit_timeout
                    ),
                ),
                KillReason::ChannelFailed => (
                    KillReason::ChannelFailed,
                    "sent an empty datagram but kept its channel open and did not exit".to_string(),
                ),
                reason => (
                    reason,
                    format!(
                        "did not exit within {:?} of being told to quit",
                        self.config.shutdown_timeout
                    ),
                ),
            },
            Check::PingAnswer => (
                KillReason::PingTimeout,
                format!(
                    "did not answer a ping within {:?}",
                    self.config.ping_timeout
                ),
            ),
            Check::Order => (
                KillReason::PingTimeout,
                format!(
                    "sat on an accept order for {:?} without accepting or answering",
                    self.config.ping_timeout
                ),
            ),
            Check::Start => (
                KillReason::StartTimeout,
                format!(
                    "did not report ready within {:?} (start_timeout)",
                    self.config.start_timeout
                ),
            ),
            Check::Busy => {
                let busy_for = self
                    .board
                    .get(slot)
                    .map_or_else(Default::default, |e| now.duration_since(e.since));
                (
                    KillReason::BusyTimeout,
                    format!(
                        "busy on one connection for {busy_for:?} (busy_timeout {:?})",
                        self.config.busy_timeout
                    ),
                )
            }
            Check::PingDue => unreachable!("a due ping is sent, not a kill"),
        }
    }

    /// Pings the child in `slot`; a send that fails comes back as
    /// [`super::Input::SendFailed`] and kills it.
    fn ping(&mut self, slot: usize, now: Instant) {
        self.ping_seq = self.ping_seq.wrapping_add(1);
        let seq = self.ping_seq;
        let Some(link) = self.board.link_mut(slot) else {
            return;
        };
        let child = link.child_mut();
        child.ping = Some((seq, now));
        child.role.pinged_up_to = seq;
        self.effects.push(Effect::Send {
            slot,
            msg: ParentMessage::Ping { seq },
        });
    }
}
