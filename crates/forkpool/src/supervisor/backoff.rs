//! Holding spawns back: the supervisor's side of `policy::backoff`. It
//! tells the rule how far each reaped worker had got in starting, asks it
//! whether a spawn may go ahead, and logs what it decided. The rule
//! itself (what a start is, how the delay grows, how fast started workers
//! are replaced) is `policy::backoff`.

use std::io;
use std::time::Instant;

use tracing::{error, warn};

use super::{log_due, ChildLink, LeaveCause, Supervisor};
use crate::policy::backoff::{fails_a_reload, Verdict, START_WINDOW};
use crate::sys::process::ExitStatus;
use crate::worker::ChildStart;

impl Supervisor {
    /// Called for every child reaped: a start-up failure holds spawns
    /// back; the death of a worker that had started is replaced (within
    /// the replacement rate). Returns how the child failed, if its end
    /// fails a reload that is rolling its generation in.
    pub(super) fn judge_start(
        &mut self,
        link: &ChildLink,
        status: ExitStatus,
        asked_to_stop: bool,
        now: Instant,
    ) -> Option<String> {
        let asked = asked_to_stop || self.core.shutdown.is_some();
        // A worker up since the last failure ends that run before this
        // end is counted.
        self.note_starts(now);
        let verdict = self
            .core
            .spawn_gate
            .child_exited(link.child.start(), asked, now);
        let how = match link.child.leaving.as_ref().map(|l| &l.cause) {
            Some(LeaveCause::Killed(reason)) => format!("killed: {reason}"),
            _ => status.to_string(),
        };
        if let Verdict::FailedStart { delay } = verdict {
            error!(
                "worker exited during start-up ({how}); check the command and its stderr: \
                 retrying in {delay:?}"
            );
            return Some(format!("exited during start-up ({how})"));
        }
        fails_a_reload(verdict, link.child.spawned_at, now)
            .then(|| format!("exited within {:?} of starting ({how})", START_WINDOW))
    }

    /// Tells the gate of every worker that has started, while a run of
    /// start-up failures holds spawns: one that started after the last
    /// failure ends the run and lifts its hold.
    fn note_starts(&mut self, now: Instant) {
        if !self.core.spawn_gate.failures_hold(now) {
            return;
        }
        for (_, child) in self.core.board.iter() {
            if let Some(at) = child
                .link
                .child
                .start()
                .started_at()
                .filter(|at| *at <= now)
            {
                self.core.spawn_gate.started(at);
            }
        }
    }

    /// Whether spawns wait at `now`: for a run of start-up failures (unless
    /// a worker has started since), or for the replacement rate.
    pub(super) fn spawns_held(&mut self, now: Instant) -> bool {
        self.note_starts(now);
        self.core
            .spawn_gate
            .held_until(now, self.core.config.max_spawn_rate)
            .is_some()
    }

    /// Until when spawns wait, if they do, for the loop's timer.
    pub(super) fn spawns_held_until(&self, now: Instant) -> Option<Instant> {
        self.core
            .spawn_gate
            .held_until(now, self.core.config.max_spawn_rate)
    }

    /// Spawns up to `n` children, one at a time while spawns are not held.
    /// In a child, returns what it needs to become a worker.
    pub(super) fn spawn_gated(&mut self, n: u32, now: Instant) -> io::Result<Option<ChildStart>> {
        for _ in 0..n {
            if self.spawns_held(now) {
                break;
            }
            let spawned = self.core.totals.spawned;
            let start = self.spawn_child(now)?;
            if start.is_some() {
                return Ok(start);
            }
            if self.core.totals.spawned > spawned {
                self.core
                    .spawn_gate
                    .forked(now, self.core.config.max_spawn_rate);
            } else if self.spawns_held(now) {
                break;
            }
        }
        self.log_replacements_held(now);
        Ok(None)
    }

    /// Says, at most once per log interval, that workers that had started
    /// die faster than they may be replaced.
    fn log_replacements_held(&mut self, now: Instant) {
        if self.core.spawn_gate.failures_hold(now) {
            return;
        }
        let Some(until) = self.spawns_held_until(now) else {
            return;
        };
        if !log_due(&mut self.last_replacements_held_log, now) {
            return;
        }
        warn!(
            rate = self.core.config.max_spawn_rate,
            "workers that had started are dying faster than max_spawn_rate a second; \
             their replacements wait {:?} (check the workers' stderr for why they die)",
            until - now
        );
    }
}
