//! Lines the supervisor logs now and then, paced by the core: the
//! "child states" line, once the board changed, at most once per
//! [`STATUS_LINE_INTERVAL`] (a change held back is logged when the
//! interval ends: its moment is a deadline of the core), and the warnings
//! a pool repeats while it lasts (replacements held back by the spawn
//! rate, a pool held at `max_children`, the CPU hold), at most once per
//! [`WARNING_INTERVAL`] each. The shell writes the lines.

use std::time::{Duration, Instant};

use super::child::HasChild;
use super::Core;
use crate::scaling::{Decision, PoolCounts};

/// How often, at most, the "child states" line is logged.
pub(crate) const STATUS_LINE_INTERVAL: Duration = Duration::from_secs(1);
/// How often, at most, each repeated warning is logged.
pub(crate) const WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// A warning repeated while its condition lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Warning {
    /// Replacements wait for the spawn rate.
    ReplacementsHeld,
    /// The pool is at `max_children` with no idle child.
    Saturated,
    /// The pool holds its growth while the CPUs are taken.
    CpuBound,
}

/// When each paced line was last logged.
#[derive(Debug, Default)]
pub(crate) struct Paced {
    warnings: [Option<Instant>; 3],
    /// The "child states" line: when, and the board's change count it
    /// showed.
    status_line: (Option<Instant>, u64),
}

impl<L: HasChild> Core<L> {
    /// Whether `warning` may be logged at `now`; if so, it counts as
    /// logged.
    pub fn warning_due(&mut self, warning: Warning, now: Instant) -> bool {
        let last = &mut self.paced.warnings[warning as usize];
        let due = last.is_none_or(|t| now.saturating_duration_since(t) >= WARNING_INTERVAL);
        if due {
            *last = Some(now);
        }
        due
    }

    /// What the scaling rule's `decision` on `pool` has the supervisor
    /// say, paced: a pool that holds its growth while its busy children
    /// wait for the CPUs (`Ok`, news), or one held at `max_children`
    /// (`Err`, a warning).
    pub fn scaling_said(
        &mut self,
        decision: Decision,
        pool: &PoolCounts,
        now: Instant,
    ) -> Option<Result<String, String>> {
        match decision {
            Decision::CpuBound if pool.cpu_holds() => {
                self.warning_due(Warning::CpuBound, now).then(|| {
                    Ok(format!(
                        "the busy children wait for the CPUs, so the pool of {} children \
                         holds and connections wait in the backlog for the next child to \
                         finish (--no-hold-when-cpu-bound grows it anyway)",
                        pool.live()
                    ))
                })
            }
            Decision::Saturated => self.warning_due(Warning::Saturated, now).then(|| {
                Err(format!(
                    "reached max-children={}; connections are queuing in the backlog \
                     (raise --max-children if the machine has room)",
                    self.config.max_children
                ))
            }),
            _ => None,
        }
    }

    /// The "child states" line, if it is due at `now`; it counts as
    /// logged.
    pub fn status_line_due(&mut self, now: Instant) -> Option<String> {
        let changes = self.board.changes();
        if changes == self.paced.status_line.1
            || self.status_line_deadline().is_some_and(|t| now < t)
        {
            return None;
        }
        self.paced.status_line = (Some(now), changes);
        Some(self.board.line())
    }

    /// When a change of the board held back is logged.
    pub(super) fn status_line_deadline(&self) -> Option<Instant> {
        match self.paced.status_line {
            (Some(at), changes) if changes != self.board.changes() => {
                Some(at + STATUS_LINE_INTERVAL)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PoolConfig;
    use crate::core::child::Child;
    use crate::protocol::ChildMessage;
    use crate::scaling::CpuUse;

    #[test]
    fn a_warning_is_logged_once_per_interval_each() {
        let t0 = Instant::now();
        let mut core: Core<Child> = Core::new(PoolConfig::default());
        assert!(core.warning_due(Warning::Saturated, t0));
        assert!(!core.warning_due(Warning::Saturated, t0 + Duration::from_secs(9)));
        assert!(core.warning_due(Warning::CpuBound, t0));
        assert!(core.warning_due(Warning::Saturated, t0 + WARNING_INTERVAL));
    }

    #[test]
    fn the_status_line_follows_changes_at_its_pace() {
        let t0 = Instant::now();
        let mut core: Core<Child> = Core::new(PoolConfig::default());
        core.adopt(0, 40, 1, Child::new(t0, true, 1), t0);
        core.adopt(1, 41, 1, Child::new(t0, true, 1), t0);
        assert_eq!(core.status_line_due(t0), None);
        core.report(0, ChildMessage::Ready { pid: 40 }, t0);
        assert!(core.status_line_due(t0).is_some());
        assert_eq!(core.status_line_deadline(), None);
        // A change within the interval waits for its end, a deadline.
        core.report(1, ChildMessage::Ready { pid: 41 }, t0);
        let t1 = t0 + Duration::from_millis(300);
        assert_eq!(core.status_line_due(t1), None);
        let end = t0 + STATUS_LINE_INTERVAL;
        assert_eq!(core.status_line_deadline(), Some(end));
        assert_eq!(core.next_deadline(t1).map(|t| t <= end), Some(true));
        assert!(core.status_line_due(end).is_some());
        assert_eq!(core.status_line_deadline(), None);
        assert_eq!(core.status_line_due(end + STATUS_LINE_INTERVAL), None);
    }

    #[test]
    fn the_scaling_rule_is_said_at_its_pace() {
        let t0 = Instant::now();
        let mut core: Core<Child> = Core::new(PoolConfig {
            max_children: 7,
            ..PoolConfig::default()
        });
        let held = PoolCounts {
            busy: 4,
            cpu: CpuUse::Measuring,
            starting: 1,
            ..PoolCounts::default()
        };
        assert!(held.cpu_holds());
        let said = core.scaling_said(Decision::CpuBound, &held, t0);
        assert!(said.is_some_and(|s| s.is_ok_and(|news| news.contains("pool of 5 children"))));
        assert_eq!(core.scaling_said(Decision::CpuBound, &held, t0), None);
        // Not looked at: nothing held, nothing said.
        let unlooked = PoolCounts {
            cpu: CpuUse::NotLooked,
            ..held
        };
        let later = t0 + WARNING_INTERVAL;
        assert_eq!(
            core.scaling_said(Decision::CpuBound, &unlooked, later),
            None
        );
        let said = core.scaling_said(Decision::Saturated, &held, t0);
        assert!(said.is_some_and(|s| s.is_err_and(|w| w.contains("max-children=7"))));
        assert_eq!(core.scaling_said(Decision::Hold, &held, later), None);
    }
}
