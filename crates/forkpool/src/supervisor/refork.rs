//! Refork (`--refork-after N[,N2,...]`): the warmest worker becomes the
//! template, so what real traffic warmed in it (caches, lazily imported
//! modules, compiled code) is shared by the workers forked after.
//!
//! The lowest slot gets every connection while it is idle, so it is the
//! warmest worker. Once it has served the next threshold's count of
//! connections, and is idle, and no reload is rolling, the supervisor:
//! 1. sends it `T` (BecomeTemplate) with a new template channel; its slot
//!    is vacated at once (it gets no more work) and its stderr pipe stays
//!    with it, now as the template's;
//! 2. rolls the pool to a new generation whose template it is
//!    (`rollout.rs`): once it says `R` on the new channel, a canary is
//!    forked from it, then one old worker after another is replaced;
//! 3. tells the old template to quit when the rollout is done.
//!
//! If it never becomes a working template, the rollout fails like any
//! reload and the old generation, with its template, keeps serving. Each
//! threshold is used once, failed or not.

use std::os::fd::AsFd;
use std::time::Instant;

use tracing::{info, warn};

use super::Supervisor;
use crate::channel::Channel;
use crate::protocol::WorkerOrder;
use crate::scoreboard::SlotState;

/// Whether the next refork is due: thresholds `after` (increasing), of
/// which `done` have been used, for a worker that has served `served`.
pub(super) fn refork_due(after: &[u64], done: usize, served: u64) -> bool {
    after.get(done).is_some_and(|n| served >= *n)
}

impl Supervisor {
    /// Starts a refork if the lowest slot has earned it.
    pub(super) fn consider_refork(&mut self, now: Instant) {
        if !self.core.config.preload || self.rollouts.active() || self.core.shutdown.is_some() {
            return;
        }
        let Some(entry) = self.core.board.get(0) else {
            return;
        };
        let eligible = entry.state == SlotState::Idle
            && entry.generation == self.core.generation
            && entry.pid > 0
            && refork_due(
                &self.core.config.refork_after,
                self.templates.reforks,
                entry.served,
            );
        if !eligible || !self.core.has_ready_template(self.core.generation) {
            return;
        }
        let (pid, served) = (entry.pid, entry.served);
        let (ours, theirs) = match Channel::pair() {
            Ok(pair) => pair,
            Err(e) => {
                warn!("cannot create a template channel for the refork: {e}");
                return;
            }
        };
        let Some(link) = self.core.board.link(0) else {
            return;
        };
        if let Err(e) = link
            .channel
            .send_order(WorkerOrder::BecomeTemplate, Some(theirs.as_fd()))
        {
            warn!(pid, "cannot send the refork order: {e}");
            return;
        }
        drop(theirs);
        self.templates.reforks += 1;
        self.core.totals.reforks += 1;
        // The slot is no longer a worker: free it without a reap.
        let mut link = self.core.board.vacate(0).expect("checked above").link;
        self.deregister_channel(&link.channel);
        let output = link.output.take();
        if let Some(output) = &output {
            self.forget_output(output);
        }
        let config = self.core.config.clone();
        self.begin_rollout(config);
        let generation = self.core.generation;
        info!(
            pid,
            served,
            generation,
            "refork: slot 0 becomes the template; rolling the pool onto workers forked from it"
        );
        let pidfd = link.pidfd.take();
        if let Err(e) = self.adopt_template(pid, pidfd, generation, ours, output, now) {
            warn!(pid, "cannot watch the new template: {e}");
            self.template_broken(generation, format!("cannot watch its channel: {e}"), now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_threshold_is_due_once_in_order() {
        let after = [100, 1000];
        assert!(!refork_due(&after, 0, 99));
        assert!(refork_due(&after, 0, 100));
        assert!(!refork_due(&after, 1, 999));
        assert!(refork_due(&after, 1, 5000));
        assert!(!refork_due(&after, 2, u64::MAX));
        assert!(!refork_due(&[], 0, u64::MAX));
    }
}
