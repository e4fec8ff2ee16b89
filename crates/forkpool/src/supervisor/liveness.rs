//! Deadlines: pings for idle children, start-up, busy and stop limits.

use std::time::Instant;

use tracing::debug;

use super::Supervisor;
use crate::policy::liveness::{self, Check, ChildFacts, Deadlines};
use crate::protocol::ParentMessage;
use crate::status::KillReason;

impl Supervisor {
    /// Pings idle children that have been quiet for `ping_interval`, and
    /// kills children that missed a deadline: a ping not answered within
    /// `ping_timeout`, a start-up that never said `Ready`, an accept order
    /// not answered within `ping_timeout`, a connection held past
    /// `busy_timeout`, a stop that never happened, an exit that took longer
    /// than `exit_timeout`.
    pub(super) fn check_liveness(&mut self, now: Instant) {
        let limits = Deadlines::of(&self.core.config);
        for slot in 0..self.core.board.span() {
            match self.next_check(slot, &limits) {
                Some((due, Check::PingDue)) if now >= due => self.ping(slot, now),
                Some((due, check)) if now >= due => {
                    let (why, detail) = self.describe(slot, check, now);
                    let ordered_on = self.core.board.link(slot).and_then(|l| l.child.ordered_on);
                    let kill_now = if check == Check::Busy {
                        // Capture where it is stuck first (see slow.rs).
                        self.capture_before_kill(slot, why, detail, now)
                    } else {
                        Some((why, detail))
                    };
                    if let Some((why, detail)) = kill_now {
                        self.kill(slot, why, detail, now);
                        // The connection it was ordered to take is still in
                        // the backlog: order another child at once.
                        if let Some(i) = ordered_on.filter(|i| self.listeners[*i].watched) {
                            self.dispatch(i, now);
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// The earliest liveness deadline, for the loop's timer.
    pub(super) fn liveness_deadline(&self) -> Option<Instant> {
        let limits = Deadlines::of(&self.core.config);
        (0..self.core.board.span())
            .filter_map(|slot| self.next_check(slot, &limits).map(|(due, _)| due))
            .min()
    }

    /// The one rule that applies to the child in `slot` next, and when
    /// (`policy::liveness`). Both acting on deadlines and setting the
    /// loop's timer use this, so the rules are stated once.
    fn next_check(&self, slot: usize, limits: &Deadlines) -> Option<(Instant, Check)> {
        let entry = self.core.board.get(slot)?;
        let facts = ChildFacts {
            state: entry.state,
            since: entry.since,
            last_heard: entry.last_heard,
            leave_deadline: entry.link.child.leave_deadline(),
            ping_sent: entry.link.child.ping.map(|(_, sent)| sent),
            many_connections: entry.load.is_some(),
            capture_pending: self.slow.pending_for(slot),
        };
        liveness::next_check(&facts, limits)
    }

    /// Why a child that missed `check` is killed, for the log and totals.
    fn describe(&self, slot: usize, check: Check, now: Instant) -> (KillReason, String) {
        let link = self.core.board.link(slot);
        let channel_closed = link.is_some_and(|l| l.child.channel_closed);
        let peer_hung_up = link.is_some_and(|l| super::reports::peer_hung_up(&l.channel));
        match check {
            Check::Stop => match liveness::missed_exit(channel_closed, peer_hung_up) {
                KillReason::ExitTimeout => (
                    KillReason::ExitTimeout,
                    format!(
                        "closed its back-channel but was still running {:?} later \
                         (exit_timeout; a large heap takes long to tear down)",
                        self.core.config.exit_timeout
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
                        self.core.config.shutdown_timeout
                    ),
                ),
            },
            Check::PingAnswer => (
                KillReason::PingTimeout,
                format!(
                    "did not answer a ping within {:?}",
                    self.core.config.ping_timeout
                ),
            ),
            Check::Order => (
                KillReason::PingTimeout,
                format!(
                    "sat on an accept order for {:?} without accepting or answering",
                    self.core.config.ping_timeout
                ),
            ),
            Check::Start => (
                KillReason::StartTimeout,
                format!(
                    "did not report ready within {:?} (start_timeout)",
                    self.core.config.start_timeout
                ),
            ),
            Check::Busy => {
                let busy_for = self
                    .core
                    .board
                    .get(slot)
                    .map_or_else(Default::default, |e| now.duration_since(e.since));
                (
                    KillReason::BusyTimeout,
                    format!(
                        "busy on one connection for {busy_for:?} (busy_timeout {:?})",
                        self.core.config.busy_timeout
                    ),
                )
            }
            Check::PingDue => unreachable!("a due ping is sent, not a kill"),
        }
    }

    fn ping(&mut self, slot: usize, now: Instant) {
        self.core.ping_seq = self.core.ping_seq.wrapping_add(1);
        let seq = self.core.ping_seq;
        let Some(link) = self.core.board.link_mut(slot) else {
            return;
        };
        match link.send(ParentMessage::Ping { seq }, None) {
            Ok(()) => {
                debug!(slot, seq, "ping");
                link.child.ping = Some((seq, now));
                link.child.pinged_up_to = seq;
            }
            Err(e) => self.kill(
                slot,
                KillReason::ChannelFailed,
                format!("cannot send a ping: {e}"),
                now,
            ),
        }
    }
}

/// A child (or a template) must say `Ready` within this.
pub(super) fn start_timeout(config: &crate::config::PoolConfig) -> std::time::Duration {
    Deadlines::of(config).start_timeout
}

/// When a template told to quit now, or whose channel closed now, must be
/// gone: `exit_timeout` later, but never after a graceful stop's deadline
/// (`policy::liveness::exit_deadline`).
pub(super) fn exit_by(
    now: Instant,
    config: &crate::config::PoolConfig,
    stopping: Option<&super::Shutdown>,
) -> Instant {
    liveness::exit_deadline(now, config.exit_timeout, stopping.map(|s| s.deadline))
}
