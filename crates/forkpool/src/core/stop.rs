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

/// Processes a stop left unreaped.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Unreaped {
    /// Children, as (slot, pid).
    pub children: Vec<(usize, i32)>,
    /// Templates' pids.
    pub templates: Vec<i32>,
}

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

    /// What is left unreaped when a stop ends, or `None` when nothing is.
    pub fn left_unreaped(&self) -> Option<Unreaped> {
        if self.board.occupied() == 0 && self.templates.is_empty() {
            return None;
        }
        Some(Unreaped {
            children: self.board.iter().map(|(slot, s)| (slot, s.pid)).collect(),
            templates: self.templates.iter().map(|t| t.role.pid).collect(),
        })
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

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use crate::config::PoolConfig;
    use crate::core::child::Child;
    use crate::core::{Core, Input};
    use crate::policy::shutdown::Stop;

    #[test]
    fn a_stop_past_its_last_moment_names_what_is_left() {
        let t0 = Instant::now();
        let mut core: Core<Child> = Core::new(PoolConfig {
            preload: true,
            ..PoolConfig::default()
        });
        assert_eq!(core.left_unreaped(), None);
        core.adopt(2, 42, 1, Child::new(t0, true, 1), t0);
        core.template_started(1, 77, t0);
        let left = core.left_unreaped().expect("a child and a template");
        assert_eq!((left.children, left.templates), (vec![(2, 42)], vec![77]));
        core.on(Input::Stop(Stop::Now), t0);
        let exit_by = core.shutdown.map(|s| s.exit_by).expect("stopping");
        assert!(!core.finished(t0));
        assert!(core.finished(exit_by));
    }
}
