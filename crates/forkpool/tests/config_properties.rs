//! `PoolConfig::validate` accepts exactly the configs whose bounds fit
//! together: every accepted config keeps the invariants the rest of the
//! library relies on, and every config that keeps them is accepted.

use std::time::Duration;

use forkpool::config::{PoolConfig, MAX_CHILDREN_LIMIT};
use proptest::prelude::*;

fn small_or_any() -> impl Strategy<Value = u32> {
    prop_oneof![4 => 0u32..=80, 1 => any::<u32>()]
}

fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![1 => Just(Duration::ZERO), 4 => (1u64..=10_000).prop_map(Duration::from_millis)]
}

fn any_config() -> impl Strategy<Value = PoolConfig> {
    (
        (
            small_or_any(),
            small_or_any(),
            small_or_any(),
            small_or_any(),
        ),
        (small_or_any(), small_or_any()),
        (duration(), duration(), duration(), duration()),
    )
        .prop_map(
            |(
                (min_children, max_children, min_spare, max_spare),
                (max_spawn_rate, backlog),
                (ping_interval, ping_timeout, shutdown_timeout, retire_grace),
            )| PoolConfig {
                min_children,
                max_children,
                min_spare,
                max_spare,
                max_spawn_rate,
                backlog,
                ping_interval,
                ping_timeout,
                shutdown_timeout,
                retire_grace,
                ..PoolConfig::default()
            },
        )
}

/// The invariants, written out independently of `validate()`.
fn bounds_fit(c: &PoolConfig) -> bool {
    (1..=MAX_CHILDREN_LIMIT).contains(&c.max_children)
        && c.min_children <= c.max_children
        && c.min_spare <= c.max_spare
        && c.min_spare <= c.max_children
        && c.max_spawn_rate >= 1
        && !c.ping_interval.is_zero()
        && !c.ping_timeout.is_zero()
        && c.backlog >= 1
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn validate_accepts_exactly_the_configs_whose_bounds_fit(config in any_config()) {
        match config.validate() {
            Ok(()) => prop_assert!(bounds_fit(&config), "accepted {config:?}"),
            Err(e) => {
                prop_assert!(!bounds_fit(&config), "rejected {config:?}: {e}");
                prop_assert!(!e.field.is_empty());
                prop_assert!(
                    e.message.contains(e.field),
                    "the message {:?} does not name the field {}",
                    e.message,
                    e.field
                );
            }
        }
    }
}
