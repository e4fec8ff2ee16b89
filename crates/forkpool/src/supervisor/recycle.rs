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
use crate::core::Counted;
use crate::policy::recycle::{
    self, due, requests_exhausted, ChildLimits, ChildState, LimitSettings, Recycle,
};
use crate::scoreboard::SlotState;

/// The environment variable that fixes the jitter's random seed, so a test
/// (or an operator reproducing a pattern) gets the same limits every run.
pub const JITTER_SEED_ENV: &str = "FORKPOOL_JITTER_SEED";

/// Draws per-child limits with a seedable generator.
#[derive(Debug)]
pub(crate) struct Recycler {
    rng: fastrand::Rng,
    limits: Vec<Option<ChildLimits>>,
}

impl Default for Recycler {
    fn default() -> Self {
        let seed = std::env::var(JITTER_SEED_ENV)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        Recycler::with_seed(seed)
    }
}

impl Recycler {
    /// A recycler whose draws follow `seed` (random when `None`).
    pub fn with_seed(seed: Option<u64>) -> Self {
        Recycler {
            rng: seed.map_or_else(fastrand::Rng::new, fastrand::Rng::with_seed),
            limits: Vec::new(),
        }
    }

    /// The limits of the child `pid` in `slot`, drawn the first time it is
    /// asked about: `max_requests` plus 0..=`jitter`, and `lifetime` plus up
    /// to a tenth of it.
    pub fn limits(&mut self, slot: usize, pid: i32, settings: &LimitSettings) -> ChildLimits {
        if let Some(l) = self
            .limits
            .get(slot)
            .copied()
            .flatten()
            .filter(|l| l.pid == pid)
        {
            return l;
        }
        self.draw_for(slot, pid, settings)
    }

    /// Draws and keeps the limits of `slot`'s child `pid` (0: not forked yet).
    fn draw_for(&mut self, slot: usize, pid: i32, settings: &LimitSettings) -> ChildLimits {
        if self.limits.len() <= slot {
            self.limits.resize(slot + 1, None);
        }
        let l = recycle::draw(&mut self.rng, pid, settings);
        self.limits[slot] = Some(l);
        l
    }
}

impl Recycler {
    /// Draws the limits of the child about to be forked into `slot`, so
    /// it can be told its share (a `kernel` dispatch child counts its own
    /// connections); [`Recycler::bind`] gives them its pid once forked.
    pub fn draw_ahead(&mut self, slot: usize, settings: &LimitSettings) -> ChildLimits {
        self.draw_for(slot, 0, settings)
    }

    /// The child forked into `slot` after [`Recycler::draw_ahead`] is `pid`.
    pub fn bind(&mut self, slot: usize, pid: i32) {
        if let Some(Some(l)) = self.limits.get_mut(slot) {
            if l.pid == 0 {
                l.pid = pid;
            }
        }
    }
}

impl Supervisor {
    /// The limits of the child about to be forked into `slot` (see
    /// [`Recycler::draw_ahead`]).
    pub(super) fn draw_limits_ahead(&mut self, slot: usize) -> ChildLimits {
        let settings = LimitSettings::of(&self.core.config);
        self.recycler.draw_ahead(slot, &settings)
    }

    /// Whether the child in `slot` is past a limit now; `fresh_memory`
    /// re-reads its memory first (between connections).
    fn recycle_due(&mut self, slot: usize, fresh_memory: bool, now: Instant) -> Option<Recycle> {
        let entry = self.core.board.get(slot)?;
        let (pid, served) = (entry.pid, entry.served);
        let link = &entry.link;
        if link.child.told_to_leave() {
            return None;
        }
        let age = now.saturating_duration_since(link.child.born);
        let c = &self.core.config;
        let limits = self.recycler.limits(slot, pid, &LimitSettings::of(c));
        if fresh_memory && c.max_child_memory > 0 {
            self.resources.sample_child(slot, pid, now);
        }
        let uss = self.resources.uss(slot, pid);
        due(
            &limits,
            self.core.config.max_child_memory,
            ChildState { served, age, uss },
        )
    }

    fn recycle(&mut self, slot: usize, why: Recycle, now: Instant) {
        let reason = self.count_recycle(slot, why, "");
        self.retire(slot, &reason, now);
    }

    /// Counts a recycle for `why` in the totals and logs it, one line
    /// (none for a share of connections, which is no news), `how` added;
    /// returns the reason in words.
    fn count_recycle(&mut self, slot: usize, why: Recycle, how: &str) -> String {
        let reason = match why {
            Recycle::Requests(n) => format!("served {n} connections (max_requests_per_child)"),
            Recycle::Memory(uss) => {
                self.core.count(Counted::RecycledMemory);
                format!(
                    "unshared memory (USS) {} MiB is above max_child_memory {} MiB",
                    uss >> 20,
                    self.core.config.max_child_memory >> 20
                )
            }
            Recycle::Lifetime(age) => {
                self.core.count(Counted::RecycledLifetime);
                format!(
                    "{}s old (max_child_lifetime {:?})",
                    age.as_secs(),
                    self.core.config.max_child_lifetime
                )
            }
        };
        if !matches!(why, Recycle::Requests(_)) {
            let pid = self.core.board.get(slot).map_or(0, |s| s.pid);
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
        let Some(entry) = self.core.board.get(slot) else {
            return;
        };
        let child = &entry.link.child;
        if child.told_to_leave() {
            return;
        }
        let pid = entry.pid;
        // Counted from before its fork: never younger than the child's own
        // count, which starts at its `K`.
        let age = now.saturating_duration_since(child.born);
        let forked_by_template = child.role.version == crate::protocol::TEMPLATE_VERSION;
        // The board says what it served up to its `X` (the core's count may
        // be a reading behind).
        let served = self
            .kernel
            .as_ref()
            .map_or(entry.served, |k| k.board().sample(slot).served);
        let config = &self.core.config;
        let (max_memory, base_lifetime) = (config.max_child_memory, config.max_child_lifetime);
        let drawn = self.recycler.limits(slot, pid, &LimitSettings::of(config));
        // What it was told: its own drawn lifetime, or, forked by a
        // template, the template's (the jitter-free one it inherited).
        let told = ChildLimits {
            lifetime: match forked_by_template {
                true => base_lifetime,
                false => drawn.lifetime,
            },
            ..drawn
        };
        let uss = match max_memory > 0 && !requests_exhausted(served, told.max_requests) {
            true => self.resources.sample_uss(slot, pid, now),
            false => None,
        };
        match due(&told, max_memory, ChildState { served, age, uss }) {
            None | Some(Recycle::Requests(_)) => {}
            Some(why) => {
                self.count_recycle(
                    slot,
                    why,
                    "; it saw so itself after its connection and left",
                );
            }
        }
    }

    /// After a child's `X`: its channel is shut down for sending (the
    /// supervisor sends nothing after an `X` anyway), and the child, which
    /// reads end of file then, exits. A child that left for a limit waits
    /// for that, so that [`Self::judge_leaving`] finds it still there.
    pub(super) fn let_go(&self, slot: usize) {
        let Some(link) = self.core.board.link(slot) else {
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
        if self.core.config.max_child_memory == 0 && self.core.config.max_child_lifetime.is_zero() {
            return;
        }
        let serving: Vec<usize> = self
            .core
            .board
            .iter()
            .filter(|(_, s)| matches!(s.state, SlotState::Idle | SlotState::Busy))
            .map(|(slot, _)| slot)
            .collect();
        for slot in serving {
            if let Some(why) = self.recycle_due(slot, false, now) {
                if !matches!(why, Recycle::Requests(_)) {
                    self.recycle(slot, why, now);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn settings(max_requests: u64, jitter: u64, lifetime: Duration) -> LimitSettings {
        LimitSettings {
            max_requests,
            jitter,
            lifetime,
        }
    }

    #[test]
    fn a_fixed_seed_gives_the_same_limits() {
        let draw = |seed| {
            let mut r = Recycler::with_seed(Some(seed));
            (0..8)
                .map(|slot| {
                    r.limits(
                        slot,
                        100 + slot as i32,
                        &settings(1000, 500, Duration::ZERO),
                    )
                })
                .map(|l| l.max_requests)
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn limits_drawn_ahead_belong_to_the_child_forked_next() {
        let mut r = Recycler::with_seed(Some(3));
        let ahead = r.draw_ahead(2, &settings(1000, 500, Duration::ZERO));
        r.bind(2, 77);
        let asked = r.limits(2, 77, &settings(1000, 500, Duration::ZERO));
        assert_eq!(asked.max_requests, ahead.max_requests);
        assert_eq!(asked.pid, 77);
        // Another child in the slot later gets limits of its own.
        assert_eq!(
            r.limits(2, 78, &settings(1000, 500, Duration::ZERO)).pid,
            78
        );
    }

    #[test]
    fn jitter_spreads_children_started_together() {
        // Eight children, a limit of 1000 and a jitter of 500: with the
        // seed fixed, no two draw the same limit, so on a steady load they
        // retire at different times.
        let mut r = Recycler::with_seed(Some(42));
        let mut limits: Vec<u64> = (0..8)
            .map(|slot| {
                r.limits(
                    slot,
                    100 + slot as i32,
                    &settings(1000, 500, Duration::ZERO),
                )
            })
            .map(|l| l.max_requests)
            .collect();
        limits.sort_unstable();
        limits.dedup();
        assert_eq!(limits.len(), 8, "{limits:?}");
    }

    #[test]
    fn a_child_keeps_its_limits_and_a_new_pid_draws_again() {
        let mut r = Recycler::with_seed(Some(1));
        let a = r.limits(0, 10, &settings(100, 1_000_000, Duration::from_secs(100)));
        assert_eq!(
            r.limits(0, 10, &settings(100, 1_000_000, Duration::from_secs(100))),
            a
        );
        let b = r.limits(0, 11, &settings(100, 1_000_000, Duration::from_secs(100)));
        assert_ne!(a.max_requests, b.max_requests);
    }
}
