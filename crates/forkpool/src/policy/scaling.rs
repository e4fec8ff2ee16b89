//! The scaling policy: how many children there should be.
//!
//! [`decide`] is a pure function of the pool's counts, its config, the time
//! and a little memory ([`ScalingMemory`]) that carries the spawn-rate ramp
//! and the start of a surplus from one call to the next. It does no I/O; the
//! supervisor calls it after every state change and on a timer and carries
//! out what it returns.
//!
//! The rules, after Apache prefork's idle-server maintenance:
//! - fewer than `min_children` live children: start the missing ones at once;
//! - fewer spare children (idle plus starting) than `min_spare` plus the
//!   connections already waiting in the listen backlog: spawn, at most the
//!   current spawn rate, which doubles each round the pool stays short
//!   (1, 2, 4, ... `max_spawn_rate`) and falls back to 1 once it is not;
//! - never more than `max_children` live; short at the ceiling is
//!   [`Decision::Saturated`], which the supervisor logs once per interval;
//! - short, but the busy children already wait for the CPUs (on average
//!   one per CPU runnable but not running, [`CPU_WAIT_HOLD`]):
//!   [`Decision::CpuBound`], no spawn (with `hold_when_cpu_bound`). A
//!   child more would take turns with them on the same CPUs, and each
//!   would run slower for the switching and the caches they evict, while
//!   the connection can as well wait in the backlog for the next of them
//!   to finish (a finishing child takes it itself). Children blocked on a
//!   database, a slow client or a lock do not wait for a CPU: while they
//!   are what is busy, the pool grows as before. What they wait as they
//!   wake, behind the workers the pool is starting or another process,
//!   does not count either: a look counts the waiting only while the busy
//!   children use a quarter of the CPUs or more, and a look that found
//!   them asleep stands when the pool starts a child (`policy::cpu_wait`).
//!   Until the supervisor has measured it (two looks 5 ms apart once
//!   enough children are busy to fill the CPUs, [`CpuUse::Measuring`])
//!   the pool holds too, and while the CPUs fill up ([`CPU_WAIT_CAREFUL`])
//!   it grows one child at a time (and at any pace, unless the last look
//!   found the busy children asleep, the next spawn waits for a
//!   measurement made after the last: `policy::cpu_wait`): a burst's
//!   first moments would otherwise fork up to `max_children`, and nothing
//!   shrinks a pool whose children are all kept busy. A hold is only worth it while
//!   children finish connections: when none has for [`HOLD_TURNOVER`],
//!   the busy ones serve long requests ([`CpuUse::Stalled`]) and the pool
//!   grows one child at a time, so a short request never waits in the
//!   backlog behind seconds-long ones. With the hold on, no more children
//!   start at once than there are CPUs (`PoolCounts::start_limit`);
//! - more than `max_spare` idle with nothing queued, continuously for
//!   `retire_grace`: retire half the surplus, rounded up (never below
//!   `min_children`), then start timing a fresh grace period. Shedding it
//!   in halves rather than all at once keeps a load that swings between
//!   bursts from retiring dozens of children only to fork them again a
//!   moment later (Apache and php-fpm retire one a second; halving gets a
//!   large surplus down in a few periods).
//!
//! Unlike Apache, rounds are not once a second: a round is every call, so a
//! burst of load grows the pool in milliseconds, and the grace period alone
//! keeps a bursty load from making it flap.
//!
//! # Children that serve many connections
//!
//! When each child holds up to `sessions_per_child` connections, what is
//! spare is *capacity*, not children. The supervisor counts the free places
//! of its serving children and [`in_child_equivalents`] turns them into
//! whole children before asking [`decide`]: `idle` is the free places
//! divided by `sessions_per_child`, rounded down, and `busy` is the rest of
//! the serving children, so `live` still counts real processes. So
//! `min_spare` and `max_spare` keep their meaning, in units of one child's
//! worth of places:
//! - `min_spare = 2` with 100 sessions per child keeps at least 200 free
//!   places: with 199, a child is started;
//! - `max_spare = 8` allows up to 899 free places; from 900 on, children
//!   holding no connection at all are retired, highest slot first (a child
//!   with a connection open is never retired for being surplus, so the
//!   free places of half-empty children can exceed the band for a while);
//! - connections queued in the backlog count in whole children too,
//!   rounded up.

use std::time::{Duration, Instant};

use crate::config::PoolConfig;

/// What the pool looks like now, as far as scaling cares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolCounts {
    /// Children forked but not yet ready.
    pub starting: u32,
    /// Children waiting for work.
    pub idle: u32,
    /// Children serving a connection.
    pub busy: u32,
    /// Connections waiting in the listen backlog (0 when unknown).
    pub queued: u32,
    /// How the busy children use the CPUs, as far as the supervisor knows.
    pub cpu: CpuUse,
    /// How many children may be starting at once beyond `min_children`
    /// (0: no bound). With `hold_when_cpu_bound`, the CPUs: a child that
    /// loads a large app as it starts (an exec'd Python or Perl worker
    /// without `--preload`) takes a CPU for hundreds of milliseconds, and
    /// more of them at once only make each ready later while they take the
    /// CPUs from the busy ones.
    pub start_limit: u32,
}

/// Busy children waiting for a CPU, per CPU, in thousandths, from which
/// the pool holds: on average one child queued behind the one running on
/// each CPU. The pool then keeps every CPU busy with a turn to spare, and
/// a child more would only lengthen the queues.
pub const CPU_WAIT_HOLD: u32 = 1000;

/// From this much waiting per CPU (thousandths) the CPUs are filling up:
/// the pool grows one child at a time, each measured before the next.
/// Below it the children wait on something else, and the pool grows at
/// its usual doubling pace.
pub const CPU_WAIT_CAREFUL: u32 = 250;

/// What the supervisor knows of how the busy children use the CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CpuUse {
    /// Not looked at: fewer children are busy than there are CPUs (they
    /// cannot fill them), or `hold_when_cpu_bound` is off.
    #[default]
    NotLooked,
    /// Enough children are busy to fill the CPUs; how much they wait for
    /// them is being measured.
    Measuring,
    /// How many busy children waited for a CPU, on average over the last
    /// look, per CPU, in thousandths.
    Waiting(u32),
    /// The busy children wait for the CPUs, but none has finished a
    /// connection for [`HOLD_TURNOVER`]: they serve long requests, and a
    /// connection held in the backlog would wait as long for one of them.
    /// The pool grows one child at a time instead of holding.
    Stalled,
}

/// How recently a child must have finished a connection for a hold to be
/// worth it. A hold makes waiting connections wait for the next busy child
/// to finish; with short requests one finishes every fraction of a
/// millisecond, but behind a few long ones (a report, an upload) a short
/// request would wait seconds for a child that a new one could give it
/// at once, sharing the CPUs.
pub const HOLD_TURNOVER: Duration = Duration::from_millis(50);

impl CpuUse {
    /// Whether growing should go one child at a time, each measured before
    /// the next.
    pub fn careful(&self) -> bool {
        match self {
            CpuUse::Waiting(per_cpu) => *per_cpu >= CPU_WAIT_CAREFUL,
            CpuUse::Stalled => true,
            CpuUse::NotLooked | CpuUse::Measuring => false,
        }
    }

    /// Whether the pool should not grow for now: its busy children wait for
    /// the CPUs, or it is being measured whether they do.
    pub fn holds(&self) -> bool {
        match self {
            CpuUse::NotLooked | CpuUse::Stalled => false,
            CpuUse::Measuring => true,
            CpuUse::Waiting(per_cpu) => *per_cpu >= CPU_WAIT_HOLD,
        }
    }
}

impl PoolCounts {
    /// Whether the CPUs hold the pool (see [`CpuUse::holds`]). Behind long
    /// requests ([`CpuUse::Stalled`]) the pool grows one child at a time:
    /// not while one is still starting, because a child loading a large
    /// app takes the CPUs from the busy ones as it starts, and the stall
    /// that causes would call for yet another child.
    pub fn cpu_holds(&self) -> bool {
        self.cpu.holds() || (self.cpu == CpuUse::Stalled && self.starting > 0)
    }

    /// Children that count against `max_children`.
    pub fn live(&self) -> u32 {
        self.starting + self.idle + self.busy
    }
}

/// What the supervisor should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Nothing.
    Hold,
    /// Start this many children.
    Spawn(u32),
    /// Retire this many idle children, highest-numbered first.
    Retire(u32),
    /// The pool is short of spare children but already at `max_children`.
    Saturated,
    /// The pool is short of spare children, but its busy children already
    /// wait for the CPUs (or it is measuring whether they do): it holds
    /// (see the module docs).
    CpuBound,
}

/// What [`decide`] remembers between calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScalingMemory {
    /// Children to start in the next round when short.
    pub spawn_rate: u32,
    /// When the current surplus of idle children began, if there is one.
    pub surplus_since: Option<Instant>,
}

impl Default for ScalingMemory {
    fn default() -> Self {
        ScalingMemory {
            spawn_rate: 1,
            surplus_since: None,
        }
    }
}

impl ScalingMemory {
    /// How long until a pending retirement could happen, if one could; the
    /// supervisor sets its timer by this so a grace period ends on time.
    pub fn retire_due_in(&self, config: &PoolConfig, now: Instant) -> Option<Duration> {
        self.surplus_since
            .map(|since| (since + config.retire_grace).saturating_duration_since(now))
    }
}

/// A pool of many-connection children counted in connections ("places").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlaceCounts {
    /// Children forked but not yet ready.
    pub starting: u32,
    /// Ready children that are not leaving, whatever their load.
    pub serving: u32,
    /// Connections those children could still be handed.
    pub free: u64,
    /// Connections waiting in the listen backlog (0 when unknown).
    pub queued: u32,
}

/// Counts a pool of many-connection children in whole children, for
/// [`decide`]: free places become idle children (rounded down), the other
/// serving children are busy, and queued connections become the children
/// needed to take them (rounded up). See the module docs.
pub fn in_child_equivalents(places: PlaceCounts, per_child: u32) -> PoolCounts {
    let per_child = per_child.max(1);
    let idle = (places.free / u64::from(per_child)).min(u64::from(places.serving)) as u32;
    PoolCounts {
        starting: places.starting,
        idle,
        busy: places.serving - idle,
        queued: places.queued.div_ceil(per_child),
        cpu: CpuUse::NotLooked,
        start_limit: 0,
    }
}

/// Decides what the pool should do now. See the module docs for the rules.
pub fn decide(
    counts: PoolCounts,
    config: &PoolConfig,
    memory: &mut ScalingMemory,
    now: Instant,
) -> Decision {
    let live = counts.live();
    let room = config.max_children.saturating_sub(live);

    if live < config.min_children {
        memory.surplus_since = None;
        return Decision::Spawn(config.min_children.min(config.max_children) - live);
    }

    let spare = counts.idle + counts.starting;
    let wanted = config.min_spare.saturating_add(counts.queued);
    if spare < wanted {
        memory.surplus_since = None;
        if room == 0 {
            return Decision::Saturated;
        }
        if config.hold_when_cpu_bound && counts.cpu_holds() {
            // When growth resumes it starts from one child again.
            memory.spawn_rate = 1;
            return Decision::CpuBound;
        }
        // The memory may come from before a reload that lowered the cap, and
        // the ramp must neither wrap (to 0, which would stall the pool for
        // good) nor overflow when the cap is near u32::MAX.
        let rate = memory.spawn_rate.clamp(1, config.max_spawn_rate);
        let rate = if config.hold_when_cpu_bound && counts.cpu.careful() {
            1
        } else {
            rate
        };
        let n = (wanted - spare).min(rate).min(room);
        let n = match counts.start_limit {
            0 => n,
            limit if counts.starting >= limit => return Decision::CpuBound,
            limit => n.min(limit - counts.starting),
        };
        memory.spawn_rate = rate.saturating_mul(2).min(config.max_spawn_rate);
        return Decision::Spawn(n);
    }
    memory.spawn_rate = 1;

    let surplus = counts
        .idle
        .saturating_sub(config.max_spare)
        .min(live.saturating_sub(config.min_children));
    if surplus == 0 || counts.queued > 0 {
        memory.surplus_since = None;
        return Decision::Hold;
    }
    let since = *memory.surplus_since.get_or_insert(now);
    if now.saturating_duration_since(since) < config.retire_grace {
        return Decision::Hold;
    }
    memory.surplus_since = None;
    Decision::Retire(surplus.div_ceil(2))
}

/// The policy for a pool whose children do not report (`none` dispatch):
/// it cannot tell idle from busy, so it keeps exactly `min_children`
/// and never retires. Restarting the ones that die is all it does.
pub fn fixed_size(counts: PoolCounts, config: &PoolConfig) -> Decision {
    let wanted = config.min_children.min(config.max_children);
    match wanted.checked_sub(counts.live()) {
        Some(missing) if missing > 0 => Decision::Spawn(missing),
        _ => Decision::Hold,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> PoolConfig {
        PoolConfig {
            min_children: 2,
            max_children: 10,
            min_spare: 2,
            max_spare: 4,
            ..PoolConfig::default()
        }
    }

    fn counts(starting: u32, idle: u32, busy: u32, queued: u32) -> PoolCounts {
        PoolCounts {
            starting,
            idle,
            busy,
            queued,
            cpu: CpuUse::NotLooked,
            start_limit: 0,
        }
    }

    fn with(mut counts: PoolCounts, cpu: CpuUse) -> PoolCounts {
        counts.cpu = cpu;
        counts
    }

    #[test]
    fn a_fixed_pool_only_replaces_what_is_missing() {
        let c = config();
        assert_eq!(fixed_size(counts(0, 0, 0, 0), &c), Decision::Spawn(2));
        assert_eq!(fixed_size(counts(0, 0, 1, 50), &c), Decision::Spawn(1));
        assert_eq!(fixed_size(counts(0, 0, 2, 50), &c), Decision::Hold);
        assert_eq!(fixed_size(counts(0, 0, 3, 0), &c), Decision::Hold);
    }

    #[test]
    fn a_pool_whose_busy_children_wait_for_the_cpus_holds() {
        let mut memory = ScalingMemory::default();
        let now = Instant::now();
        let short = counts(0, 0, 4, 6);
        let c = PoolConfig {
            hold_when_cpu_bound: true,
            ..config()
        };
        let waiting = |per_cpu| with(short, CpuUse::Waiting(per_cpu));
        assert_eq!(
            decide(waiting(CPU_WAIT_HOLD), &c, &mut memory, now),
            Decision::CpuBound
        );
        assert_eq!(
            decide(waiting(3000), &c, &mut memory, now),
            Decision::CpuBound
        );
        assert_eq!(
            decide(with(short, CpuUse::Measuring), &c, &mut memory, now),
            Decision::CpuBound
        );
        // Filling up: one child at a time, whatever the ramp says.
        memory.spawn_rate = 8;
        assert_eq!(
            decide(waiting(CPU_WAIT_HOLD - 1), &c, &mut memory, now),
            Decision::Spawn(1)
        );
        assert_eq!(
            decide(waiting(CPU_WAIT_CAREFUL), &c, &mut memory, now),
            Decision::Spawn(1)
        );
        // Children blocked on I/O leave the CPUs free: grow as before.
        memory.spawn_rate = 1;
        assert_eq!(
            decide(waiting(CPU_WAIT_CAREFUL - 1), &c, &mut memory, now),
            Decision::Spawn(1)
        );
        assert_eq!(decide(short, &c, &mut memory, now), Decision::Spawn(2));
        // The ramp starts again from one child after a hold.
        decide(waiting(3000), &c, &mut memory, now);
        assert_eq!(decide(short, &c, &mut memory, now), Decision::Spawn(1));
        // Long requests on the CPUs: no hold, one child at a time, and
        // the next only once the last has started.
        memory.spawn_rate = 8;
        assert_eq!(
            decide(with(short, CpuUse::Stalled), &c, &mut memory, now),
            Decision::Spawn(1)
        );
        assert_eq!(
            decide(
                with(counts(1, 0, 4, 6), CpuUse::Stalled),
                &c,
                &mut memory,
                now
            ),
            Decision::CpuBound
        );
        // No more starting at once than the start limit.
        memory.spawn_rate = 8;
        let starting = |n| PoolCounts {
            start_limit: 2,
            ..counts(n, 0, 4, 6)
        };
        assert_eq!(
            decide(starting(0), &c, &mut memory, now),
            Decision::Spawn(2)
        );
        assert_eq!(
            decide(starting(1), &c, &mut memory, now),
            Decision::Spawn(1)
        );
        assert_eq!(
            decide(starting(2), &c, &mut memory, now),
            Decision::CpuBound
        );
        // Not short: nothing to hold.
        assert_eq!(
            decide(
                with(counts(0, 3, 4, 0), CpuUse::Waiting(3000)),
                &c,
                &mut memory,
                now
            ),
            Decision::Hold
        );
    }

    #[test]
    fn a_cpu_bound_pool_still_gets_min_children_and_grows_unless_told_to_hold() {
        let mut memory = ScalingMemory::default();
        let now = Instant::now();
        let busy = with(counts(0, 0, 4, 6), CpuUse::Waiting(3000));
        let c = PoolConfig {
            min_children: 6,
            hold_when_cpu_bound: true,
            ..config()
        };
        assert_eq!(decide(busy, &c, &mut memory, now), Decision::Spawn(2));
        let grows = PoolConfig {
            hold_when_cpu_bound: false,
            ..config()
        };
        assert_eq!(decide(busy, &grows, &mut memory, now), Decision::Spawn(1));
    }

    #[test]
    fn empty_pool_starts_min_children_at_once() {
        let mut memory = ScalingMemory::default();
        let d = decide(counts(0, 0, 0, 0), &config(), &mut memory, Instant::now());
        assert_eq!(d, Decision::Spawn(2));
    }

    #[test]
    fn spawn_rate_doubles_while_short_and_resets() {
        let config = PoolConfig {
            max_children: 100,
            ..config()
        };
        let mut memory = ScalingMemory::default();
        let now = Instant::now();
        let busy_with_queue = counts(0, 0, 10, 50);
        let mut spawned = vec![];
        for _ in 0..7 {
            match decide(busy_with_queue, &config, &mut memory, now) {
                Decision::Spawn(n) => spawned.push(n),
                other => panic!("expected a spawn, got {other:?}"),
            }
        }
        assert_eq!(spawned, vec![1, 2, 4, 8, 16, 32, 32]);
        decide(counts(0, 3, 10, 0), &config, &mut memory, now);
        assert_eq!(memory.spawn_rate, 1);
    }

    #[test]
    fn the_ramp_survives_a_huge_spawn_rate_cap() {
        // Found by tests/scaling_properties.rs: with a cap above 2^31 the
        // 32nd short round doubled the rate past u32::MAX.
        let config = PoolConfig {
            max_children: 100,
            max_spawn_rate: u32::MAX,
            ..config()
        };
        let mut memory = ScalingMemory::default();
        let now = Instant::now();
        let short = counts(0, 0, 2, 1);
        for round in 0..40 {
            let wanted = 3u32.min(1 << round.min(31));
            let d = decide(short, &config, &mut memory, now);
            assert_eq!(d, Decision::Spawn(wanted), "round {round}");
        }
        assert_eq!(memory.spawn_rate, u32::MAX);
    }

    #[test]
    fn a_lowered_spawn_rate_cap_applies_at_once() {
        let mut memory = ScalingMemory {
            spawn_rate: 32,
            surplus_since: None,
        };
        let config = PoolConfig {
            max_children: 100,
            max_spawn_rate: 4,
            ..config()
        };
        let d = decide(counts(0, 0, 10, 50), &config, &mut memory, Instant::now());
        assert_eq!(d, Decision::Spawn(4));
        assert_eq!(memory.spawn_rate, 4);
    }

    #[test]
    fn starting_children_count_as_spare() {
        let mut memory = ScalingMemory::default();
        let d = decide(counts(2, 0, 4, 0), &config(), &mut memory, Instant::now());
        assert_eq!(d, Decision::Hold);
    }

    #[test]
    fn short_at_the_ceiling_is_saturated() {
        let mut memory = ScalingMemory::default();
        let d = decide(counts(0, 0, 10, 3), &config(), &mut memory, Instant::now());
        assert_eq!(d, Decision::Saturated);
    }

    #[test]
    fn surplus_waits_for_the_grace_period() {
        let config = config();
        let mut memory = ScalingMemory::default();
        let t0 = Instant::now();
        let c = counts(0, 7, 0, 0);
        assert_eq!(decide(c, &config, &mut memory, t0), Decision::Hold);
        let almost = t0 + config.retire_grace - Duration::from_millis(1);
        assert_eq!(decide(c, &config, &mut memory, almost), Decision::Hold);
        let after = t0 + config.retire_grace;
        assert_eq!(decide(c, &config, &mut memory, after), Decision::Retire(2));
    }

    #[test]
    fn a_large_surplus_is_shed_in_halves_one_grace_period_apart() {
        let config = PoolConfig {
            max_children: 64,
            ..config()
        };
        let mut memory = ScalingMemory::default();
        let mut idle = 60;
        let mut t = Instant::now();
        let mut steps = Vec::new();
        for _ in 0..10 {
            assert_eq!(
                decide(counts(0, idle, 0, 0), &config, &mut memory, t),
                Decision::Hold
            );
            t += config.retire_grace;
            match decide(counts(0, idle, 0, 0), &config, &mut memory, t) {
                Decision::Retire(n) => {
                    steps.push(n);
                    idle -= n;
                }
                Decision::Hold => break,
                other => panic!("{other:?}"),
            }
        }
        // 60 idle against max_spare 4: 56 surplus, halved each period.
        assert_eq!(steps, [28, 14, 7, 4, 2, 1]);
        assert_eq!(idle, config.max_spare);
    }

    #[test]
    fn a_dip_restarts_the_grace_period() {
        let config = config();
        let mut memory = ScalingMemory::default();
        let t0 = Instant::now();
        decide(counts(0, 7, 0, 0), &config, &mut memory, t0);
        decide(
            counts(0, 3, 4, 0),
            &config,
            &mut memory,
            t0 + config.retire_grace / 2,
        );
        let d = decide(
            counts(0, 7, 0, 0),
            &config,
            &mut memory,
            t0 + config.retire_grace,
        );
        assert_eq!(d, Decision::Hold);
    }

    #[test]
    fn free_places_count_as_whole_idle_children() {
        let places = |serving, free, queued| PlaceCounts {
            starting: 1,
            serving,
            free,
            queued,
        };
        // Three children of 100: 250 free places are two idle children.
        assert_eq!(
            in_child_equivalents(places(3, 250, 0), 100),
            counts(1, 2, 1, 0)
        );
        // 199 free with min_spare 2 is short by one child.
        let c = in_child_equivalents(places(2, 199, 0), 100);
        assert_eq!(c, counts(1, 1, 1, 0));
        assert_eq!(c.live(), 3);
        // 101 queued connections need two children.
        assert_eq!(
            in_child_equivalents(places(2, 0, 101), 100),
            counts(1, 0, 2, 2)
        );
        // Never more idle than serving children, even if told otherwise.
        assert_eq!(
            in_child_equivalents(places(1, 500, 0), 100),
            counts(1, 1, 0, 0)
        );
        assert_eq!(in_child_equivalents(places(2, 5, 3), 0), counts(1, 2, 0, 3));
    }

    #[test]
    fn min_and_max_spare_become_free_places() {
        let config = PoolConfig {
            min_children: 1,
            max_children: 10,
            min_spare: 2,
            max_spare: 3,
            ..PoolConfig::default()
        };
        let t0 = Instant::now();
        let decide_for = |serving, free| {
            let mut memory = ScalingMemory::default();
            let c = in_child_equivalents(
                PlaceCounts {
                    starting: 0,
                    serving,
                    free,
                    queued: 0,
                },
                100,
            );
            decide(c, &config, &mut memory, t0);
            decide(c, &config, &mut memory, t0 + config.retire_grace)
        };
        assert_eq!(decide_for(3, 199), Decision::Spawn(1));
        assert_eq!(decide_for(3, 200), Decision::Hold);
        assert_eq!(decide_for(5, 399), Decision::Hold);
        assert_eq!(decide_for(5, 400), Decision::Retire(1));
    }

    #[test]
    fn retirement_never_goes_below_min_children() {
        let config = PoolConfig {
            min_children: 6,
            ..config()
        };
        let mut memory = ScalingMemory::default();
        let t0 = Instant::now();
        decide(counts(0, 7, 0, 0), &config, &mut memory, t0);
        let d = decide(
            counts(0, 7, 0, 0),
            &config,
            &mut memory,
            t0 + config.retire_grace,
        );
        assert_eq!(d, Decision::Retire(1));
    }
}
