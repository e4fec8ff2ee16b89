//! Binary upgrades (SIGUSR2) in the simulator: the operator asks now and
//! then; the new supervisor becomes ready in time (this one then stops
//! gracefully, as the hand-over does), exits before it is ready, or hangs
//! until its deadline, when the shell kills it. The core decides each
//! step (`core/upgrade.rs`); the checks: an upgrade never outlives its
//! deadline by more than a turn, and every failed one is counted.

use super::world::{Happening, StopKind, MS};
use super::Sim;
use crate::core::Input;
use crate::sys::process::ExitStatus;

/// The longest a turn of the simulated loop may run past a deadline.
const TURN: u64 = 50 * MS;

impl Sim {
    /// SIGUSR2: a new supervisor starts, and its fate is drawn.
    pub(super) fn upgrade_happens(&mut self) {
        let every = self.scenario.upgrade_every;
        let next = every / 2 + self.world.rng.below(every);
        self.world.at(next, Happening::Upgrade);
        let now = self.now();
        if self.core.may_upgrade(true).is_err() {
            return;
        }
        let pid = self.world.next_pid;
        self.world.next_pid += 1;
        self.successors.push(pid);
        self.outcome.upgrades += 1;
        let successor = self.core.successor_started(pid, now);
        let within = successor.timeout.as_nanos() as u64;
        match self.world.rng.below(10) {
            // Ready in time: one in ten, since it ends the run's serving.
            0 => {
                let at = self.world.rng.below(within);
                self.world.at(at, Happening::Successor(pid, true));
            }
            1..=5 => {
                let at = self.world.rng.below(within);
                self.world.at(at, Happening::Successor(pid, false));
            }
            // Hangs: the shell's look at its deadline kills it.
            _ => {}
        }
    }

    /// The new supervisor `pid` says it is ready (`true`), or exits.
    pub(super) fn successor_says(&mut self, pid: i32, ready: bool) {
        let now = self.now();
        if self.core.successor().map(|s| s.pid) != Some(pid) {
            return;
        }
        if ready {
            self.core.successor_ready();
            self.outcome.handed_over += 1;
            if self.core.shutdown.is_none() {
                self.core.on(Input::Stop(StopKind::Graceful.stop()), now);
            }
        } else {
            let status = ExitStatus::Code(1);
            self.core.on(Input::Reaped { pid, status }, now);
        }
    }

    /// The shell's look at the upgrade each turn: a successor past its
    /// deadline is killed (and reaped a moment later), the upgrade failed.
    pub(super) fn check_upgrade(&mut self) -> Result<(), String> {
        let now = self.now();
        let Some(late) = self.core.successor_late(now) else {
            return Ok(());
        };
        let over = now.saturating_duration_since(late.deadline).as_nanos() as u64;
        if over > TURN {
            return Err(format!(
                "the upgrade's successor {} outlived its deadline by {over} ns",
                late.pid
            ));
        }
        self.core.upgrade_failed();
        self.world.at(MS, Happening::Reap(late.pid));
        Ok(())
    }
}
