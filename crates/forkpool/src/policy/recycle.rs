//! Recycling: when a child has done enough and should be replaced.
//!
//! A child is recycled after its share of connections (`max_requests_per_child`
//! plus a random jitter drawn once per child, so children started together
//! do not all leave together), once its unshared memory passes
//! `max_child_memory`, or once it is older than its lifetime (plus up to a
//! tenth). [`requests_exhausted`] is the connection rule both sides of the
//! fork use: the supervisor to retire the child, the child to stop taking
//! connections itself when it is at its limit.

use std::time::Duration;

/// Whether a child that has served `served` connections is at its limit of
/// `max` (0: no limit).
pub(crate) fn requests_exhausted(served: u64, max: u64) -> bool {
    max > 0 && served >= max
}

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

/// One child's own limits, drawn once for it and kept in its record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ChildLimits {
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
    if requests_exhausted(child.served, limits.max_requests) {
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

/// The pool's recycling settings a child's limits are drawn from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LimitSettings {
    /// `max_requests_per_child` (0: no limit).
    pub max_requests: u64,
    /// `max_requests_jitter`: up to this many more, drawn per child.
    pub jitter: u64,
    /// `max_child_lifetime` (zero: no limit).
    pub lifetime: Duration,
}

impl LimitSettings {
    /// The settings of `config`.
    pub fn of(config: &crate::config::PoolConfig) -> LimitSettings {
        LimitSettings {
            max_requests: config.max_requests_per_child,
            jitter: config.max_requests_jitter,
            lifetime: config.max_child_lifetime,
        }
    }
}

/// Draws one child's limits from `rng`: `max_requests` plus 0..=`jitter`,
/// and `lifetime` plus up to a tenth of it (zero stays zero: no limit).
pub(crate) fn draw(rng: &mut fastrand::Rng, settings: &LimitSettings) -> ChildLimits {
    let LimitSettings {
        max_requests,
        jitter,
        lifetime,
    } = *settings;
    let max_requests = if max_requests == 0 {
        0
    } else {
        max_requests.saturating_add(rng.u64(0..=jitter))
    };
    let spread = lifetime.as_nanos() as u64 / 10;
    let lifetime = if lifetime.is_zero() {
        lifetime
    } else {
        lifetime + Duration::from_nanos(rng.u64(0..=spread))
    };
    ChildLimits {
        max_requests,
        lifetime,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn zero_means_no_request_limit() {
        assert!(!requests_exhausted(u64::MAX, 0));
        assert!(!requests_exhausted(9, 10));
        assert!(requests_exhausted(10, 10));
        assert!(requests_exhausted(11, 10));
    }

    const NONE: ChildLimits = ChildLimits {
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

    proptest! {
        #[test]
        fn drawn_limits_stay_within_their_spread(
            seed: u64, max in 1u64..1_000_000, jitter in 0u64..1_000_000, life_s in 0u64..100_000,
        ) {
            let mut rng = fastrand::Rng::with_seed(seed);
            let life = Duration::from_secs(life_s);
            let l = draw(&mut rng, &LimitSettings { max_requests: max, jitter, lifetime: life });
            prop_assert!(l.max_requests >= max && l.max_requests <= max + jitter);
            prop_assert!(l.lifetime >= life && l.lifetime <= life + life / 10);
            let none = draw(&mut rng, &LimitSettings { max_requests: 0, jitter, lifetime: Duration::ZERO });
            prop_assert_eq!(none.max_requests, 0);
            prop_assert_eq!(none.lifetime, Duration::ZERO);
        }
    }
}
