//! Recycling, as the core decides it: each child's own limits, drawn once
//! (with the pool's jitter) and kept in its record, whether a child is
//! past one (`policy::recycle`), which serving children a round of
//! samples recycles, and a recycle counted and put in words. The shell
//! reads a child's memory when the core asks for it, and retires the
//! child the core names.

use std::time::{Duration, Instant};

use super::child::HasChild;
use super::{Core, Counted};
use crate::config::{DispatchMode, SelfLimits};
use crate::policy::recycle::{self, due, requests_exhausted, ChildLimits, ChildState, Recycle};
use crate::protocol::TEMPLATE_VERSION;
use crate::scoreboard::SlotState;

impl<L: HasChild> Core<L> {
    /// Fixes the jitter's random seed (`FORKPOOL_JITTER_SEED`), so a test
    /// or an operator reproducing a pattern gets the same limits each run.
    pub fn seed_jitter(&mut self, seed: u64) {
        self.jitter = fastrand::Rng::with_seed(seed);
    }

    /// Draws one child's limits: a child about to be forked is told its
    /// share of connections before it exists. [`Core::adopt`] draws for
    /// a child that has none yet.
    pub fn draw_limits(&mut self) -> ChildLimits {
        recycle::draw(&mut self.jitter, &recycle::LimitSettings::of(&self.config))
    }

    /// Adopts a child forked with `limits` drawn before its fork
    /// ([`Core::draw_limits`]), which it was told its share from.
    pub fn adopt_with_limits(
        &mut self,
        slot: usize,
        pid: i32,
        generation: u32,
        mut link: L,
        limits: ChildLimits,
        now: Instant,
    ) {
        link.child_mut().role.limits = Some(limits);
        self.adopt(slot, pid, generation, link, now);
    }

    /// The limits of the child in `slot` (none for an empty slot).
    pub fn limits(&self, slot: usize) -> ChildLimits {
        self.board
            .link(slot)
            .and_then(|link| link.child().role.limits)
            .unwrap_or_default()
    }

    /// Whether the child in `slot` is past one of its limits, its memory
    /// (USS) read by the shell as `uss`. A child already told to leave is
    /// not judged again.
    pub fn recycle_due(&self, slot: usize, uss: Option<u64>, now: Instant) -> Option<Recycle> {
        let entry = self.board.get(slot)?;
        let child = entry.link.child();
        if child.told_to_leave() {
            return None;
        }
        let age = now.saturating_duration_since(child.born);
        let state = ChildState {
            served: entry.served,
            age,
            uss,
        };
        due(&self.limits(slot), self.config.max_child_memory, state)
    }

    /// At the end of a round of samples: the serving children past their
    /// memory or lifetime limit, their memory as the shell last read it
    /// (`uss` of each child's link). A share of connections is judged as
    /// each connection ends, not here.
    pub fn recycles_due(
        &self,
        now: Instant,
        uss: impl Fn(&L) -> Option<u64>,
    ) -> Vec<(usize, Recycle)> {
        if self.config.max_child_memory == 0 && self.config.max_child_lifetime.is_zero() {
            return Vec::new();
        }
        (self.board.iter())
            .filter(|(_, s)| matches!(s.state, SlotState::Idle | SlotState::Busy))
            .filter_map(|(slot, s)| Some((slot, self.recycle_due(slot, uss(&s.link), now)?)))
            .filter(|(_, why)| !matches!(why, Recycle::Requests(_)))
            .collect()
    }

    /// A child recycled for `why`: counted (a share of connections is no
    /// news and not counted), and put in words for the log.
    pub fn recycled(&mut self, why: Recycle) -> String {
        match why {
            Recycle::Requests(n) => format!("served {n} connections (max_requests_per_child)"),
            Recycle::Memory(uss) => {
                self.count(Counted::RecycledMemory);
                format!(
                    "unshared memory (USS) {} MiB is above max_child_memory {} MiB",
                    uss >> 20,
                    self.config.max_child_memory >> 20
                )
            }
            Recycle::Lifetime(age) => {
                self.count(Counted::RecycledLifetime);
                format!(
                    "{}s old (max_child_lifetime {:?})",
                    age.as_secs(),
                    self.config.max_child_lifetime
                )
            }
        }
    }

    /// The limits a child checks itself, with `lifetime` its own (drawn):
    /// in `kernel` dispatch, where the supervisor does not see each
    /// connection end, `max_child_memory` and the lifetime; in other modes
    /// none (the supervisor looks after each connection).
    pub fn self_limits(&self, lifetime: Duration) -> SelfLimits {
        if self.config.dispatch != DispatchMode::Kernel {
            return SelfLimits::default();
        }
        SelfLimits {
            max_memory: self.config.max_child_memory,
            lifetime,
        }
    }

    /// The limits a `kernel` dispatch child was told and checks itself:
    /// its own drawn ones, except that a worker forked by a template
    /// inherited the template's lifetime (the jitter-free one).
    fn told_limits(&self, slot: usize) -> ChildLimits {
        let drawn = self.limits(slot);
        let forked_by_template = self
            .board
            .link(slot)
            .is_some_and(|l| l.child().role.version == TEMPLATE_VERSION);
        ChildLimits {
            lifetime: match forked_by_template {
                true => self.config.max_child_lifetime,
                false => drawn.lifetime,
            },
            ..drawn
        }
    }

    /// A `kernel` dispatch child that said `X` after `served` connections:
    /// whether its memory must be read to judge why it left (only a limit
    /// on memory, and not when its share of connections explains it).
    pub fn leaving_needs_memory(&self, slot: usize, served: u64) -> bool {
        self.config.max_child_memory > 0
            && !requests_exhausted(served, self.told_limits(slot).max_requests)
    }

    /// Why a `kernel` dispatch child that said `X` on its own left, judged
    /// by the supervisor's own look, not the child's word (`X` says no
    /// why): its memory as read now (`uss`), its age by the supervisor's
    /// clock, counted from before its fork. `None` for a share of
    /// connections (no news), for no limit reached, and for a child told
    /// to leave already (counted then).
    pub fn judge_leaving(
        &self,
        slot: usize,
        served: u64,
        uss: Option<u64>,
        now: Instant,
    ) -> Option<Recycle> {
        let child = self.board.link(slot)?.child();
        if child.told_to_leave() {
            return None;
        }
        let age = now.saturating_duration_since(child.born);
        let state = ChildState { served, age, uss };
        match due(&self.told_limits(slot), self.config.max_child_memory, state) {
            None | Some(Recycle::Requests(_)) => None,
            why => why,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use crate::config::{DispatchMode, PoolConfig};
    use crate::core::child::Child;
    use crate::core::Core;
    use crate::policy::recycle::Recycle;
    use crate::protocol::ChildMessage;

    fn core(max_requests: u64, jitter: u64, lifetime: Duration, seed: u64) -> Core<Child> {
        let mut core: Core<Child> = Core::new(PoolConfig {
            max_requests_per_child: max_requests,
            max_requests_jitter: jitter,
            max_child_lifetime: lifetime,
            ..PoolConfig::default()
        });
        core.seed_jitter(seed);
        core
    }

    /// A pool that recycles at 64 MiB of USS and after `max_requests`.
    fn memory_limited(max_requests: u64) -> Core<Child> {
        Core::new(PoolConfig {
            max_requests_per_child: max_requests,
            max_child_memory: 64 << 20,
            ..PoolConfig::default()
        })
    }

    /// Adopts eight children and returns each one's drawn share.
    fn shares(core: &mut Core<Child>, now: Instant) -> Vec<u64> {
        (0..8)
            .map(|slot| {
                core.adopt(slot, 100 + slot as i32, 1, Child::new(now, true, 1), now);
                core.limits(slot).max_requests
            })
            .collect()
    }

    #[test]
    fn a_fixed_seed_gives_the_same_limits() {
        let now = Instant::now();
        let draw = |seed| shares(&mut core(1000, 500, Duration::ZERO, seed), now);
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn jitter_spreads_children_started_together() {
        // Eight children, a limit of 1000 and a jitter of 500: with the
        // seed fixed, no two draw the same limit, so on a steady load they
        // retire at different times.
        let now = Instant::now();
        let mut limits = shares(&mut core(1000, 500, Duration::ZERO, 42), now);
        limits.sort_unstable();
        limits.dedup();
        assert_eq!(limits.len(), 8, "{limits:?}");
    }

    #[test]
    fn limits_drawn_ahead_belong_to_the_child_forked_with_them_and_leave_with_it() {
        let now = Instant::now();
        let mut core = core(1000, 1_000_000, Duration::ZERO, 3);
        let ahead = core.draw_limits();
        core.adopt_with_limits(2, 77, 1, Child::new(now, true, 1), ahead, now);
        assert_eq!(core.limits(2), ahead);
        // The next child in the slot draws limits of its own.
        core.board.vacate(2);
        core.adopt(2, 78, 1, Child::new(now, true, 1), now);
        assert_ne!(core.limits(2), ahead);
    }

    #[test]
    fn a_child_past_its_lifetime_is_due_and_a_young_one_is_not() {
        let t0 = Instant::now();
        let mut core = core(0, 0, Duration::from_secs(10), 1);
        core.adopt(0, 40, 1, Child::new(t0, true, 1), t0);
        let lifetime = core.limits(0).lifetime;
        assert!(lifetime >= Duration::from_secs(10) && lifetime <= Duration::from_secs(11));
        assert_eq!(core.recycle_due(0, None, t0 + Duration::from_secs(9)), None);
        let late = t0 + lifetime;
        assert_eq!(
            core.recycle_due(0, None, late),
            Some(Recycle::Lifetime(lifetime))
        );
        // A child leaving on its own past it is judged the same way.
        assert_eq!(
            core.judge_leaving(0, 0, None, late),
            Some(Recycle::Lifetime(lifetime))
        );
    }

    #[test]
    fn memory_is_read_to_judge_a_leaving_child_only_when_its_share_does_not_explain_it() {
        let t0 = Instant::now();
        let mut core = memory_limited(10);
        core.adopt(0, 40, 1, Child::new(t0, true, 1), t0);
        assert!(core.leaving_needs_memory(0, 3));
        assert!(!core.leaving_needs_memory(0, 10));
        assert_eq!(
            core.judge_leaving(0, 3, Some(65 << 20), t0),
            Some(Recycle::Memory(65 << 20))
        );
        // Its share of connections is no news.
        assert_eq!(core.judge_leaving(0, 10, Some(65 << 20), t0), None);
    }

    #[test]
    fn a_round_of_samples_recycles_serving_children_past_their_memory() {
        let t0 = Instant::now();
        let mut core = memory_limited(1);
        for slot in 0..2 {
            let pid = 40 + slot as i32;
            core.adopt(slot, pid, 1, Child::new(t0, true, 1), t0);
            core.report(slot, ChildMessage::Ready { pid: pid as u32 }, t0);
        }
        // Slot 2 is still starting: not serving, not judged.
        core.adopt(2, 42, 1, Child::new(t0, true, 1), t0);
        let fat = |_: &Child| Some(65 << 20);
        let due = core.recycles_due(t0, fat);
        assert_eq!(
            due,
            [
                (0, Recycle::Memory(65 << 20)),
                (1, Recycle::Memory(65 << 20))
            ]
        );
        // A share of connections served is judged as each one ends.
        core.handed(0, t0);
        core.report(0, ChildMessage::Idle, t0);
        assert_eq!(core.recycle_due(0, None, t0), Some(Recycle::Requests(1)));
        assert_eq!(core.recycles_due(t0, |_| Some(1 << 20)), []);
        // Counted and worded once recycled; a share is no news.
        assert!(core
            .recycled(due[0].1)
            .contains("65 MiB is above max_child_memory 64 MiB"));
        assert!(core.recycled(Recycle::Requests(1)).contains("served 1"));
        assert_eq!(core.totals.recycled_memory, 1);
        // Without memory or lifetime limits, a round recycles nobody.
        let mut unlimited: Core<Child> = Core::new(PoolConfig::default());
        unlimited.adopt(0, 40, 1, Child::new(t0, true, 1), t0);
        unlimited.report(0, ChildMessage::Ready { pid: 40 }, t0);
        assert_eq!(unlimited.recycles_due(t0, fat), []);
    }

    #[test]
    fn a_child_checks_its_own_limits_only_in_kernel_dispatch() {
        let limited = |dispatch| -> Core<Child> {
            Core::new(PoolConfig {
                dispatch,
                max_child_memory: 64 << 20,
                ..PoolConfig::default()
            })
        };
        let lifetime = Duration::from_secs(60);
        let own = limited(DispatchMode::Kernel).self_limits(lifetime);
        assert_eq!((own.max_memory, own.lifetime), (64 << 20, lifetime));
        let none = limited(DispatchMode::Handoff).self_limits(lifetime);
        assert_eq!((none.max_memory, none.lifetime), (0, Duration::ZERO));
    }
}
