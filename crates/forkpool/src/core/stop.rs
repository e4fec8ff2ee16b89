//! Stops: graceful (children finish, stragglers are killed at the
//! deadline) and immediate (SIGKILL now). Either ends by its `exit_by`
//! whatever the children do.

use std::time::{Duration, Instant};

use tracing::info;

use super::child::{own_life, HasChild, LifeEvent};
use super::effect::Effect;
use super::{Core, Shutdown};
use crate::status::KillReason;

/// How long past its deadline a stop may take at most: children killed at
/// the deadline are normally reaped within milliseconds; what is not gone
/// by then (a process stuck in the kernel) is left behind, logged, rather
/// than let the stop hang.
pub(crate) const STOP_OVERRUN: Duration = Duration::from_secs(1);

impl<L: HasChild> Core<L> {
    /// Graceful stop: no new connections, idle children quit now, busy ones
    /// after their connection, SIGKILL for stragglers at the deadline.
    pub fn begin_shutdown(&mut self, now: Instant) {
        if self.shutdown.is_some() {
            return;
        }
        let deadline = now + self.config.shutdown_timeout;
        info!(
            timeout = ?self.config.shutdown_timeout,
            "shutting down: no new connections, waiting for busy children"
        );
        self.shutdown = Some(Shutdown {
            deadline,
            exit_by: deadline + STOP_OVERRUN,
        });
        self.effects.push(Effect::StopListening);
        self.quit_templates(now);
        let slots: Vec<usize> = self.board.iter().map(|(slot, _)| slot).collect();
        for slot in slots {
            self.retire(slot, "shutdown", now);
            // Every child is leaving now (retired above, or before): the
            // stop's deadline is its own.
            own_life(self.move_worker(slot, LifeEvent::StopBy { by: deadline }, now));
        }
    }

    /// Immediate stop: SIGKILL every child; the loop reaps them and exits
    /// within [`STOP_OVERRUN`].
    pub fn stop_now(&mut self, now: Instant) {
        self.begin_shutdown(now);
        if let Some(s) = self.shutdown.as_mut() {
            s.exit_by = s.exit_by.min(now + STOP_OVERRUN);
        }
        self.kill_templates();
        let slots: Vec<usize> = self.board.iter().map(|(slot, _)| slot).collect();
        for slot in slots {
            self.kill(
                slot,
                KillReason::ImmediateStop,
                "immediate stop".into(),
                now,
            );
        }
    }

    /// Whether the stop is over: no child or template left, or the
    /// stop's last moment has passed.
    pub fn finished(&self, now: Instant) -> bool {
        let Some(shutdown) = self.shutdown else {
            return false;
        };
        (self.board.occupied() == 0 && self.templates.is_empty()) || now >= shutdown.exit_by
    }

    /// The stop's deadlines still ahead, for the loop's timer (a passed
    /// deadline has been acted on; waking for it again would spin).
    pub fn stop_deadline(&self, now: Instant) -> Option<Instant> {
        let s = self.shutdown?;
        // An immediate stop moves `exit_by` before the graceful deadline.
        Some(if s.deadline > now {
            s.deadline.min(s.exit_by)
        } else {
            s.exit_by
        })
    }
}
