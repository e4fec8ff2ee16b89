//! The dispatch width: how many of the pool's children new connections
//! go to, as a rule with no I/O.
//!
//! The scaling policy's hold (`policy/scaling.rs`) stops the pool from
//! forking a child more while the busy ones already wait for the CPUs.
//! An idle child that exists is no better: given a connection, it too
//! takes turns on the same CPUs, each child runs slower for the switching
//! and for the caches the others evict, and a child that slept since its
//! last connection starts with its code and data out of them. Measured
//! on 2 CPUs with 16 clients, a Rack app's preloaded children cost 2.5
//! times the CPU a connection when each connection woke one of 16 than
//! when 3 of them took turn after turn (docs/benchmarks/history.md,
//! *The dispatch width*).
//!
//! So in `kernel` dispatch the pool has a **width**: the lowest children
//! that new connections go to. The others stay idle and ready, kept for
//! a load that sleeps (a database, a slow client) rather than computes.
//! The supervisor turns the width into a slot bound for the kernel's
//! program (the scoreboard's word 5), which then sends what finds no idle
//! child within it to the overflow; the children within it take those as
//! they finish their own, without sleeping in between.
//!
//! [`Width::steer`] moves it, each time the supervisor looks at the pool:
//! - **narrower** when a look at the busy children finds them waiting for
//!   the CPUs ([`CPU_WAIT_HOLD`]: one per CPU on average, the pool's hold):
//!   half the way down to [`floor`] (one child more than CPUs) per look,
//!   so 16 children come down to 3 in four looks (80 ms);
//! - **wider** when connections wait with no idle child within it and
//!   there are children beyond it, as far as the scaling policy would
//!   grow the pool at that moment: by the connections waiting while the
//!   CPUs are free (no look yet because fewer children are busy than
//!   CPUs, or a look below [`CPU_WAIT_CAREFUL`]), by one child per look
//!   while they fill up or the busy children serve long requests
//!   ([`CpuUse::Stalled`]), not at all while the CPUs hold the pool or
//!   are being measured;
//! - **all of them** again once no connection has waited and fewer
//!   children than CPUs were busy for [`RELAX_AFTER`]: after a quiet
//!   second a pool dispatches as it did before any load; and at once when
//!   connections last [`LONG_CONNECTION`] or more on average while their
//!   children do not compute all along (kept-alive clients between their
//!   requests; the shell asks two looks in a row), which never narrow it.
//!   Long connections whose children use or want a CPU nearly all the
//!   time ([`WORKING`]: a spam check, a report, a request that computes
//!   for 100 ms) do narrow it: each is one piece of work, and fewer of
//!   them taking turns on the CPUs finish sooner.
//!
//! The width counts children that serve (idle or busy), not slots: one
//! starting or leaving does not count, and a reload's new children come
//! into it as the old leave.

use std::time::{Duration, Instant};

use crate::scaling::{CpuUse, CPU_WAIT_CAREFUL, CPU_WAIT_HOLD};

/// Connections that last this long on average are not narrowed for:
/// kept-alive clients hold their children, and a width narrower than them
/// would make them take turns on fewer children (with 20 ms turns, 64
/// kept-alive clients waited 370 ms at the 99th percentile on 3 children,
/// 61 ms on 16), for a gain that only short connections get (a child
/// woken cold costs tens of microseconds, nothing beside a long one).
pub(crate) const LONG_CONNECTION: Duration = Duration::from_millis(10);

/// The share of their time (thousandths) the busy children must use or
/// want a CPU between two looks for their long connections to count as
/// work rather than clients holding children: three quarters. Measured
/// on 2 CPUs at each look, forkpool-spamd under 16 spamc clients on 16
/// children (a connection a message, 65-90 ms of CPU each) read 840 at
/// the lowest, 932 at the tenth percentile, 989 at the median; preloaded
/// Rack under 64 and 16 kept-alive wrk clients 335 and 277 at the median,
/// 491 and 416 at the ninetieth percentile (the children wait for the
/// client's next request). Narrowed to 3, the spam checks served 25
/// messages a second where 16 children served 21.5, at 75 ms of CPU a
/// message instead of 88, and p99 750 ms instead of 950.
pub(crate) const WORKING: u32 = 750;

/// How long a narrowed pool must be quiet (nothing waiting, fewer
/// children busy than CPUs) before every child takes connections again.
pub(crate) const RELAX_AFTER: Duration = Duration::from_secs(1);

/// The narrowest width for `cpus` CPUs: a child per CPU and one more,
/// so a child between two connections, or blocked on a write for a
/// moment, leaves no CPU without work.
pub(crate) fn floor(cpus: u32) -> u32 {
    cpus.max(1).saturating_add(1)
}

/// What the rule sees of the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WidthCounts {
    /// Children that serve: idle or busy (not starting, not leaving).
    pub serving: u32,
    /// Children busy, in the whole pool.
    pub busy: u32,
    /// Connections waiting with no idle child within the width to take
    /// them (0 while one is there).
    pub queued: u32,
    /// How the busy children use the CPUs, as the scaling policy sees it
    /// (with the watch's memory of full looks).
    pub cpu: CpuUse,
    /// The last look's own finding, not remembered over: when it was, and
    /// how many busy children waited for a CPU per CPU, in thousandths.
    pub last_look: Option<(Instant, u32)>,
    /// The CPUs the pool may use.
    pub cpus: u32,
    /// What the connections begun lately were like (at the last looks).
    pub turnover: Turnover,
}

/// What the connections begun since the shell's last look were like.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Turnover {
    /// They lasted [`LONG_CONNECTION`] or more on average.
    pub long: bool,
    /// Their busy children used or wanted a CPU [`WORKING`] of the time.
    pub working: bool,
    /// The share of their time they did, at the last look that measured
    /// it (thousandths).
    pub wanted: u32,
}

impl Turnover {
    /// From `busy` children at the end of `elapsed`, and the connections
    /// `begun` in it (Little's law), and the share of their time the busy
    /// children used or wanted a CPU, in thousandths (`None`: not
    /// measured).
    pub fn of(busy: u32, elapsed: Duration, begun: u64, wanted: Option<u32>) -> Turnover {
        Turnover {
            long: busy > 0
                && u128::from(busy) * elapsed.as_nanos()
                    >= u128::from(begun) * LONG_CONNECTION.as_nanos(),
            working: wanted.is_some_and(|share| share >= WORKING),
            wanted: wanted.unwrap_or(0),
        }
    }

    /// Both of two looks in a row: what one look alone says may be the
    /// tail of a load, or a moment when every kept-alive child computed.
    pub fn and(self, other: Turnover) -> Turnover {
        Turnover {
            long: self.long && other.long,
            working: self.working && other.working,
            wanted: self.wanted,
        }
    }

    /// Whether `busy` children that use or want a CPU as these connections'
    /// did leave part of `cpus` CPUs without work.
    fn leaves_cpus_free(&self, busy: u32, cpus: u32) -> bool {
        u64::from(busy) * u64::from(self.wanted) < u64::from(cpus) * 1000
    }

    /// The connections hold their children beyond their work: long, and
    /// not computing all along. A width would make them take turns.
    pub fn holds_children(&self) -> bool {
        self.long && !self.working
    }

    /// Each connection is one long piece of work: long, and its child
    /// computes all along (a spam check, a report).
    pub fn works(&self) -> bool {
        self.long && self.working
    }
}

/// Which way a call moved the width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WidthMove {
    /// It stayed.
    Stayed,
    /// It grew (or covers every child again): the CPUs' use must be
    /// measured afresh before it grows by one more.
    Widened,
    /// It shrank.
    Narrowed,
}

/// The width and what the rule remembers between calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Width {
    /// Children new connections go to; `None`: all of them.
    children: Option<u32>,
    /// The look the last narrowing acted on (one narrowing per look).
    narrowed_on: Option<Instant>,
    /// Since when the pool has been quiet, while narrowed.
    calm_since: Option<Instant>,
}

impl Width {
    /// The width: `None` while every child takes connections.
    pub fn children(&self) -> Option<u32> {
        self.children
    }

    /// Every child takes connections (the rule is off).
    pub fn open(&mut self) -> WidthMove {
        *self = Width::default();
        WidthMove::Stayed
    }

    /// Moves the width by what the pool shows at `now` (see the module
    /// docs for the rules).
    pub fn steer(&mut self, counts: WidthCounts, now: Instant) -> WidthMove {
        let floor = floor(counts.cpus);
        let current = self.children.unwrap_or(counts.serving).min(counts.serving);
        if counts.turnover.holds_children() {
            let opened = self.children.is_some();
            *self = Width::default();
            return if opened {
                WidthMove::Widened
            } else {
                WidthMove::Stayed
            };
        }
        if let Some((at, per_cpu)) = counts.last_look {
            let new_look = self.narrowed_on.is_none_or(|n| at > n);
            if per_cpu >= CPU_WAIT_HOLD && new_look && current > floor {
                self.children = Some(floor + (current - floor) / 2);
                self.narrowed_on = Some(at);
                self.calm_since = None;
                return WidthMove::Narrowed;
            }
        }
        let Some(width) = self.children else {
            return WidthMove::Stayed;
        };
        if counts.queued > 0 && width < counts.serving {
            let by = match counts.cpu {
                // The busy children compute all along: a child more would
                // take turns with them, unless a CPU has none (as many as
                // wait) or what they want leaves part of one (one child).
                _ if counts.turnover.works() && counts.cpu.holds() => 0,
                _ if counts.turnover.works() && counts.busy < counts.cpus => counts.queued,
                _ if counts.turnover.works() => {
                    let free = (counts.turnover).leaves_cpus_free(counts.busy, counts.cpus);
                    u32::from(free)
                }
                CpuUse::NotLooked => counts.queued,
                CpuUse::Waiting(per_cpu) if per_cpu < CPU_WAIT_CAREFUL => counts.queued,
                CpuUse::Waiting(per_cpu) if per_cpu < CPU_WAIT_HOLD => 1,
                CpuUse::Stalled => 1,
                CpuUse::Waiting(_) | CpuUse::Measuring => 0,
            };
            if by > 0 {
                let wider = width.saturating_add(by);
                self.children = (wider < counts.serving).then_some(wider);
                self.calm_since = None;
                return WidthMove::Widened;
            }
        }
        if counts.queued == 0 && counts.busy < counts.cpus {
            let since = *self.calm_since.get_or_insert(now);
            if now.saturating_duration_since(since) >= RELAX_AFTER {
                *self = Width::default();
                return WidthMove::Widened;
            }
        } else {
            self.calm_since = None;
        }
        WidthMove::Stayed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn counts(serving: u32, queued: u32, cpu: CpuUse) -> WidthCounts {
        WidthCounts {
            serving,
            busy: serving,
            queued,
            cpu,
            last_look: None,
            cpus: 2,
            turnover: Turnover::default(),
        }
    }

    fn looked(at: Instant, per_cpu: u32) -> WidthCounts {
        WidthCounts {
            last_look: Some((at, per_cpu)),
            ..counts(16, 0, CpuUse::Waiting(per_cpu))
        }
    }

    #[test]
    fn children_that_wait_for_the_cpus_narrow_it_by_halves_one_look_at_a_time() {
        let t0 = Instant::now();
        let mut width = Width::default();
        let mut seen = Vec::new();
        for look in 0..6 {
            let at = t0 + 20 * MS * look;
            assert_ne!(width.steer(looked(at, 3_000), at), WidthMove::Widened);
            // The same look again (an event between two looks) moves
            // nothing.
            assert_eq!(width.steer(looked(at, 3_000), at + MS), WidthMove::Stayed);
            seen.push(width.children());
        }
        assert_eq!(
            seen,
            [Some(9), Some(6), Some(4), Some(3), Some(3), Some(3)],
            "from 16 halfway to 3 (2 CPUs + 1) each look, never below"
        );
    }

    #[test]
    fn a_look_below_the_hold_does_not_narrow_it() {
        let t0 = Instant::now();
        let mut width = Width::default();
        assert_eq!(
            width.steer(looked(t0, CPU_WAIT_HOLD - 1), t0),
            WidthMove::Stayed
        );
        assert_eq!(width.children(), None);
        // Nor does a pool already at the floor.
        let mut small = Width::default();
        let at_floor = WidthCounts {
            serving: 3,
            ..looked(t0, 5_000)
        };
        assert_eq!(small.steer(at_floor, t0), WidthMove::Stayed);
    }

    fn narrowed_to_3() -> (Width, Instant) {
        let t0 = Instant::now();
        let mut width = Width::default();
        for look in 0..4 {
            let at = t0 + 20 * MS * look;
            width.steer(looked(at, 3_000), at);
        }
        assert_eq!(width.children(), Some(3));
        (width, t0 + 100 * MS)
    }

    #[test]
    fn waiting_connections_widen_it_as_far_as_the_cpus_allow() {
        let cases = [
            // The CPUs are free: as many as wait.
            (CpuUse::NotLooked, Some(8)),
            (CpuUse::Waiting(0), Some(8)),
            (CpuUse::Waiting(CPU_WAIT_CAREFUL - 1), Some(8)),
            // Filling up, or behind long requests: one child.
            (CpuUse::Waiting(CPU_WAIT_CAREFUL), Some(4)),
            (CpuUse::Stalled, Some(4)),
            // Held, or being measured: not at all.
            (CpuUse::Waiting(CPU_WAIT_HOLD), Some(3)),
            (CpuUse::Measuring, Some(3)),
        ];
        for (cpu, expected) in cases {
            let (mut width, now) = narrowed_to_3();
            let moved = width.steer(counts(16, 5, cpu), now);
            assert_eq!(width.children(), expected, "{cpu:?}");
            let widened = expected != Some(3);
            assert_eq!(moved == WidthMove::Widened, widened, "{cpu:?}");
        }
        // Past the children there are, it is every child.
        let (mut width, now) = narrowed_to_3();
        width.steer(counts(16, 40, CpuUse::Waiting(0)), now);
        assert_eq!(width.children(), None);
        // Nothing waiting: nothing to widen for.
        let (mut width, now) = narrowed_to_3();
        assert_eq!(
            width.steer(counts(16, 0, CpuUse::Waiting(0)), now),
            WidthMove::Stayed
        );
        assert_eq!(width.children(), Some(3));
    }

    #[test]
    fn a_quiet_second_gives_every_child_connections_again() {
        let (mut width, now) = narrowed_to_3();
        let quiet = WidthCounts {
            busy: 1,
            ..counts(16, 0, CpuUse::NotLooked)
        };
        assert_eq!(width.steer(quiet, now), WidthMove::Stayed);
        assert_eq!(
            width.steer(quiet, now + RELAX_AFTER - MS),
            WidthMove::Stayed
        );
        // Two busy children (as many as CPUs) interrupt the quiet.
        let busier = WidthCounts { busy: 2, ..quiet };
        assert_eq!(width.steer(busier, now + RELAX_AFTER), WidthMove::Stayed);
        assert_eq!(width.children(), Some(3));
        let later = now + RELAX_AFTER + MS;
        assert_eq!(width.steer(quiet, later), WidthMove::Stayed);
        assert_eq!(width.steer(quiet, later + RELAX_AFTER), WidthMove::Widened);
        assert_eq!(width.children(), None);
    }

    #[test]
    fn long_connections_open_it_and_never_narrow_it() {
        let (mut width, now) = narrowed_to_3();
        let long = WidthCounts {
            turnover: Turnover {
                long: true,
                working: false,
                wanted: 300,
            },
            ..looked(now, 5_000)
        };
        assert_eq!(width.steer(long, now), WidthMove::Widened);
        assert_eq!(width.children(), None);
        assert_eq!(width.steer(long, now + 20 * MS), WidthMove::Stayed);
        assert_eq!(
            width.children(),
            None,
            "the CPUs taken, but kept-alive clients"
        );
    }

    #[test]
    fn long_connections_whose_children_compute_all_along_narrow_it() {
        let working = Turnover {
            long: true,
            working: true,
            wanted: 1000,
        };
        // Looks 20 ms apart that find the CPUs taken.
        let looks = |n: u32| {
            let t0 = Instant::now();
            let mut width = Width::default();
            let mut seen = Vec::new();
            for look in 0..n {
                let at = t0 + 20 * MS * look;
                let counts = WidthCounts {
                    turnover: working,
                    ..looked(at, 3_000)
                };
                width.steer(counts, at);
                seen.push(width.children());
            }
            (width, seen, t0)
        };
        let (mut width, seen, t0) = looks(5);
        assert_eq!(
            seen,
            [Some(9), Some(6), Some(4), Some(3), Some(3)],
            "spam checks, one a connection: as short ones"
        );
        // Connections waiting widen it only while a CPU has no busy
        // child: three that compute on 2 CPUs take turns enough.
        let at = t0 + 90 * MS;
        for cpu in [
            CpuUse::Waiting(500),
            CpuUse::Waiting(0),
            CpuUse::Stalled,
            CpuUse::Measuring,
        ] {
            let waiting = WidthCounts {
                busy: 3,
                turnover: working,
                ..counts(16, 5, cpu)
            };
            assert_eq!(width.steer(waiting, at), WidthMove::Stayed, "{cpu:?}");
            assert_eq!(width.children(), Some(3));
        }
        let a_cpu_free = WidthCounts {
            busy: 1,
            turnover: working,
            ..counts(16, 5, CpuUse::NotLooked)
        };
        assert_eq!(width.steer(a_cpu_free, at), WidthMove::Widened);
        assert_eq!(width.children(), Some(8));
        // Five busy on 4 CPUs: wanting 800 of their time, they want all
        // 4; wanting 760, 3.8 of them, and part of one is free.
        let (mut width, now) = narrowed_to_3();
        let part = |wanted| WidthCounts {
            busy: 5,
            cpus: 4,
            turnover: Turnover { wanted, ..working },
            ..counts(16, 5, CpuUse::Waiting(300))
        };
        assert_eq!(width.steer(part(800), now), WidthMove::Stayed);
        assert_eq!(width.steer(part(760), now), WidthMove::Widened);
        assert_eq!(width.children(), Some(4), "one child at a time");
        let (mut width, _, t0) = looks(4);
        // The same connections, once their children sleep between
        // requests: every child again.
        let held = WidthCounts {
            turnover: Turnover {
                long: true,
                working: false,
                wanted: 300,
            },
            ..looked(t0 + 100 * MS, 3_000)
        };
        assert_eq!(width.steer(held, t0 + 100 * MS), WidthMove::Widened);
        assert_eq!(width.children(), None);
    }

    #[test]
    fn working_takes_three_quarters_of_the_busy_childrens_time() {
        let look = 20 * MS;
        let of = |share| Turnover::of(16, look, 16, share);
        assert!(of(Some(WORKING)).working);
        assert!(of(Some(989)).working, "spamd's median");
        assert!(!of(Some(WORKING - 1)).working);
        assert!(!of(Some(491)).working, "kept-alive Rack's 90th percentile");
        assert!(!of(None).working, "not measured is not working");
        assert!(!of(Some(1000)).holds_children());
        assert!(of(Some(300)).holds_children());
        // Short connections hold nothing, whatever their children do.
        assert!(!Turnover::of(3, look, 600, Some(300)).holds_children());
        // Two looks: both must say it.
        let (w, h) = (of(Some(1000)), of(Some(300)));
        assert_eq!(w.and(w), w);
        assert!(w.and(h).holds_children() && h.and(w).holds_children());
        let short = Turnover::of(3, look, 600, Some(1000));
        assert!(!short.and(w).long && short.and(w).working);
    }

    #[test]
    fn turnover_by_littles_law() {
        let look = 20 * MS;
        // 3 busy, 600 begun in 20 ms: 0.1 ms each. Short.
        assert!(!Turnover::of(3, look, 600, None).long);
        // 16 busy, 16 begun in 20 ms (kept alive, 20 ms turns): long.
        assert!(Turnover::of(16, look, 16, None).long);
        assert!(Turnover::of(16, look, 32, None).long, "10 ms is long");
        assert!(!Turnover::of(16, look, 33, None).long);
        // None busy: nothing lasts. Busy and none begun: long.
        assert!(!Turnover::of(0, look, 0, None).long);
        assert!(Turnover::of(1, look, 0, None).long);
    }

    #[test]
    fn the_floor_is_a_child_more_than_cpus() {
        assert_eq!(floor(0), 2);
        assert_eq!(floor(1), 2);
        assert_eq!(floor(2), 3);
        assert_eq!(floor(64), 65);
        assert_eq!(floor(u32::MAX), u32::MAX);
    }

    #[test]
    fn a_pool_with_fewer_children_than_the_width_narrows_from_what_it_has() {
        let t0 = Instant::now();
        let mut width = Width::default();
        width.steer(looked(t0, 3_000), t0);
        assert_eq!(width.children(), Some(9));
        // Children left (a reload, deaths): 5 serve; the next look halves
        // from 5, not from 9.
        let fewer = WidthCounts {
            serving: 5,
            ..looked(t0 + 20 * MS, 3_000)
        };
        width.steer(fewer, t0 + 20 * MS);
        assert_eq!(width.children(), Some(4));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn cpu_use() -> impl Strategy<Value = CpuUse> {
            prop_oneof![
                Just(CpuUse::NotLooked),
                Just(CpuUse::Measuring),
                Just(CpuUse::Stalled),
                (0u32..4_000).prop_map(CpuUse::Waiting),
            ]
        }

        proptest! {
            /// Whatever the pool shows, in any order: a width is never
            /// below the floor, never grows while nothing waits (but for
            /// the quiet second), never shrinks without a new look that
            /// found the CPUs taken, and never covers every child while
            /// claiming to be narrower.
            #[test]
            fn the_width_keeps_its_rules(
                steps in proptest::collection::vec(
                    (1u32..40, 0u32..40, 0u32..6, cpu_use(), 0u32..4_000, any::<bool>(), 0u64..300, (0u8..8, any::<bool>())),
                    1..80,
                ),
                cpus in 1u32..5,
            ) {
                let t0 = Instant::now();
                let mut now = t0;
                let mut width = Width::default();
                let mut look_at = t0;
                for (serving, busy, queued, cpu, per_cpu, new_look, gap, (long, working)) in steps {
                    let turnover = Turnover { long: long == 0, working, wanted: per_cpu / 4 };
                    let long_connections = turnover.holds_children();
                    now += MS * gap as u32;
                    if new_look {
                        look_at = now;
                    }
                    let before = width;
                    let counts = WidthCounts {
                        serving,
                        busy: busy.min(serving),
                        queued,
                        cpu,
                        last_look: Some((look_at, per_cpu)),
                        cpus,
                        turnover,
                    };
                    let moved = width.steer(counts, now);
                    let (was, is) = (before.children(), width.children());
                    if let Some(w) = is {
                        prop_assert!(w >= floor(cpus), "{w} below the floor");
                        prop_assert!(w < serving.max(floor(cpus) + 1) || was == is);
                    }
                    let narrower = match (was, is) {
                        (None, Some(_)) => true,
                        (Some(a), Some(b)) => b < a,
                        _ => false,
                    };
                    let wider = match (was, is) {
                        (Some(_), None) => true,
                        (Some(a), Some(b)) => b > a,
                        _ => false,
                    };
                    prop_assert_eq!(narrower, moved == WidthMove::Narrowed);
                    if long_connections {
                        prop_assert_eq!(is, None, "long connections, yet a width");
                    }
                    if narrower {
                        prop_assert!(per_cpu >= CPU_WAIT_HOLD);
                        prop_assert!(before.narrowed_on.is_none_or(|n| look_at > n));
                    }
                    if wider {
                        prop_assert_eq!(moved, WidthMove::Widened);
                        if turnover.works() && is.is_some() {
                            let wanted = u64::from(busy.min(serving)) * u64::from(turnover.wanted);
                            prop_assert!(wanted < u64::from(cpus) * 1000, "widened beside working children");
                        }
                        let relaxed = is.is_none() && (queued == 0 || long_connections);
                        prop_assert!(queued > 0 || relaxed, "widened with nothing waiting");
                        prop_assert!(!cpu.holds() || relaxed, "widened while the CPUs hold");
                    }
                }
            }
        }
    }
}
