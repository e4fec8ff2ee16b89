//! The scale-up, replayed on a simulated clock with the pool's own policy.
//!
//! [`forkpool::scaling::decide`] is pure, so the benchmark can drive it
//! through a load step without forking anything and show what the same
//! policy does at two cadences:
//! - [`Cadence::EveryEvent`]: called after every state change, as forkpool's
//!   supervisor does; the spawn rate doubles per *call*;
//! - [`Cadence::EverySecond`]: called once a second, as Apache prefork's
//!   maintenance loop does; the rate doubles per *second* (1, 2, 4, ... 32).
//!
//! The model: the pool rests at `min_children` idle children; at time 0,
//! `clients` clients arrive and each keeps exactly one request of `work`
//! outstanding (a closed loop, like the load generator). A request waits in
//! the queue until a child is idle; a spawned child is ready after
//! `spawn_delay`. The queue length is visible to the policy (a supervisor
//! can read the listen backlog's length with `TCP_INFO`).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use forkpool::config::PoolConfig;
use forkpool::scaling::{decide, Decision, PoolCounts, ScalingMemory};
use serde::Serialize;

/// When the policy is consulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cadence {
    /// After every event (a child ready, a request done).
    EveryEvent,
    /// Once a second, on the second.
    EverySecond,
}

/// The load step to simulate.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The pool's settings.
    pub config: PoolConfig,
    /// Clients arriving at time 0.
    pub clients: u32,
    /// How long a child works on one request.
    pub work: Duration,
    /// From spawn decision to a child ready for work.
    pub spawn_delay: Duration,
    /// How much simulated time to run.
    pub horizon: Duration,
}

/// The number of live children (starting, idle or busy) from a moment on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Point {
    /// Milliseconds since the load arrived.
    pub ms: u64,
    /// Live children from then on.
    pub children: u32,
}

/// Children over time, one point per change.
pub fn simulate(scenario: &Scenario, cadence: Cadence) -> Vec<Point> {
    let mut pool = Pool {
        starting: BinaryHeap::new(),
        idle: scenario.config.min_children,
        busy: BinaryHeap::new(),
        queued: scenario.clients,
    };
    let mut memory = ScalingMemory::default();
    let epoch = Instant::now();
    let mut next_tick = Duration::ZERO;
    let mut now = Duration::ZERO;
    let mut curve = vec![Point {
        ms: 0,
        children: pool.live(),
    }];
    while now <= scenario.horizon {
        pool.dispatch(now, scenario.work);
        let due = match cadence {
            Cadence::EveryEvent => true,
            Cadence::EverySecond => now >= next_tick,
        };
        if due {
            let decision = decide(pool.counts(), &scenario.config, &mut memory, epoch + now);
            pool.apply(decision, now + scenario.spawn_delay);
            pool.dispatch(now, scenario.work);
            next_tick = Duration::from_secs(now.as_secs() + 1);
        }
        if curve.last().is_some_and(|p| p.children != pool.live()) {
            curve.push(Point {
                ms: now.as_millis() as u64,
                children: pool.live(),
            });
        }
        let tick = (cadence == Cadence::EverySecond).then_some(next_tick);
        let Some(next) = [pool.next_ready(), pool.next_done(), tick]
            .into_iter()
            .flatten()
            .min()
        else {
            break;
        };
        now = next;
        pool.advance_to(now);
    }
    curve
}

/// The first time the curve reaches `children`, in milliseconds.
pub fn time_to(curve: &[Point], children: u32) -> Option<u64> {
    curve.iter().find(|p| p.children >= children).map(|p| p.ms)
}

/// The children on `curve` at `ms`.
pub fn children_at(curve: &[Point], ms: u64) -> u32 {
    curve
        .iter()
        .take_while(|p| p.ms <= ms)
        .last()
        .map_or(0, |p| p.children)
}

/// The simulated pool: when each starting child will be ready, when each
/// busy child will be done.
struct Pool {
    starting: BinaryHeap<Reverse<Duration>>,
    idle: u32,
    busy: BinaryHeap<Reverse<Duration>>,
    queued: u32,
}

impl Pool {
    fn live(&self) -> u32 {
        self.starting.len() as u32 + self.idle + self.busy.len() as u32
    }

    fn counts(&self) -> PoolCounts {
        PoolCounts {
            starting: self.starting.len() as u32,
            idle: self.idle,
            busy: self.busy.len() as u32,
            queued: self.queued,
            cpu: forkpool::scaling::CpuUse::NotLooked,
            start_limit: 0,
        }
    }

    fn next_ready(&self) -> Option<Duration> {
        self.starting.peek().map(|r| r.0)
    }

    fn next_done(&self) -> Option<Duration> {
        self.busy.peek().map(|r| r.0)
    }

    /// Children that became ready and requests that finished by `now`; a
    /// finished client sends its next request at once.
    fn advance_to(&mut self, now: Duration) {
        while self.next_ready().is_some_and(|t| t <= now) {
            self.starting.pop();
            self.idle += 1;
        }
        while self.next_done().is_some_and(|t| t <= now) {
            self.busy.pop();
            self.idle += 1;
            self.queued += 1;
        }
    }

    /// Idle children take queued requests.
    fn dispatch(&mut self, now: Duration, work: Duration) {
        while self.idle > 0 && self.queued > 0 {
            self.idle -= 1;
            self.queued -= 1;
            self.busy.push(Reverse(now + work));
        }
    }

    fn apply(&mut self, decision: Decision, ready_at: Duration) {
        match decision {
            Decision::Spawn(n) => (0..n).for_each(|_| self.starting.push(Reverse(ready_at))),
            Decision::Retire(n) => self.idle -= n.min(self.idle),
            Decision::Hold | Decision::Saturated | Decision::CpuBound => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario() -> Scenario {
        Scenario {
            config: PoolConfig {
                min_children: 2,
                min_spare: 2,
                max_children: 64,
                ..PoolConfig::default()
            },
            clients: 64,
            work: Duration::from_millis(50),
            spawn_delay: Duration::from_millis(10),
            horizon: Duration::from_secs(10),
        }
    }

    #[test]
    fn once_a_second_doubles_per_second() {
        let curve = simulate(&scenario(), Cadence::EverySecond);
        let per_second: Vec<u32> = (0..7).map(|s| children_at(&curve, s * 1000)).collect();
        // 2 at rest, then +1, +2, +4, +8, +16, +32 (capped at 64).
        assert_eq!(per_second, [3, 5, 9, 17, 33, 64, 64]);
        assert_eq!(time_to(&curve, 64), Some(5000));
    }

    #[test]
    fn every_event_reaches_the_ceiling_in_milliseconds() {
        let curve = simulate(&scenario(), Cadence::EveryEvent);
        let t = time_to(&curve, 64).expect("reaches 64");
        assert!(t < 200, "took {t} ms: {curve:?}");
        assert!(curve.iter().all(|p| p.children <= 64));
        assert_eq!(children_at(&curve, 10_000), 64);
    }

    #[test]
    fn curve_helpers() {
        let curve = [
            Point { ms: 0, children: 2 },
            Point {
                ms: 10,
                children: 3,
            },
            Point {
                ms: 30,
                children: 64,
            },
        ];
        assert_eq!(children_at(&curve, 9), 2);
        assert_eq!(children_at(&curve, 10), 3);
        assert_eq!(children_at(&curve, 1000), 64);
        assert_eq!(time_to(&curve, 4), Some(30));
        assert_eq!(time_to(&curve, 65), None);
    }
}
