//! Recycling children before they cost too much: after N connections
//! (spread by a random jitter), once their unshared memory passes a limit,
//! or once they are older than a lifetime. A recycled child finishes its
//! current connection, then exits, and the pool starts a fresh one.
//!
//! Memory is judged on USS, not RSS: children share most pages with the
//! supervisor copy-on-write, and RSS counts those in full in every child,
//! so it grows with the shared part and says nothing about what one child
//! costs. USS is what the machine gets back when the child exits.

use std::time::{Duration, Instant};

use tracing::info;

use super::Supervisor;
use crate::scoreboard::SlotState;

/// The environment variable that fixes the jitter's random seed, so a test
/// (or an operator reproducing a pattern) gets the same limits every run.
pub const JITTER_SEED_ENV: &str = "FORKPOOL_JITTER_SEED";

/// Why a child is recycled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recycle {
    /// It served its (jittered) number of connections.
    Requests(u64),
    /// Its USS, in bytes, is above `max_child_memory`.
    Memory(u64),
    /// It is older than its (jittered) lifetime.
    Lifetime(Duration),
}

/// One child's own limits, drawn once when it is first seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChildLimits {
    pid: i32,
    /// Connections before recycling; 0 = no limit.
    pub max_requests: u64,
    /// Age before recycling; zero = no limit.
    pub lifetime: Duration,
}

/// What one child looks like to the policy.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChildState {
    pub served: u64,
    pub age: Duration,
    pub uss: Option<u64>,
}

/// The policy: the first limit `child` is past, if any. `max_memory` 0
/// means no memory limit. Pure.
pub(crate) fn due(limits: &ChildLimits, max_memory: u64, child: ChildState) -> Option<Recycle> {
    if limits.max_requests > 0 && child.served >= limits.max_requests {
        return Some(Recycle::Requests(child.served));
    }
    if let Some(uss) = child.uss.filter(|&u| max_memory > 0 && u > max_memory) {
        return Some(Recycle::Memory(uss));
    }
    if !limits.lifetime.is_zero() && child.age >= limits.lifetime {
        return Some(Recycle::Lifetime(child.age));
    }
    None
}

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
    pub fn limits(
        &mut self,
        slot: usize,
        pid: i32,
        max_requests: u64,
        jitter: u64,
        lifetime: Duration,
    ) -> ChildLimits {
        if self.limits.len() <= slot {
            self.limits.resize(slot + 1, None);
        }
        if let Some(l) = self.limits[slot].filter(|l| l.pid == pid) {
            return l;
        }
        let max_requests = if max_requests == 0 {
            0
        } else {
            max_requests.saturating_add(self.rng.u64(0..=jitter))
        };
        let spread = lifetime.as_nanos() as u64 / 10;
        let lifetime = if lifetime.is_zero() {
            lifetime
        } else {
            lifetime + Duration::from_nanos(self.rng.u64(0..=spread))
        };
        let l = ChildLimits {
            pid,
            max_requests,
            lifetime,
        };
        self.limits[slot] = Some(l);
        l
    }
}

impl Supervisor {
    /// Whether the child in `slot` is past a limit now; `fresh_memory`
    /// re-reads its memory first (between connections).
    fn recycle_due(&mut self, slot: usize, fresh_memory: bool, now: Instant) -> Option<Recycle> {
        let entry = self.board.get(slot)?;
        let (pid, served) = (entry.pid, entry.served);
        let link = &entry.link;
        if link.told_to_leave() {
            return None;
        }
        let age = now.saturating_duration_since(link.spawned_at);
        let c = &self.config;
        let limits = self.recycler.limits(
            slot,
            pid,
            c.max_requests_per_child,
            c.max_requests_jitter,
            c.max_child_lifetime,
        );
        if fresh_memory && c.max_child_memory > 0 {
            self.resources.sample_child(slot, pid, now);
        }
        let uss = self.resources.uss(slot, pid);
        due(
            &limits,
            self.config.max_child_memory,
            ChildState { served, age, uss },
        )
    }

    fn recycle(&mut self, slot: usize, why: Recycle, now: Instant) {
        let reason = match why {
            Recycle::Requests(n) => format!("served {n} connections (max_requests_per_child)"),
            Recycle::Memory(uss) => {
                self.totals.recycled_memory += 1;
                format!(
                    "unshared memory (USS) {} MiB is above max_child_memory {} MiB",
                    uss >> 20,
                    self.config.max_child_memory >> 20
                )
            }
            Recycle::Lifetime(age) => {
                self.totals.recycled_lifetime += 1;
                format!(
                    "{}s old (max_child_lifetime {:?})",
                    age.as_secs(),
                    self.config.max_child_lifetime
                )
            }
        };
        if !matches!(why, Recycle::Requests(_)) {
            let pid = self.board.get(slot).map_or(0, |s| s.pid);
            info!(slot, pid, "recycling child: {reason}");
        }
        self.retire(slot, &reason, now);
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
        if self.config.max_child_memory == 0 && self.config.max_child_lifetime.is_zero() {
            return;
        }
        let serving: Vec<usize> = self
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
    use proptest::prelude::*;

    const NONE: ChildLimits = ChildLimits {
        pid: 1,
        max_requests: 0,
        lifetime: Duration::ZERO,
    };

    fn child(served: u64, age_s: u64, uss: Option<u64>) -> ChildState {
        ChildState {
            served,
            age: Duration::from_secs(age_s),
            uss,
        }
    }

    #[test]
    fn no_limits_never_recycle() {
        assert_eq!(
            due(&NONE, 0, child(1_000_000, 100_000, Some(1 << 40))),
            None
        );
    }

    #[test]
    fn each_limit_applies_on_its_own() {
        let requests = ChildLimits {
            max_requests: 10,
            ..NONE
        };
        assert_eq!(due(&requests, 0, child(9, 0, None)), None);
        assert_eq!(
            due(&requests, 0, child(10, 0, None)),
            Some(Recycle::Requests(10))
        );
        assert_eq!(due(&NONE, 100, child(0, 0, Some(100))), None);
        assert_eq!(
            due(&NONE, 100, child(0, 0, Some(101))),
            Some(Recycle::Memory(101))
        );
        // Unknown memory is never over the limit.
        assert_eq!(due(&NONE, 100, child(0, 0, None)), None);
        let old = ChildLimits {
            lifetime: Duration::from_secs(60),
            ..NONE
        };
        assert_eq!(due(&old, 0, child(0, 59, None)), None);
        assert_eq!(
            due(&old, 0, child(0, 60, None)),
            Some(Recycle::Lifetime(Duration::from_secs(60)))
        );
    }

    #[test]
    fn a_fixed_seed_gives_the_same_limits() {
        let draw = |seed| {
            let mut r = Recycler::with_seed(Some(seed));
            (0..8)
                .map(|slot| r.limits(slot, 100 + slot as i32, 1000, 500, Duration::ZERO))
                .map(|l| l.max_requests)
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn jitter_spreads_children_started_together() {
        // Eight children, a limit of 1000 and a jitter of 500: with the
        // seed fixed, no two draw the same limit, so on a steady load they
        // retire at different times.
        let mut r = Recycler::with_seed(Some(42));
        let mut limits: Vec<u64> = (0..8)
            .map(|slot| r.limits(slot, 100 + slot as i32, 1000, 500, Duration::ZERO))
            .map(|l| l.max_requests)
            .collect();
        limits.sort_unstable();
        limits.dedup();
        assert_eq!(limits.len(), 8, "{limits:?}");
    }

    #[test]
    fn a_child_keeps_its_limits_and_a_new_pid_draws_again() {
        let mut r = Recycler::with_seed(Some(1));
        let a = r.limits(0, 10, 100, 1_000_000, Duration::from_secs(100));
        assert_eq!(r.limits(0, 10, 100, 1_000_000, Duration::from_secs(100)), a);
        let b = r.limits(0, 11, 100, 1_000_000, Duration::from_secs(100));
        assert_ne!(a.max_requests, b.max_requests);
    }

    proptest! {
        #[test]
        fn drawn_limits_stay_within_their_spread(
            seed: u64, max in 1u64..1_000_000, jitter in 0u64..1_000_000, life_s in 0u64..100_000,
        ) {
            let mut r = Recycler::with_seed(Some(seed));
            let life = Duration::from_secs(life_s);
            let l = r.limits(0, 1, max, jitter, life);
            prop_assert!(l.max_requests >= max && l.max_requests <= max + jitter);
            prop_assert!(l.lifetime >= life && l.lifetime <= life + life / 10);
            let none = r.limits(1, 2, 0, jitter, Duration::ZERO);
            prop_assert_eq!(none.max_requests, 0);
            prop_assert_eq!(none.lifetime, Duration::ZERO);
        }
    }
}
