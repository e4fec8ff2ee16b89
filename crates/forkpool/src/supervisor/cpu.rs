//! How long the busy children wait for the CPUs: the supervisor's side of
//! `policy::cpu_wait`. It reads each busy child's run-queue waiting
//! (`/proc/PID/schedstat`, a few microseconds per child) when the core
//! says a look is due (`core/cpu.rs`), and hands them to the core.

use std::collections::HashMap;
use std::time::Instant;

use super::Supervisor;
use crate::observe::procfs;
use crate::policy::cpu_wait::Turns;
use crate::scaling::CpuUse;

impl Supervisor {
    /// How the busy children use the CPUs, for the scaling rule: looks at
    /// their turns on the CPUs when the core says a look is due.
    pub(super) fn cpu_use(&mut self, now: Instant) -> CpuUse {
        if let Some(pids) = self.core.busy_look_due(now) {
            self.core.busy_looked(turns_of_all(&pids), now);
        }
        self.core.cpu_use(now)
    }

    /// The CPUs the pool may use.
    pub(super) fn cpu_count(&self) -> u32 {
        u32::try_from(self.core.busy_watch().cpus()).unwrap_or(u32::MAX)
    }

    /// Every serving child's turns on the CPUs, looked at when the core
    /// says a look is due (kernel dispatch's width); returns the last
    /// measure.
    pub(super) fn look_at_pool_waiting(&mut self, now: Instant) -> Option<(Instant, u32)> {
        if let Some(pids) = self.core.pool_look_due(now) {
            self.core.pool_looked(turns_of_all(&pids), now);
        }
        self.core.pool_watch().last_measure()
    }
}

/// The turns on the CPUs of each of `pids` that can be read.
fn turns_of_all(pids: &[i32]) -> HashMap<i32, Turns> {
    let read = pids.iter().filter_map(|&pid| Some((pid, turns_of(pid)?)));
    read.collect()
}

/// A child's turns on the CPUs now: its scheduler statistics and whether
/// it is runnable (state `R` in `/proc/PID/stat`).
fn turns_of(pid: i32) -> Option<Turns> {
    Some(Turns {
        sched: procfs::sched_stat(pid)?,
        runnable: procfs::stat_of(pid).is_some_and(|s| s.state == 'R'),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_are_read_for_each_child_that_can_be_read() {
        let me = std::process::id() as i32;
        // The highest pid the kernel can give is below this.
        let gone = 1 << 23;
        let turns = turns_of_all(&[me, gone]);
        assert_eq!(turns.keys().copied().collect::<Vec<_>>(), [me]);
    }
}
