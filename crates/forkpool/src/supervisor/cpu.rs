//! How long the busy children wait for the CPUs: the supervisor's side of
//! `policy::cpu_wait`. It reads each busy child's run-queue waiting
//! (`/proc/PID/schedstat`, a few microseconds per child) when the rule
//! says a look is due, and hands the totals to the rule.

use std::collections::HashMap;
use std::time::Instant;

use super::Supervisor;
use crate::observe::procfs;
use crate::policy::cpu_wait::Turns;
use crate::scaling::CpuUse;
use crate::scoreboard::SlotState;

/// Whether a child in `state` holds work that may keep a CPU busy.
fn holds_work(state: SlotState) -> bool {
    matches!(state, SlotState::Busy | SlotState::Partial)
}

impl Supervisor {
    /// How the busy children use the CPUs, for the scaling policy, looking
    /// again when the last look is [`LOOK_INTERVAL`] old.
    pub(super) fn cpu_use(&mut self, now: Instant) -> CpuUse {
        if !self.core.config().hold_when_cpu_bound {
            return CpuUse::NotLooked;
        }
        // The slot table keeps this count: no walk over it per turn.
        let watch = self.core.busy_watch();
        if !watch.can_fill(self.core.board().counts().busy as usize) {
            return CpuUse::NotLooked;
        }
        if watch.next_look().is_none_or(|due| now >= due) {
            self.look_at_cpu_waiting(now);
        }
        self.core.busy_watch().use_at(now)
    }

    /// The CPUs the pool may use.
    pub(super) fn cpu_count(&self) -> u32 {
        u32::try_from(self.core.busy_watch().cpus()).unwrap_or(u32::MAX)
    }

    /// A child was started: the last look no longer says how the pool
    /// uses the CPUs, and a fresh measurement decides.
    pub(super) fn cpu_changed(&mut self) {
        self.core.busy_changed();
    }

    /// Kernel dispatch: how much every serving child, busy or idle, waited
    /// for the CPUs since the last such look, per CPU (thousandths), when
    /// a look is due. A child the kernel woke for a connection waits for
    /// a CPU before it accepts and marks itself busy: on CPUs the clients
    /// share, most of a pool's waiting is there, out of the busy
    /// children's measure.
    /// Only while connections end or the width leaves children out: an
    /// idle pool is not looked at.
    pub(super) fn look_at_pool_waiting(&mut self, now: Instant) -> Option<(Instant, u32)> {
        let watch = self.core.pool_watch();
        let due = watch.next_look().is_none_or(|due| now >= due);
        let serving = watch.serving_at(now) || self.core.board().width().is_some();
        if due && serving {
            let turns: HashMap<i32, Turns> = self
                .core
                .board()
                .iter()
                .filter(|(_, s)| s.state.serves())
                .filter_map(|(_, s)| turns_of(s.pid).map(|t| (s.pid, t)))
                .collect();
            self.core.pool_looked(turns, now);
        }
        self.core.pool_watch().last_measure()
    }

    fn look_at_cpu_waiting(&mut self, now: Instant) {
        let turns: HashMap<i32, Turns> = self
            .core
            .board()
            .iter()
            .filter(|(_, s)| holds_work(s.state))
            .filter_map(|(_, s)| turns_of(s.pid).map(|t| (s.pid, t)))
            .collect();
        self.core.busy_looked(turns, now);
    }
}

/// A child's turns on the CPUs now: its scheduler statistics and whether
/// it is runnable (state `R` in `/proc/PID/stat`).
fn turns_of(pid: i32) -> Option<Turns> {
    Some(Turns {
        sched: procfs::sched_stat(pid)?,
        runnable: procfs::stat_of(pid).is_some_and(|s| s.state == 'R'),
    })
}
