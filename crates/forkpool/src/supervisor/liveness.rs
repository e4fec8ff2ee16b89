//! Deadlines: pings for idle children, start-up, busy and stop limits.

use std::time::Instant;

use tracing::debug;

use super::Supervisor;
use crate::protocol::ParentMessage;
use crate::scoreboard::SlotState;
use crate::status::KillReason;

impl Supervisor {
    /// Pings idle children that have been quiet for `ping_interval`, and
    /// kills children that missed a deadline: a ping not answered within
    /// `ping_timeout`, a start-up that never said `Ready`, a stop that never
    /// happened.
    pub(super) fn check_liveness(&mut self, now: Instant) {
        for slot in 0..self.links.len() {
            let Some(verdict) = self.liveness_of(slot, now) else {
                continue;
            };
            match verdict {
                Verdict::Ping => self.ping(slot, now),
                Verdict::Kill(why, detail) => self.kill(slot, why, detail, now),
            }
        }
    }

    fn liveness_of(&self, slot: usize, now: Instant) -> Option<Verdict> {
        let link = self.links[slot].as_ref()?;
        let entry = self.board.get(slot)?;
        if let Some(deadline) = link.leave_deadline {
            if now >= deadline && entry.state != SlotState::Killed {
                let reason = if link.channel_closed {
                    "closed its back-channel but did not exit".to_string()
                } else {
                    format!(
                        "did not exit within {:?} of being told to quit",
                        self.config.shutdown_timeout
                    )
                };
                return Some(Verdict::Kill(KillReason::StopTimeout, reason));
            }
            return None;
        }
        if !self.config.dispatch.speaks_protocol() {
            // Workers that never report have no start, ping or busy limits.
            return None;
        }
        if let Some((_, sent)) = link.ping {
            if now.duration_since(sent) >= self.config.ping_timeout {
                return Some(Verdict::Kill(
                    KillReason::PingTimeout,
                    format!(
                        "did not answer a ping within {:?}",
                        self.config.ping_timeout
                    ),
                ));
            }
            return None;
        }
        match entry.state {
            SlotState::Starting if now.duration_since(entry.since) >= self.start_timeout() => {
                Some(Verdict::Kill(
                    KillReason::StartTimeout,
                    format!("did not report ready within {:?}", self.start_timeout()),
                ))
            }
            _ if entry.awaits_pings()
                && now.duration_since(entry.last_heard) >= self.config.ping_interval =>
            {
                Some(Verdict::Ping)
            }
            SlotState::Busy | SlotState::Ordered
                if entry.load.is_none()
                    && !self.config.busy_timeout.is_zero()
                    && now.duration_since(entry.since) >= self.config.busy_timeout =>
            {
                Some(Verdict::Kill(
                    KillReason::BusyTimeout,
                    format!(
                        "busy on one connection for {:?} (busy_timeout {:?})",
                        now.duration_since(entry.since),
                        self.config.busy_timeout
                    ),
                ))
            }
            _ => None,
        }
    }

    /// A child must say `Ready` within one ping interval plus one timeout.
    fn start_timeout(&self) -> std::time::Duration {
        self.config.ping_interval + self.config.ping_timeout
    }

    fn ping(&mut self, slot: usize, now: Instant) {
        self.ping_seq = self.ping_seq.wrapping_add(1);
        let seq = self.ping_seq;
        let Some(link) = self.links[slot].as_mut() else {
            return;
        };
        match link
            .channel
            .send_to_child(ParentMessage::Ping { seq }, None)
        {
            Ok(()) => {
                debug!(slot, seq, "ping");
                link.ping = Some((seq, now));
                link.pinged_up_to = seq;
            }
            Err(e) => self.kill(
                slot,
                KillReason::ChannelFailed,
                format!("cannot send a ping: {e}"),
                now,
            ),
        }
    }

    /// The earliest liveness deadline, for the loop's timer.
    pub(super) fn liveness_deadline(&self) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        for (slot, entry) in self.board.iter() {
            let Some(link) = self.links.get(slot).and_then(Option::as_ref) else {
                continue;
            };
            let due = if let Some(deadline) = link.leave_deadline {
                (entry.state != SlotState::Killed).then_some(deadline)
            } else if !self.config.dispatch.speaks_protocol() {
                None
            } else if let Some((_, sent)) = link.ping {
                Some(sent + self.config.ping_timeout)
            } else {
                match entry.state {
                    SlotState::Starting => Some(entry.since + self.start_timeout()),
                    _ if entry.awaits_pings() => Some(entry.last_heard + self.config.ping_interval),
                    SlotState::Busy | SlotState::Ordered
                        if entry.load.is_none() && !self.config.busy_timeout.is_zero() =>
                    {
                        Some(entry.since + self.config.busy_timeout)
                    }
                    _ => None,
                }
            };
            if let Some(due) = due {
                next = Some(next.map_or(due, |n| n.min(due)));
            }
        }
        next
    }
}

enum Verdict {
    Ping,
    Kill(KillReason, String),
}
