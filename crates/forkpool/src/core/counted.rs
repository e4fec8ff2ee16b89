//! What the shell saw happen that the core counts: events of its
//! mechanisms the core has no input for (a stray killed in a process
//! group, stderr lines over a budget, a slow request captured). The shell
//! reports each with one verb, [`Core::count`], and never writes the
//! totals itself.

use super::child::HasChild;
use super::Core;

/// One thing the shell counts in the totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counted {
    /// Connections the supervisor accepted (overflow, a departed child's
    /// socket, from behind a busy child).
    Accepted(u64),
    /// Lines of a worker's stderr dropped over its budget.
    StderrLinesDropped(u64),
    /// A process group swept of what a child left behind.
    StraysKilled,
    /// A slow request's stack captured.
    SlowCapture,
    /// A slow request's capture held back by the rate limit.
    SlowCaptureSuppressed,
    /// A child recycled for its memory (as the supervisor read it).
    RecycledMemory,
    /// A child recycled for its age (by the supervisor's clock).
    RecycledLifetime,
    /// A binary upgrade that failed.
    UpgradeFailure,
}

impl<L: HasChild> Core<L> {
    /// Counts `what` in the totals.
    pub fn count(&mut self, what: Counted) {
        let t = &mut self.totals;
        match what {
            Counted::Accepted(n) => t.accepted += n,
            Counted::StderrLinesDropped(n) => t.stderr_lines_dropped += n,
            Counted::StraysKilled => t.strays_killed += 1,
            Counted::SlowCapture => t.slow_captures += 1,
            Counted::SlowCaptureSuppressed => t.slow_captures_suppressed += 1,
            Counted::RecycledMemory => t.recycled_memory += 1,
            Counted::RecycledLifetime => t.recycled_lifetime += 1,
            Counted::UpgradeFailure => t.upgrade_failures += 1,
        }
    }

    /// Kernel dispatch could not run: the pool dispatches by `handoff`.
    pub fn fall_back_to_handoff(&mut self) {
        self.config.dispatch = crate::config::DispatchMode::Handoff;
    }

    /// `TTIN`/`TTOU`: moves `min_spare` by `delta` (within 0 and
    /// `max_children`), raising `max_spare` to it if need be; returns the
    /// two.
    pub fn move_spare(&mut self, delta: i64) -> (u32, u32) {
        let c = &mut self.config;
        let min_spare = (i64::from(c.min_spare) + delta).clamp(0, i64::from(c.max_children)) as u32;
        c.min_spare = min_spare;
        c.max_spare = c.max_spare.max(min_spare);
        (c.min_spare, c.max_spare)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PoolConfig;
    use crate::core::child::Child;

    #[test]
    fn each_count_lands_in_its_total() {
        let mut core: Core<Child> = Core::new(PoolConfig::default());
        core.count(Counted::Accepted(3));
        core.count(Counted::StderrLinesDropped(7));
        for what in [
            Counted::StraysKilled,
            Counted::SlowCapture,
            Counted::SlowCaptureSuppressed,
            Counted::RecycledMemory,
            Counted::RecycledLifetime,
            Counted::UpgradeFailure,
        ] {
            core.count(what);
        }
        let t = core.totals;
        assert_eq!((t.accepted, t.stderr_lines_dropped), (3, 7));
        assert_eq!(
            (
                t.strays_killed,
                t.slow_captures,
                t.slow_captures_suppressed,
                t.recycled_memory,
                t.recycled_lifetime,
                t.upgrade_failures
            ),
            (1, 1, 1, 1, 1, 1)
        );
    }

    #[test]
    fn the_spare_target_moves_within_the_pool() {
        let mut core: Core<Child> = Core::new(PoolConfig {
            min_spare: 2,
            max_spare: 3,
            max_children: 6,
            ..PoolConfig::default()
        });
        assert_eq!(core.move_spare(2), (4, 4));
        assert_eq!(core.move_spare(10), (6, 6));
        assert_eq!(core.move_spare(-10), (0, 6));
    }
}
