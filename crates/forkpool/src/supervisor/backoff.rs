//! Holding spawns back: the supervisor's side of `policy::backoff`. It
//! tells the rule how far each reaped worker had got in starting, asks it
//! whether a spawn may go ahead, and logs what it decided. The rule
//! itself (what a start is, how the delay grows, how fast started workers
//! are replaced) is `policy::backoff`.

use std::io;
use std::time::Instant;

use tracing::warn;

use super::Supervisor;
use crate::core::Warning;
use crate::worker::ChildStart;

impl Supervisor {
    /// Spawns up to `n` children, one at a time while spawns are not held.
    /// In a child, returns what it needs to become a worker.
    pub(super) fn spawn_gated(&mut self, n: u32, now: Instant) -> io::Result<Option<ChildStart>> {
        for _ in 0..n {
            if !self.core.may_spawn(now) {
                break;
            }
            let spawned = self.core.totals().spawned;
            let start = self.spawn_child(now)?;
            if start.is_some() {
                return Ok(start);
            }
            if self.core.totals().spawned == spawned && self.core.spawns_held(now) {
                break;
            }
        }
        self.log_replacements_held(now);
        Ok(None)
    }

    /// Says, at most once per log interval, that workers that had started
    /// die faster than they may be replaced.
    fn log_replacements_held(&mut self, now: Instant) {
        if self.core.spawn_gate().failures_hold(now) {
            return;
        }
        let Some(until) = self.core.spawns_held_until(now) else {
            return;
        };
        if !self.core.warning_due(Warning::ReplacementsHeld, now) {
            return;
        }
        warn!(
            rate = self.core.config().max_spawn_rate,
            "workers that had started are dying faster than max_spawn_rate a second; \
             their replacements wait {:?} (check the workers' stderr for why they die)",
            until - now
        );
    }
}
