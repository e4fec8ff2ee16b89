//! How the pool uses the CPUs, as the core keeps it: two watches of the
//! run-queue looks (`policy::cpu_wait`), one over the busy children (the
//! scaling hold) and one over every serving child (the dispatch width),
//! and the moments the loop must wake for their next looks, and which
//! children a look due now reads. The shell reads `/proc` for those and
//! hands the core what it found.

use std::time::Instant;

use super::child::HasChild;
use super::Core;
use crate::policy::cpu_wait::{CpuWatch, Turns, LOOK_INTERVAL};
use crate::policy::width::Turnover;
use crate::scaling::CpuUse;
use crate::scoreboard::SlotState;
use std::collections::{HashMap, HashSet};

/// The core's two watches, and what the pool's looks found of the
/// connections begun between them.
#[derive(Debug, Default)]
pub(crate) struct Watches {
    /// Over the busy children: the scaling hold.
    busy: CpuWatch,
    /// Over every serving child, busy or idle: the dispatch width.
    pool: CpuWatch,
    /// What the connections begun lately were like, for the width.
    turnover: TurnoverLooks,
}

/// The pool's looks, read as connections begun (`policy::width::Turnover`).
#[derive(Debug, Default)]
struct TurnoverLooks {
    /// At the last look: when, and the connections begun before it.
    last: Option<(Instant, u64)>,
    /// What the last look alone read.
    last_look: Turnover,
    /// What the width is told: long only when two looks in a row said so.
    told: Turnover,
}

impl<L: HasChild> Core<L> {
    /// The busy children's watch (the scaling hold).
    pub fn busy_watch(&self) -> &CpuWatch {
        &self.watches.busy
    }

    /// Every serving child's watch (the dispatch width).
    pub fn pool_watch(&self) -> &CpuWatch {
        &self.watches.pool
    }

    /// Whether the busy watch counts: the pool holds its growth while
    /// CPU-bound, and its busy children are enough to fill the CPUs.
    fn busy_watched(&self) -> bool {
        self.config.hold_when_cpu_bound
            && (self.watches.busy).can_fill(self.board.counts().busy as usize)
    }

    /// The busy children's pids (one a connection or more), when the busy
    /// watch looks at `now`: the shell reads their turns on the CPUs.
    pub fn busy_look_due(&self, now: Instant) -> Option<Vec<i32>> {
        let due = self.watches.busy.next_look().is_none_or(|due| now >= due);
        (self.busy_watched() && due)
            .then(|| self.pids_where(|state| matches!(state, SlotState::Busy | SlotState::Partial)))
    }

    /// How the busy children use the CPUs at `now`, for the scaling rule.
    pub fn cpu_use(&self, now: Instant) -> CpuUse {
        match self.busy_watched() {
            true => self.watches.busy.use_at(now),
            false => CpuUse::NotLooked,
        }
    }

    /// Every serving child's pid, busy or idle, when the pool watch looks
    /// at `now` (kernel dispatch's width): a child the kernel woke for a
    /// connection waits for a CPU before it accepts and marks itself
    /// busy, so on CPUs the clients share most of a pool's waiting is
    /// there, out of the busy children's measure. Only while connections
    /// end or the width leaves children out: an idle pool is not looked
    /// at.
    pub fn pool_look_due(&self, now: Instant) -> Option<Vec<i32>> {
        let watch = &self.watches.pool;
        let due = watch.next_look().is_none_or(|due| now >= due);
        let serving = watch.serving_at(now) || self.board.width().is_some();
        (due && serving).then(|| self.pids_where(SlotState::serves))
    }

    fn pids_where(&self, state: impl Fn(SlotState) -> bool) -> Vec<i32> {
        let mut children = self.board.iter();
        let pids = children
            .by_ref()
            .filter(|(_, s)| state(s.state))
            .map(|(_, s)| s.pid);
        pids.collect()
    }

    /// A look at the busy children's turns on the CPUs, at `now`.
    pub fn busy_looked(&mut self, turns: HashMap<i32, Turns>, now: Instant) {
        self.watches.busy.look(turns, now);
    }

    /// A look at every serving child's turns on the CPUs, at `now`.
    pub fn pool_looked(&mut self, turns: HashMap<i32, Turns>, now: Instant) {
        let busy: HashSet<i32> = self
            .pids_where(|state| matches!(state, SlotState::Busy | SlotState::Partial))
            .into_iter()
            .collect();
        let wanted = (self.watches.pool).wanted_share(&turns, |pid| busy.contains(&pid), now);
        self.watches.pool.look(turns, now);
        self.measure_turnover(now, wanted);
    }

    /// What the connections begun since the pool's last look were like
    /// (`policy::width::Turnover`): how long they last, by Little's law
    /// (the busy children over the connections begun a second), and
    /// whether their children computed all along (`wanted`: the share of
    /// their time the busy children used or wanted a CPU since the last
    /// look; `None`, not measured, leaves what the last look read). Each only when two looks in a row say so: the busy children
    /// are counted at the look, and the last look of a load's tail finds
    /// a child or two still busy and hardly a connection begun, which read
    /// alone as long connections and opened the width as the load ended.
    pub(crate) fn measure_turnover(&mut self, now: Instant, wanted: Option<u32>) {
        let begun = self.totals.accepted;
        let busy = self.board.counts().busy;
        let looks = &mut self.watches.turnover;
        if let Some((at, begun_then)) = looks.last {
            let mut look = Turnover::of(
                busy,
                now.saturating_duration_since(at),
                begun.saturating_sub(begun_then),
                wanted,
            );
            // A look that could not measure (the first after the width
            // moved) says nothing new of how the children compute.
            if wanted.is_none() {
                look.working = looks.last_look.working;
                look.wanted = looks.last_look.wanted;
            }
            looks.told = look.and(looks.last_look);
            looks.last_look = look;
        }
        looks.last = Some((now, begun));
    }

    /// What the width is told of the connections begun lately.
    pub(crate) fn turnover(&self) -> Turnover {
        self.watches.turnover.told
    }

    /// A child started: the busy children's last look no longer says how
    /// the pool uses the CPUs.
    pub fn busy_changed(&mut self) {
        self.watches.busy.changed();
    }

    /// The width widened: both watches measure afresh.
    pub fn pool_changed(&mut self) {
        self.watches.pool.changed();
        self.watches.busy.changed();
    }

    /// A child finished a connection at `now` (both watches hear it).
    pub fn connection_ended_at(&mut self, now: Instant) {
        self.watches.busy.connection_ended(now);
        self.watches.pool.connection_ended(now);
    }

    /// When the loop must wake for a look without an event: the busy
    /// children's, while the last look holds the pool (so the hold ends on
    /// a look, not on the next connection: a burst of slow requests gives
    /// none for as long as they take); and while the width leaves
    /// children out, every look interval, so it follows the load even
    /// when no event comes (children within it take the overflow's
    /// connections themselves and wake no one).
    pub(super) fn cpu_deadline(&self, now: Instant) -> Option<Instant> {
        let hold = self
            .watches
            .busy
            .look_due(self.board.counts().busy as usize, now)
            .filter(|_| self.config.hold_when_cpu_bound);
        let width = self.board.width().map(|_| {
            self.watches
                .pool
                .next_look()
                .filter(|t| *t > now)
                .unwrap_or(now + LOOK_INTERVAL)
        });
        [hold, width].into_iter().flatten().min()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use crate::config::{DispatchMode, PoolConfig};
    use crate::core::child::Child;
    use std::collections::HashMap;

    use crate::core::sampled::Sample;
    use crate::core::Core;
    use crate::observe::procfs::SchedStat;
    use crate::policy::cpu_wait::Turns;
    use crate::policy::cpu_wait::LOOK_INTERVAL;
    use crate::policy::width::LONG_CONNECTION;
    use crate::protocol::ChildMessage;
    use crate::scaling::CpuUse;

    /// A kernel-dispatch core with one child, busy with its first
    /// connection.
    fn busy_core(now: Instant) -> Core<Child> {
        let mut core: Core<Child> = Core::new(PoolConfig {
            dispatch: DispatchMode::Kernel,
            ..PoolConfig::default()
        });
        core.adopt(0, 42, 1, Child::new(now, true, 1), now);
        core.report(0, ChildMessage::ReadyOnBoard { pid: 42 }, now);
        let record = |busy, taken, served| Sample {
            busy,
            taken,
            served,
            next: 0,
        };
        core.sampled(0, record(true, 0, 0), now);
        core.sampled(0, record(false, 0, 0), now);
        core.sampled(0, record(true, 1, 0), now);
        core
    }

    #[test]
    fn connections_read_long_only_after_two_long_looks_in_a_row() {
        let start = Instant::now();
        let mut core = busy_core(start);
        let look = |k: u32| start + LONG_CONNECTION * 2 * k;
        core.pool_looked(Default::default(), look(0));
        assert!(!core.turnover().long, "one look measures nothing");
        // One busy child, no connection begun for two LONG_CONNECTIONs.
        core.pool_looked(Default::default(), look(1));
        assert!(
            !core.turnover().long,
            "one long look alone is the tail of a load"
        );
        core.pool_looked(Default::default(), look(2));
        assert!(core.turnover().long, "two long looks in a row");
        // Many connections begun since: short again at once.
        core.totals.accepted += 10_000;
        core.pool_looked(Default::default(), look(3));
        assert!(!core.turnover().long);
    }

    #[test]
    fn long_connections_read_working_while_their_children_compute_all_along() {
        let start = Instant::now();
        let mut core = busy_core(start);
        let look = |k: u32| start + LONG_CONNECTION * 2 * k;
        // The busy child (pid 42) as the kernel reports it: runnable at
        // each look with no new turn on a CPU (it waited all along), or
        // asleep with a millisecond of CPU time since the look before.
        let turns = |k: u64, runnable: bool| {
            let sched = SchedStat {
                ran_ns: k * 1_000_000,
                waited_ns: 0,
                timeslices: if runnable { 1 } else { k },
            };
            HashMap::from([(42, Turns { sched, runnable })])
        };
        core.pool_looked(turns(0, true), look(0));
        core.pool_looked(turns(0, true), look(1));
        assert!(!core.turnover().working, "one look alone");
        core.pool_looked(turns(0, true), look(2));
        assert!(core.turnover().long && core.turnover().working);
        assert!(core.turnover().works() && !core.turnover().holds_children());
        // A look that cannot measure (the width moved) keeps the reading.
        core.pool_looked(HashMap::new(), look(3));
        core.pool_looked(HashMap::new(), look(4));
        assert!(core.turnover().working);
        // The child sleeps between its client's requests: 1 ms of its
        // 20, a kept-alive client holding it.
        core.pool_looked(turns(1, false), look(5));
        core.pool_looked(turns(2, false), look(6));
        core.pool_looked(turns(3, false), look(7));
        assert!(core.turnover().holds_children());
        // Idle children are not counted: a second child, idle and
        // asleep, beside the busy one computing.
        core.adopt(1, 43, 1, Child::new(start, true, 1), start);
        core.report(1, ChildMessage::ReadyOnBoard { pid: 43 }, start);
        let with_idle = |k: u64| {
            let mut t = turns(0, true);
            let sched = SchedStat {
                ran_ns: k,
                ..Default::default()
            };
            t.insert(
                43,
                Turns {
                    sched,
                    runnable: false,
                },
            );
            t
        };
        for k in 8..11 {
            core.pool_looked(with_idle(u64::from(k)), look(k));
        }
        assert!(core.turnover().works(), "{:?}", core.turnover());
    }

    #[test]
    fn the_busy_children_are_looked_at_once_they_can_fill_the_cpus() {
        let now = Instant::now();
        let mut core: Core<Child> = Core::new(PoolConfig {
            dispatch: DispatchMode::Handoff,
            max_children: 1024,
            ..PoolConfig::default()
        });
        let cpus = core.busy_watch().cpus();
        for slot in 0..cpus {
            let pid = 100 + slot as i32;
            core.adopt(slot, pid, 1, Child::new(now, true, 1), now);
            core.report(slot, ChildMessage::Ready { pid: pid as u32 }, now);
            if slot > 0 {
                core.handed(slot, now);
            }
        }
        // One short of the CPUs: nothing to look at, nothing said.
        assert_eq!(core.busy_look_due(now), None);
        assert_eq!(core.cpu_use(now), CpuUse::NotLooked);
        core.handed(0, now);
        let pids = core.busy_look_due(now).expect("a first look is due");
        assert_eq!(pids.len(), cpus);
        core.busy_looked(Default::default(), now);
        assert_eq!(core.busy_look_due(now), None);
        assert!(core.busy_look_due(now + LOOK_INTERVAL).is_some());
        // Without the hold the busy children are never looked at.
        core.config.hold_when_cpu_bound = false;
        assert_eq!(core.busy_look_due(now + LOOK_INTERVAL), None);
        assert_eq!(core.cpu_use(now + LOOK_INTERVAL), CpuUse::NotLooked);
        // The pool's watch looks at every serving child, once connections
        // end.
        assert_eq!(core.pool_look_due(now), None);
        core.report(0, ChildMessage::Idle, now);
        core.connection_ended_at(now);
        let pids = core.pool_look_due(now).expect("the pool served lately");
        assert_eq!(pids.len(), cpus);
        core.pool_looked(Default::default(), now);
        assert_eq!(core.pool_look_due(now), None);
    }
}
