//! HAProxy's agent check: one line telling the balancer how much work to
//! send.
//!
//! HAProxy connects to the agent port every `agent-inter`, reads one line
//! and closes. The line is a list of words separated by spaces: a weight
//! as a percentage of the server's configured `weight`, and words that set
//! the server's state. The reply this pool gives:
//!
//! | pool                                   | line                    |
//! |----------------------------------------|-------------------------|
//! | serving, can take work                 | `up ready N%`           |
//! | draining (stop or hand-over coming) or stopping | `drain`        |
//! | starting (never ready yet)             | `down #starting`        |
//! | serving, but no child can take work    | `down #no ready child`  |
//!
//! The weight `N` follows spare capacity: idle children plus room to grow
//! to `max_children`, as a share of `max_children`, **rounded up**, between
//! **1 and 100**. Rounding up means any spare child shows as at least 1%;
//! only a pool with every child free reports 100% (999 of 1000 free is
//! 99%). The floor is 1%,
//! not 0%: HAProxy treats a weight of 0 like `drain` and sends nothing, and
//! a saturated pool still serves what waits in its backlog; if every pool
//! behind a balancer is saturated, they keep sharing the load instead of
//! the balancer refusing it. With the server's `weight 100` in HAProxy the
//! percentage is the weight itself.
//!
//! Every serving reply says `up ready` as well as the weight: `drain` and
//! `down` stay in force in HAProxy until an agent says otherwise, so a pool
//! that comes back (or the successor of a `USR2` hand-over answering on the
//! same port) must lift them.

use std::fmt;

use super::{Capacity, Phase};

/// Why the agent reports the server down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DownReason {
    /// The pool has not become ready yet.
    Starting,
    /// No child is ready, none is starting, and none may be started
    /// (spawns held back after start-up failures).
    NoReadyChild,
}

/// What the agent tells HAProxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentReply {
    /// Take work, at this share of the configured weight (1 to 100).
    Ready {
        /// The weight, a percentage of the server's configured weight.
        weight_percent: u8,
    },
    /// Send no new work: the pool is about to stop or hand over.
    Drain,
    /// Mark the server down.
    Down(DownReason),
}

impl AgentReply {
    /// The reply for a pool with this capacity. Draining and stopping win
    /// over everything else.
    pub fn for_capacity(capacity: &Capacity) -> AgentReply {
        match capacity.phase {
            Phase::Draining | Phase::Stopping => AgentReply::Drain,
            Phase::Starting => AgentReply::Down(DownReason::Starting),
            Phase::Serving if !capacity.can_take_work() => {
                AgentReply::Down(DownReason::NoReadyChild)
            }
            Phase::Serving => AgentReply::Ready {
                weight_percent: weight_percent(capacity),
            },
        }
    }

    /// The exact line to write to HAProxy, newline included.
    pub fn line(&self) -> String {
        format!("{self}\n")
    }
}

impl fmt::Display for AgentReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AgentReply::Ready { weight_percent } => write!(f, "up ready {weight_percent}%"),
            AgentReply::Drain => f.write_str("drain"),
            AgentReply::Down(DownReason::Starting) => f.write_str("down #starting"),
            AgentReply::Down(DownReason::NoReadyChild) => f.write_str("down #no ready child"),
        }
    }
}

/// Spare capacity as a percentage of `max_children`, rounded up, between
/// 1 and 100, and 100 only when every child is free (see the module docs
/// for why the floor is 1).
pub fn weight_percent(capacity: &Capacity) -> u8 {
    let max = u64::from(capacity.max_children);
    if max == 0 {
        return 1;
    }
    let spare = u64::from(capacity.spare());
    let percent = if spare >= max {
        100
    } else {
        // Rounded up, but a pool with one child taken is not "all free".
        (spare * 100).div_ceil(max).clamp(1, 99)
    };
    u8::try_from(percent).expect("clamped to 100")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::tests::serving;
    use proptest::prelude::*;

    fn reply(c: Capacity) -> String {
        AgentReply::for_capacity(&c).line()
    }

    #[test]
    fn an_idle_pool_reports_full_weight() {
        assert_eq!(reply(serving(4, 0, 4)), "up ready 100%\n");
        // Scaled to zero with all the room in the world: full weight too.
        assert_eq!(reply(serving(0, 0, 4)), "up ready 100%\n");
    }

    #[test]
    fn weight_follows_spare_capacity() {
        assert_eq!(reply(serving(1, 3, 4)), "up ready 25%\n");
        assert_eq!(reply(serving(0, 2, 4)), "up ready 50%\n");
        // 2 idle plus room for 2 more, of 10.
        assert_eq!(reply(serving(2, 6, 10)), "up ready 40%\n");
    }

    /// Kernel dispatch: every child held by a young reservation or busy,
    /// and connections in the overflow: the balancer hears the pool is
    /// full, not that its reserved children are free.
    #[test]
    fn connections_waiting_for_a_child_take_spare_places() {
        let full = Capacity {
            waiting: 4,
            ..serving(0, 4, 4)
        };
        assert_eq!(reply(full), "up ready 1%\n");
        let growing = Capacity {
            waiting: 2,
            ..serving(0, 2, 8)
        };
        assert_eq!(reply(growing), "up ready 50%\n");
    }

    #[test]
    fn weight_rounds_up() {
        // 1 spare of 3 is 33.3%: 34.
        assert_eq!(reply(serving(1, 2, 3)), "up ready 34%\n");
        // 1 spare of 1000 is 0.1%: still 1, not 0.
        assert_eq!(reply(serving(1, 999, 1000)), "up ready 1%\n");
        // 999 spare of 1000 rounds up to 100, but one child is busy: 99.
        assert_eq!(reply(serving(999, 1, 1000)), "up ready 99%\n");
    }

    #[test]
    fn a_saturated_pool_keeps_the_floor() {
        assert_eq!(reply(serving(0, 4, 4)), "up ready 1%\n");
    }

    #[test]
    fn starting_children_are_not_spare() {
        let c = Capacity {
            starting: 2,
            waiting: 0,
            ..serving(0, 2, 4)
        };
        assert_eq!(reply(c), "up ready 1%\n");
    }

    #[test]
    fn draining_and_stopping_say_drain() {
        for phase in [Phase::Draining, Phase::Stopping] {
            let c = Capacity {
                phase,
                ..serving(4, 0, 4)
            };
            assert_eq!(reply(c), "drain\n");
        }
    }

    #[test]
    fn starting_pool_is_down() {
        let c = Capacity {
            phase: Phase::Starting,
            starting: 2,
            waiting: 0,
            ..serving(0, 0, 4)
        };
        assert_eq!(reply(c), "down #starting\n");
    }

    #[test]
    fn no_child_and_none_coming_is_down() {
        let c = Capacity {
            spawn_held_back: true,
            ..serving(0, 0, 4)
        };
        assert_eq!(reply(c), "down #no ready child\n");
        // One ready child is enough to keep serving, held back or not.
        let c = Capacity {
            spawn_held_back: true,
            ..serving(0, 1, 4)
        };
        assert_eq!(reply(c), "up ready 1%\n");
    }

    #[test]
    fn a_zero_ceiling_does_not_divide_by_zero() {
        assert_eq!(weight_percent(&serving(0, 0, 0)), 1);
    }

    fn phase() -> impl Strategy<Value = Phase> {
        prop_oneof![
            Just(Phase::Starting),
            Just(Phase::Serving),
            Just(Phase::Draining),
            Just(Phase::Stopping),
        ]
    }

    prop_compose! {
        fn capacity()(
            idle in 0u32..300,
            busy in 0u32..300,
            starting in 0u32..50,
            waiting in prop_oneof![Just(0u32), 0u32..400],
            max_children in 0u32..300,
            spawn_held_back in any::<bool>(),
            phase in phase(),
        ) -> Capacity {
            Capacity { idle, busy, starting, waiting, max_children, spawn_held_back, phase }
        }
    }

    proptest! {
        /// Connections that wait for a child never raise the weight.
        #[test]
        fn waiting_connections_never_raise_the_weight(c in capacity(), more in 1u32..50) {
            let busier = Capacity { waiting: c.waiting + more, ..c };
            prop_assert!(weight_percent(&busier) <= weight_percent(&c));
        }

        #[test]
        fn weight_is_always_between_1_and_100(c in capacity()) {
            let w = weight_percent(&c);
            prop_assert!((1..=100).contains(&w), "{w} for {c:?}");
        }

        #[test]
        fn weight_is_monotone_in_spare_capacity(c in capacity(), more in 1u32..50) {
            // A busy child that becomes idle, or a higher ceiling, never
            // lowers the weight.
            let freed = more.min(c.busy);
            let freer = Capacity { idle: c.idle + freed, busy: c.busy - freed, ..c };
            prop_assert!(weight_percent(&freer) >= weight_percent(&c));
            let roomier = Capacity { max_children: c.max_children + more, ..c };
            prop_assert!(c.spare() <= roomier.spare());
            let a = Capacity { max_children: 100, ..c };
            let b = Capacity { max_children: 100, idle: c.idle + more, ..c };
            prop_assert!(weight_percent(&b) >= weight_percent(&a));
        }

        #[test]
        fn full_weight_only_with_every_child_free(c in capacity()) {
            if c.max_children > 0 && weight_percent(&c) == 100 {
                prop_assert_eq!(c.spare(), c.max_children);
            }
        }

        #[test]
        fn drain_wins(c in capacity()) {
            for phase in [Phase::Draining, Phase::Stopping] {
                let c = Capacity { phase, ..c };
                prop_assert_eq!(AgentReply::for_capacity(&c), AgentReply::Drain);
            }
        }

        #[test]
        fn a_pool_that_can_take_work_is_never_down_when_serving(c in capacity()) {
            let c = Capacity { phase: Phase::Serving, ..c };
            let r = AgentReply::for_capacity(&c);
            prop_assert_eq!(matches!(r, AgentReply::Ready { .. }), c.can_take_work());
        }

        #[test]
        fn the_line_is_one_line_of_known_words(c in capacity()) {
            let line = AgentReply::for_capacity(&c).line();
            prop_assert!(line.ends_with('\n'));
            let words = line.trim_end().split('#').next().unwrap_or("");
            prop_assert!(!line.trim_end().contains('\n'));
            for word in words.split_whitespace() {
                let known = ["up", "ready", "drain", "down"].contains(&word)
                    || word
                        .strip_suffix('%')
                        .is_some_and(|n| n.parse::<u8>().is_ok_and(|n| (1..=100).contains(&n)));
                prop_assert!(known, "unexpected word {word:?} in {line:?}");
            }
        }
    }
}
