//! The rollout policy of a reload, as a pure function: given how many
//! children of the old and the new generation there are, and how many of
//! the new ones are ready, say how many new children to start and how many
//! old ones to retire.
//!
//! The rules:
//! - the new generation starts with one child, the canary; nothing else
//!   starts, and nothing old retires, until it is ready;
//! - once the canary is ready, the rest of the new generation starts (up to
//!   the target size);
//! - an old child retires only for a new child that is ready: the old
//!   children kept are `target - new_ready`, so the pool never has fewer
//!   serving children than the target;
//! - the rollout is done when no old child is left and a new one is ready.
//!
//! A new child failing at start-up abandons the rollout; that decision is
//! the core's (`core/rollout.rs`), since it needs no counting.

/// The children the policy looks at. "Live" excludes children already
/// told to quit or killed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct GenerationCounts {
    /// Live children of the generations being replaced.
    pub old_live: u32,
    /// Live children of the new generation, starting or ready.
    pub new_live: u32,
    /// Of `new_live`, those that are ready to serve.
    pub new_ready: u32,
}

/// What to do next in a rollout.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RolloutStep {
    /// New-generation children to start now.
    pub spawn: u32,
    /// Old-generation children to retire now.
    pub retire_old: u32,
    /// Every old child is gone and the new generation serves.
    pub done: bool,
}

/// The next step towards `target` children of the new generation.
pub(crate) fn rollout_step(target: u32, c: GenerationCounts) -> RolloutStep {
    let target = target.max(1);
    let new_ready = c.new_ready.min(c.new_live);
    let spawn = if new_ready == 0 {
        // Only the canary until it has shown the new code starts.
        u32::from(c.new_live == 0)
    } else {
        target.saturating_sub(c.new_live)
    };
    let retire_old = if new_ready == 0 {
        0
    } else {
        c.old_live.saturating_sub(target.saturating_sub(new_ready))
    };
    RolloutStep {
        spawn,
        retire_old,
        done: c.old_live == 0 && new_ready > 0,
    }
}

/// Whether the next refork is due: thresholds `after` (increasing), of
/// which `done` have been used, for a worker that has served `served`.
/// Each threshold is used once, whether its refork worked or not.
pub(crate) fn refork_due(after: &[u64], done: usize, served: u64) -> bool {
    after.get(done).is_some_and(|n| served >= *n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn each_refork_threshold_is_due_once_in_order() {
        let after = [100, 1000];
        assert!(!refork_due(&after, 0, 99));
        assert!(refork_due(&after, 0, 100));
        assert!(!refork_due(&after, 1, 999));
        assert!(refork_due(&after, 1, 5000));
        assert!(!refork_due(&after, 2, u64::MAX));
        assert!(!refork_due(&[], 0, u64::MAX));
    }

    fn counts(old_live: u32, new_live: u32, new_ready: u32) -> GenerationCounts {
        GenerationCounts {
            old_live,
            new_live,
            new_ready,
        }
    }

    #[test]
    fn the_canary_starts_alone_and_nothing_old_retires_before_it_is_ready() {
        assert_eq!(rollout_step(4, counts(4, 0, 0)).spawn, 1);
        let waiting = rollout_step(4, counts(4, 1, 0));
        assert_eq!(waiting, RolloutStep::default());
    }

    #[test]
    fn a_ready_canary_lets_the_rest_start_and_one_old_child_retire() {
        let step = rollout_step(4, counts(4, 1, 1));
        assert_eq!(step.spawn, 3);
        assert_eq!(step.retire_old, 1);
        assert!(!step.done);
    }

    #[test]
    fn old_children_retire_one_for_one_with_ready_new_ones() {
        assert_eq!(rollout_step(4, counts(3, 4, 1)).retire_old, 0);
        assert_eq!(rollout_step(4, counts(3, 4, 3)).retire_old, 2);
        assert!(rollout_step(4, counts(0, 4, 4)).done);
    }

    #[test]
    fn a_pool_that_was_empty_still_gets_a_canary() {
        assert_eq!(rollout_step(0, counts(0, 0, 0)).spawn, 1);
        assert!(!rollout_step(0, counts(0, 1, 0)).done);
        assert!(rollout_step(0, counts(0, 1, 1)).done);
    }

    proptest! {
        /// Serving children (old kept plus new ready) never fall below the
        /// target while the rollout runs, and the new generation never
        /// grows past it.
        #[test]
        fn never_below_target_never_above(
            target in 1u32..64, old in 0u32..64, new_live in 0u32..64, ready in 0u32..64,
        ) {
            let ready = ready.min(new_live);
            let step = rollout_step(target, counts(old, new_live, ready));
            let old_after = old - step.retire_old;
            prop_assert!(old_after + ready >= target.min(old + ready));
            prop_assert!(new_live + step.spawn <= target.max(new_live));
            if ready == 0 {
                prop_assert_eq!(step.retire_old, 0);
                prop_assert!(new_live + step.spawn <= 1.max(new_live));
            }
        }
    }
}
