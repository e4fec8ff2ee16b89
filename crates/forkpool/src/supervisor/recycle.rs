//! Recycling children before they cost too much: after N connections
//! (spread by a random jitter), once their unshared memory passes a limit,
//! or once they are older than a lifetime (the rule is
//! `policy::recycle`; here are the per-child draws, the memory samples
//! and the retiring). A recycled child finishes its current connection,
//! then exits, and the pool starts a fresh one.
//!
//! Memory is judged on USS, not RSS: children share most pages with the
//! supervisor copy-on-write, and RSS counts those in full in every child,
//! so it grows with the shared part and says nothing about what one child
//! costs. USS is what the machine gets back when the child exits.

use std::os::fd::AsFd;
use std::time::Instant;

use tracing::{debug, info};

use super::Supervisor;
use crate::policy::recycle::Recycle;

/// The environment variable that fixes the jitter's random seed, so a test
/// (or an operator reproducing a pattern) gets the same limits every run.
pub const JITTER_SEED_ENV: &str = "FORKPOOL_JITTER_SEED";

/// The jitter's seed from [`JITTER_SEED_ENV`], if it is set and a number.
pub(super) fn jitter_seed() -> Option<u64> {
    seed_of(std::env::var(JITTER_SEED_ENV).ok().as_deref())
}

/// The seed a value of [`JITTER_SEED_ENV`] names: a number, with blanks
/// around it allowed; anything else names none.
fn seed_of(value: Option<&str>) -> Option<u64> {
    value?.trim().parse().ok()
}

impl Supervisor {
    /// Whether the child in `slot` is past a limit now; `fresh_memory`
    /// re-reads its memory first (between connections).
    fn recycle_due(&mut self, slot: usize, fresh_memory: bool, now: Instant) -> Option<Recycle> {
        if fresh_memory && self.core.config().max_child_memory > 0 {
            self.sample_child(slot, now);
        }
        let uss = self.core.board().link(slot)?.figures.uss();
        self.core.recycle_due(slot, uss, now)
    }

    fn recycle(&mut self, slot: usize, why: Recycle, now: Instant) {
        let reason = self.count_recycle(slot, why, "");
        self.retire(slot, &reason, now);
    }

    /// Counts a recycle for `why` in the totals and logs it, one line
    /// (none for a share of connections, which is no news), `how` added;
    /// returns the reason in words.
    fn count_recycle(&mut self, slot: usize, why: Recycle, how: &str) -> String {
        let reason = self.core.recycled(why);
        if !matches!(why, Recycle::Requests(_)) {
            let pid = self.core.board().get(slot).map_or(0, |s| s.pid);
            info!(slot, pid, "recycling child: {reason}{how}");
        }
        reason
    }

    /// A `kernel` dispatch child said `X` (leaving). Such a child checks its
    /// share of connections, its memory and its age itself after each
    /// connection, and leaves without being told, so why it left is judged
    /// here, before the `X` reaches the core. Not on its word (`X` says no
    /// why): a memory recycle counts only when the supervisor reads the
    /// child's USS above `max_child_memory` itself, now, while the child
    /// waits to be let go ([`Self::let_go`]); a lifetime recycle only when
    /// the child is older, by the supervisor's clock, than the lifetime it
    /// was told. A child told to leave already was counted then.
    pub(super) fn judge_leaving(&mut self, slot: usize, now: Instant) {
        if !self.core.keeps_board(slot) {
            return;
        }
        let Some(entry) = self.core.board().get(slot) else {
            return;
        };
        // The board says what it served up to its `X` (the core's count may
        // be a reading behind).
        let served = self
            .kernel
            .as_ref()
            .map_or(entry.served, |k| k.board().sample(slot).served);
        let uss = match self.core.leaving_needs_memory(slot, served) {
            true => self.sample_child(slot, now),
            false => None,
        };
        if let Some(why) = self.core.judge_leaving(slot, served, uss, now) {
            self.count_recycle(
                slot,
                why,
                "; it saw so itself after its connection and left",
            );
        }
    }

    /// After a child's `X`: its channel is shut down for sending (the
    /// supervisor sends nothing after an `X` anyway), and the child, which
    /// reads end of file then, exits. A child that left for a limit waits
    /// for that, so that [`Self::judge_leaving`] finds it still there.
    pub(super) fn let_go(&self, slot: usize) {
        let Some(link) = self.core.board().link(slot) else {
            return;
        };
        if let Err(e) = crate::sys::socket::shut_down_sending(link.channel.as_fd()) {
            debug!(slot, "cannot shut the channel of a leaving child down: {e}");
        }
    }

    /// A child finished a connection: recycle it if it is past a limit.
    pub(super) fn recycle_after_connection(&mut self, slot: usize, now: Instant) {
        if let Some(why) = self.recycle_due(slot, true, now) {
            self.recycle(slot, why, now);
        }
    }

    /// On the sampling tick: children past the memory or lifetime limit
    /// are told to finish their connection and go.
    pub(super) fn check_memory_and_lifetime(&mut self, now: Instant) {
        for (slot, why) in self.core.recycles_due(now, |link| link.figures.uss()) {
            self.recycle(slot, why, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::seed_of;

    #[test]
    fn the_jitter_seed_is_a_number_or_nothing() {
        assert_eq!(seed_of(Some("42")), Some(42));
        assert_eq!(seed_of(Some(" 7\n")), Some(7));
        assert_eq!(seed_of(Some("seven")), None);
        assert_eq!(seed_of(Some("-1")), None);
        assert_eq!(seed_of(None), None);
    }
}
