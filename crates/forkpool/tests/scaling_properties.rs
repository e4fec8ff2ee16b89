//! Properties of the scaling policy, `scaling::decide`.
//!
//! Three kinds of test live here:
//! - safety properties that must hold for any valid config, any counts and
//!   any sequence of calls (bounds, when spawning and retiring are allowed);
//! - a steady-load property: a model pool that carries out every decision
//!   settles and never flaps between spawning and retiring;
//! - deterministic load traces through a small discrete-time simulation
//!   ([`Sim`]), checking how fast the pool grows and that it shrinks back.

use std::time::{Duration, Instant};

use forkpool::config::PoolConfig;
use forkpool::scaling::{decide, CpuUse, Decision, PoolCounts, ScalingMemory};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

// ---------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------

/// Configs drawn from ranges that include invalid combinations, kept only if
/// `validate()` accepts them: the properties are promised for valid configs.
/// `max_children_cap` keeps simulated pools small enough to settle quickly.
fn valid_config(max_children_cap: u32) -> impl Strategy<Value = PoolConfig> {
    (
        prop_oneof![4 => 0..=max_children_cap.min(64), 1 => 0..=max_children_cap],
        0u32..=16,
        0u32..=16,
        0u32..=32,
        // Large spawn rates matter: the ramp doubles towards this cap.
        prop_oneof![3 => 1u32..=64, 1 => any::<u32>()],
        prop_oneof![1 => Just(0u64), 4 => 1u64..=2_000],
        any::<bool>(),
    )
        .prop_map(
            |(max_children, min_children, min_spare, max_spare, max_spawn_rate, grace_ms, hold)| {
                PoolConfig {
                    min_children,
                    max_children,
                    min_spare,
                    max_spare,
                    max_spawn_rate,
                    retire_grace: Duration::from_millis(grace_ms),
                    hold_when_cpu_bound: hold,
                    ..PoolConfig::default()
                }
            },
        )
        .prop_filter("config must pass validate()", |c| c.validate().is_ok())
}

/// Counts as the supervisor could report them, including a pool above
/// `max_children` (after a reload lowered it) and a deep listen backlog.
fn any_counts() -> impl Strategy<Value = PoolCounts> {
    let children = || prop_oneof![4 => 0u32..=80, 1 => 0u32..=5_000];
    (
        children(),
        children(),
        children(),
        prop_oneof![2 => Just(0u32), 2 => 0u32..=100, 1 => any::<u32>()],
        prop_oneof![
            2 => Just(CpuUse::NotLooked),
            1 => Just(CpuUse::Measuring),
            2 => (0u32..4000).prop_map(CpuUse::Waiting),
            1 => Just(CpuUse::Stalled),
        ],
        prop_oneof![2 => Just(0u32), 1 => 1u32..=8],
    )
        .prop_map(
            |(starting, idle, busy, queued, cpu, start_limit)| PoolCounts {
                starting,
                idle,
                busy,
                queued,
                cpu,
                start_limit,
            },
        )
}

// ---------------------------------------------------------------------------
// The safety properties of a single decision
// ---------------------------------------------------------------------------

/// Whether the pool has fewer spare children than it wants.
fn short_of_spare(c: &PoolCounts, config: &PoolConfig) -> bool {
    c.idle + c.starting < config.min_spare.saturating_add(c.queued)
}

/// Whether the pool has idle children it may retire once the grace is over.
fn has_surplus(c: &PoolCounts, config: &PoolConfig) -> bool {
    c.queued == 0 && c.idle > config.max_spare && c.live() > config.min_children
}

/// Checks one decision against the rules that hold whatever came before it.
fn check_decision(
    c: &PoolCounts,
    config: &PoolConfig,
    decision: Decision,
) -> Result<(), TestCaseError> {
    let live = c.live();
    let below_min = live < config.min_children;
    let short = short_of_spare(c, config);
    match decision {
        Decision::Spawn(n) => {
            prop_assert!(n >= 1, "Spawn(0) for {c:?}");
            prop_assert!(
                below_min || n == 1 || !c.cpu.careful() || !config.hold_when_cpu_bound,
                "Spawn({n}) while the CPUs fill up: {c:?}"
            );
            prop_assert!(
                live + n <= config.max_children,
                "Spawn({n}) takes {live} live above max_children {}",
                config.max_children
            );
            prop_assert!(below_min || short, "Spawn({n}) without need: {c:?}");
            prop_assert!(
                below_min || c.start_limit == 0 || c.starting + n <= c.start_limit,
                "Spawn({n}) beyond the start limit: {c:?}"
            );
            if !below_min {
                prop_assert!(
                    n <= config.max_spawn_rate,
                    "Spawn({n}) above max_spawn_rate {}",
                    config.max_spawn_rate
                );
            }
        }
        Decision::Retire(n) => {
            prop_assert!(n >= 1, "Retire(0) for {c:?}");
            prop_assert_eq!(c.queued, 0, "Retire({}) with connections queued", n);
            prop_assert!(
                live - n >= config.min_children,
                "Retire({n}) takes {live} live below min_children {}",
                config.min_children
            );
            prop_assert!(
                n <= c.idle.saturating_sub(config.max_spare),
                "Retire({n}) retires more than idle {} - max_spare {}",
                c.idle,
                config.max_spare
            );
        }
        Decision::Saturated => {
            prop_assert!(
                live >= config.max_children,
                "Saturated with {live} live below max_children {}",
                config.max_children
            );
            prop_assert!(short, "Saturated but not short of spare: {c:?}");
        }
        Decision::CpuBound => {
            // Holding while short is allowed only for this reason, and
            // never below min_children.
            prop_assert!(short, "CpuBound but not short of spare: {c:?}");
            prop_assert!(!below_min, "CpuBound below min_children: {c:?}");
            prop_assert!(
                (c.cpu_holds() && config.hold_when_cpu_bound)
                    || (c.start_limit > 0 && c.starting >= c.start_limit),
                "CpuBound while the CPUs have room: {c:?}"
            );
        }
        Decision::Hold => {
            // A short pool must start someone, or say it cannot (Saturated):
            // holding would starve it silently.
            prop_assert!(!below_min, "Hold below min_children: {c:?}");
            prop_assert!(!short, "Hold while short of spare: {c:?}");
        }
    }
    Ok(())
}

/// One call of a generated sequence: the counts and the clock step before it.
#[derive(Debug, Clone)]
struct Call {
    counts: PoolCounts,
    step_ms: u64,
}

fn any_calls(max_len: usize) -> impl Strategy<Value = Vec<Call>> {
    let step = prop_oneof![1 => Just(0u64), 4 => 0u64..=500, 1 => 0u64..=5_000];
    prop::collection::vec(
        (any_counts(), step).prop_map(|(counts, step_ms)| Call { counts, step_ms }),
        1..max_len,
    )
}

/// A Retire at index `i` is allowed only if some earlier-or-same call `j`, at
/// least `retire_grace` before it, started an unbroken run of surplus calls
/// up to `i` with no other Retire inside the run.
fn grace_was_respected(history: &[(Instant, bool, Decision)], i: usize, grace: Duration) -> bool {
    let (t_i, _, _) = history[i];
    (0..=i).rev().any(|j| {
        let run = &history[j..=i];
        let unbroken = run.iter().all(|(_, surplus, _)| *surplus);
        let no_retire_before = run[..run.len() - 1]
            .iter()
            .all(|(_, _, d)| !matches!(d, Decision::Retire(_)));
        unbroken && no_retire_before && t_i.duration_since(history[j].0) >= grace
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any sequence of unrelated counts: every decision obeys the bounds,
    /// and a retirement only ever follows a full grace period of surplus.
    #[test]
    fn every_decision_obeys_the_bounds(
        config in valid_config(5_000),
        calls in any_calls(60),
    ) {
        let mut memory = ScalingMemory::default();
        let mut now = Instant::now();
        let mut history = Vec::new();
        for call in &calls {
            now += Duration::from_millis(call.step_ms);
            let decision = decide(call.counts, &config, &mut memory, now);
            check_decision(&call.counts, &config, decision)?;
            history.push((now, has_surplus(&call.counts, &config), decision));
            if matches!(decision, Decision::Retire(_)) {
                prop_assert!(
                    grace_was_respected(&history, history.len() - 1, config.retire_grace),
                    "Retire before retire_grace {:?} of surplus: {:?}",
                    config.retire_grace,
                    history
                );
            }
        }
    }

    /// The supervisor may be unable to carry a decision out (fork failing
    /// with EAGAIN), so decide sees the same counts round after round. The
    /// bounds must still hold, and a short pool must keep asking for more.
    #[test]
    fn unchanged_counts_keep_the_bounds(
        config in valid_config(5_000),
        counts in any_counts(),
        rounds in 1usize..80,
        step_ms in 0u64..=50,
    ) {
        let mut memory = ScalingMemory::default();
        let mut now = Instant::now();
        for _ in 0..rounds {
            let decision = decide(counts, &config, &mut memory, now);
            check_decision(&counts, &config, decision)?;
            now += Duration::from_millis(step_ms);
        }
    }
}

// ---------------------------------------------------------------------------
// Steady load: a model pool that carries decisions out
// ---------------------------------------------------------------------------

/// A pool that applies each decision at once: spawned children are starting
/// for one step and idle after it; retired children vanish; `busy` is fixed.
#[derive(Debug, Clone, Copy)]
struct ModelPool {
    starting: u32,
    idle: u32,
    busy: u32,
}

impl ModelPool {
    fn counts(&self) -> PoolCounts {
        PoolCounts {
            starting: self.starting,
            idle: self.idle,
            busy: self.busy,
            queued: 0,
            cpu: CpuUse::NotLooked,
            start_limit: 0,
        }
    }

    /// One round: the children started last round are ready, then the
    /// policy is asked and its answer carried out.
    fn step(&mut self, config: &PoolConfig, memory: &mut ScalingMemory, now: Instant) -> Decision {
        self.idle += std::mem::take(&mut self.starting);
        let decision = decide(self.counts(), config, memory, now);
        match decision {
            Decision::Spawn(n) => self.starting += n,
            Decision::Retire(n) => self.idle -= n,
            Decision::Hold | Decision::Saturated | Decision::CpuBound => {}
        }
        decision
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Under a constant load the pool settles: no spawn and retire within
    /// one grace period of each other, no change at all after a warm-up,
    /// and the settled pool sits inside its bounds.
    #[test]
    fn a_steady_load_settles_without_flapping(
        config in valid_config(64),
        busy_fraction in 0.0f64..=1.0,
        initial_idle in 0u32..=64,
        steps_ms in prop::collection::vec(0u64..=40, 50..100),
    ) {
        let busy = (f64::from(config.max_children) * busy_fraction) as u32;
        let mut pool = ModelPool {
            starting: 0,
            idle: initial_idle.min(config.max_children - busy),
            busy,
        };
        let mut memory = ScalingMemory::default();
        let t0 = Instant::now();
        let mut now = t0;
        let grace = config.retire_grace;
        // Long enough for the spawn ramp (at most max_children rounds) and
        // for the surplus to be shed after it: halved once per grace
        // period, 64 children at most take 7 periods.
        let warm_up_steps = 2 * config.max_children as usize + 10;
        let warm_up_until = t0 + 9 * grace + Duration::from_millis(100);

        let mut changes: Vec<(Instant, Decision)> = Vec::new();
        let mut step = 0usize;
        let mut after_warm_up = 0usize;
        while after_warm_up < 100 {
            now += Duration::from_millis(steps_ms[step % steps_ms.len()]);
            let decision = pool.step(&config, &mut memory, now);
            let warm = step >= warm_up_steps && now >= warm_up_until;
            if matches!(decision, Decision::Spawn(_) | Decision::Retire(_)) {
                prop_assert!(
                    !warm,
                    "{decision:?} after the warm-up (step {step}, pool {pool:?})"
                );
                changes.push((now, decision));
            }
            if warm {
                after_warm_up += 1;
            }
            step += 1;
            prop_assert!(step < 100_000, "the warm-up never ended");
        }

        for (i, (t_a, a)) in changes.iter().enumerate() {
            for (t_b, b) in &changes[i + 1..] {
                let flapped = matches!(
                    (a, b),
                    (Decision::Spawn(_), Decision::Retire(_))
                        | (Decision::Retire(_), Decision::Spawn(_))
                );
                prop_assert!(
                    !(flapped && t_b.duration_since(*t_a) < grace),
                    "{a:?} and {b:?} within retire_grace {grace:?}: {changes:?}"
                );
            }
        }

        // The settled pool is inside its bounds.
        let c = pool.counts();
        prop_assert_eq!(c.starting, 0);
        prop_assert!(c.live() >= config.min_children);
        prop_assert!(c.live() <= config.max_children.max(busy));
        prop_assert!(
            c.idle >= config.min_spare || c.live() == config.max_children,
            "settled short of spare without being at the ceiling: {c:?}"
        );
        prop_assert!(
            c.idle <= config.max_spare || c.live() == config.min_children,
            "settled with surplus idle children: {c:?}"
        );
    }
}

// ---------------------------------------------------------------------------
// Load traces through a discrete-time simulation
// ---------------------------------------------------------------------------

/// A pool and its clients in 1 ms rounds. Children take `start_ms` to start;
/// each request keeps a child busy for `service_ms`; requests that find no
/// idle child wait in the listen backlog (`queued`), as they do in `handoff`
/// dispatch. Clients hold `offered` requests in flight at all times.
struct Sim {
    config: PoolConfig,
    memory: ScalingMemory,
    t0: Instant,
    now_ms: u64,
    start_ms: u64,
    service_ms: u64,
    /// When each starting child becomes ready.
    starting: Vec<u64>,
    idle: u32,
    /// When each busy child finishes its request.
    busy: Vec<u64>,
    queued: u32,
    /// Concurrent requests the clients keep in flight.
    offered: u32,
    /// Every decision that was not `Hold`, with its time.
    log: Vec<(u64, Decision)>,
}

impl Sim {
    fn new(config: PoolConfig) -> Sim {
        config.validate().expect("the trace uses a valid config");
        Sim {
            config,
            memory: ScalingMemory::default(),
            t0: Instant::now(),
            now_ms: 0,
            start_ms: 2,
            service_ms: 100,
            starting: Vec::new(),
            idle: 0,
            busy: Vec::new(),
            queued: 0,
            offered: 0,
            log: Vec::new(),
        }
    }

    fn live(&self) -> u32 {
        self.starting.len() as u32 + self.idle + self.busy.len() as u32
    }

    /// One millisecond: children finish starting and serving, clients top
    /// up their requests, idle children take queued ones, then the policy
    /// decides and its decision is carried out.
    fn round(&mut self) {
        self.now_ms += 1;
        let now = self.now_ms;

        let before = self.starting.len();
        self.starting.retain(|&ready_at| ready_at > now);
        self.idle += (before - self.starting.len()) as u32;

        let before = self.busy.len();
        self.busy.retain(|&done_at| done_at > now);
        self.idle += (before - self.busy.len()) as u32;

        let in_flight = self.queued + self.busy.len() as u32;
        self.queued += self.offered.saturating_sub(in_flight);

        while self.queued > 0 && self.idle > 0 {
            self.queued -= 1;
            self.idle -= 1;
            self.busy.push(now + self.service_ms);
        }

        let counts = PoolCounts {
            starting: self.starting.len() as u32,
            idle: self.idle,
            busy: self.busy.len() as u32,
            queued: self.queued,
            cpu: CpuUse::NotLooked,
            start_limit: 0,
        };
        let clock = self.t0 + Duration::from_millis(now);
        let decision = decide(counts, &self.config, &mut self.memory, clock);
        match decision {
            Decision::Spawn(n) => {
                let ready_at = now + self.start_ms;
                self.starting.extend((0..n).map(|_| ready_at));
            }
            Decision::Retire(n) => self.idle -= n,
            Decision::Hold | Decision::Saturated | Decision::CpuBound => {}
        }
        if decision != Decision::Hold {
            self.log.push((now, decision));
        }
        assert!(
            self.live() <= self.config.max_children,
            "{} live children above max_children at {now} ms",
            self.live()
        );
    }

    fn run_until(&mut self, ms: u64) {
        while self.now_ms < ms {
            self.round();
        }
    }

    /// The first decision matching `pred` at or after `from_ms`.
    fn first_after(&self, from_ms: u64, pred: impl Fn(&Decision) -> bool) -> Option<u64> {
        self.log
            .iter()
            .find(|(t, d)| *t >= from_ms && pred(d))
            .map(|(t, _)| *t)
    }
}

fn is_retire(d: &Decision) -> bool {
    matches!(d, Decision::Retire(_))
}

#[test]
fn a_burst_grows_the_pool_fast_and_it_shrinks_after_the_grace() {
    let config = PoolConfig {
        min_children: 2,
        max_children: 64,
        min_spare: 2,
        max_spare: 8,
        retire_grace: Duration::from_secs(1),
        max_spawn_rate: 32,
        ..PoolConfig::default()
    };
    let grace_ms = config.retire_grace.as_millis() as u64;
    let mut sim = Sim::new(config.clone());

    // At rest: exactly min_children, all idle.
    sim.run_until(10);
    assert_eq!((sim.live(), sim.idle), (2, 2));

    // 32 concurrent slow requests arrive at once.
    let burst_at = sim.now_ms;
    sim.offered = 32;
    sim.run_until(burst_at + 20);
    assert!(
        sim.live() >= 32,
        "only {} live 20 ms into the burst",
        sim.live()
    );
    assert_eq!(sim.busy.len(), 32, "every request is being served");
    assert_eq!(sim.queued, 0);

    // Holding the load changes nothing: no retirement, the pool stays put.
    let grown = sim.live();
    sim.run_until(burst_at + 500);
    assert_eq!(sim.live(), grown);
    assert_eq!(sim.first_after(burst_at, is_retire), None);

    // The load stops; the last requests finish within service_ms.
    let calm_at = sim.now_ms;
    sim.offered = 0;
    // Half the surplus goes per grace period: a few periods.
    sim.run_until(calm_at + sim.service_ms + 8 * grace_ms + 50);
    let first_retire = sim
        .first_after(calm_at, is_retire)
        .expect("the idle surplus was retired");
    assert!(
        first_retire >= calm_at + grace_ms,
        "retired at {first_retire} ms, before the grace period after {calm_at} ms"
    );
    assert!(sim.busy.is_empty());
    assert!(
        sim.idle <= config.max_spare.max(config.min_children),
        "{} idle children left after the grace period",
        sim.idle
    );
    assert!(sim.live() >= config.min_children);

    // And then it stays there.
    let settled = sim.live();
    sim.run_until(sim.now_ms + 3 * grace_ms);
    assert_eq!(sim.live(), settled);
}

#[test]
fn a_burst_beyond_the_ceiling_saturates_and_queues() {
    let config = PoolConfig {
        min_children: 2,
        max_children: 16,
        min_spare: 2,
        max_spare: 8,
        retire_grace: Duration::from_secs(1),
        ..PoolConfig::default()
    };
    let mut sim = Sim::new(config);
    sim.run_until(10);
    sim.offered = 32;
    sim.run_until(40);

    assert_eq!(sim.live(), 16);
    assert_eq!(sim.busy.len(), 16);
    assert_eq!(sim.queued, 16, "the rest waits in the backlog");
    assert!(sim.first_after(10, |d| *d == Decision::Saturated).is_some());

    // The backlog drains as requests finish; nothing is retired meanwhile.
    sim.offered = 0;
    sim.run_until(400);
    assert_eq!(sim.queued, 0);
    assert!(sim.busy.is_empty());
    // The last queued requests finish at about 220 ms; the grace period
    // counts from there, so nothing is retired yet.
    assert_eq!(sim.first_after(10, is_retire), None);
    // Then the surplus of 8 goes in halves, a second apart: 4, 2, 1, 1.
    sim.run_until(1_500);
    assert_eq!(sim.live(), 12, "half the surplus is retired first");
    sim.run_until(4_500);
    assert_eq!(sim.live(), 8, "the surplus over max_spare is retired");
}
