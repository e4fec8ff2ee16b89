//! The dispatch width in the simulator: the world plays the CPUs, the
//! shell's looks at them, and the rule's two promises are checked: the
//! width's bound is where the width says, and it never holds a
//! connection back from an idle child while the CPUs have room.
//!
//! The simulated machine has [`CPUS`] CPUs. Every third connection sleeps
//! (a database, a slow client) and wants none; a worker serving any
//! other wants one. A look finds those workers waiting for the CPUs, half
//! a CPU's worth per worker beyond them, with a little noise; a burst
//! that finished nothing for [`HOLD_TURNOVER`] reads as stalled, as the
//! shell's watch says behind long requests.

use std::time::Instant;

use super::world::{Proc, MS};
use super::Sim;
use crate::policy::cpu_wait::Turns;
use crate::scaling::{CpuUse, HOLD_TURNOVER};

/// The simulated machine's CPUs.
pub(super) const CPUS: u32 = 2;

/// Every this many connections, one sleeps (wants no CPU).
const SLEEPS_EVERY: u64 = 3;

/// How long connections may wait with an idle child beyond the width
/// while the CPUs have room: a turn or two of the loop.
const HELD_BACK_AT_MOST: u64 = 50 * MS;

impl Sim {
    /// Looks at the simulated CPUs and moves the width, as the shell's
    /// `maintain_pool` does.
    pub(super) fn steer_width(&mut self, now: Instant) {
        let running = self.running();
        let (cpu, look) = if running < CPUS {
            (CpuUse::NotLooked, None)
        } else {
            let noise = self.world.rng.below(200) as u32;
            let per_cpu = (running - CPUS) * 500 + noise;
            let stalled = per_cpu >= crate::scaling::CPU_WAIT_HOLD
                && self
                    .last_finish
                    .is_none_or(|at| self.world.now - at >= HOLD_TURNOVER.as_nanos() as u64);
            let cpu = match self.world.rng.below(10) {
                0 => CpuUse::Measuring,
                _ if stalled => CpuUse::Stalled,
                _ => CpuUse::Waiting(per_cpu),
            };
            (cpu, Some((now, per_cpu)))
        };
        if self.scenario.kernel {
            // The shell's look at every serving child, on the core's
            // pace: each worker serving a connection that computes is
            // runnable and got no new turn (it wanted a CPU all along),
            // every other asleep with no CPU time (the world plays the
            // waiting above). The core measures at it what the
            // connections begun since were like, which opens the width to
            // long ones that sleep, and keeps it for long ones that work.
            if let Some(pids) = self.core.pool_look_due(now) {
                let turns = pids
                    .into_iter()
                    .map(|pid| (pid, self.turns_of(pid)))
                    .collect();
                self.core.pool_looked(turns, now);
            }
            let backlog = self.world.backlog.len() as u32;
            self.core.steer_width(cpu, look, || backlog, CPUS, now);
        }
    }

    /// A worker's turns on the CPUs, as the shell would read them.
    fn turns_of(&self, pid: i32) -> Turns {
        Turns {
            runnable: self.world.procs.get(&pid).is_some_and(computes),
            ..Turns::default()
        }
    }

    /// Workers serving a connection that computes: each wants a CPU.
    fn running(&self) -> u32 {
        self.world.procs.values().filter(|p| computes(p)).count() as u32
    }

    /// The width's bound sits just past its last serving child, and no
    /// connection waits long with an idle child left out while the CPUs
    /// have room.
    pub(super) fn check_width(&mut self) -> Result<(), String> {
        let board = &self.core.board;
        let serving: Vec<usize> = board
            .iter()
            .filter(|(_, s)| s.state.serves())
            .map(|(slot, _)| slot)
            .collect();
        let expected = board
            .width()
            .and_then(|w| serving.get(w.max(1) as usize - 1))
            .map(|slot| slot + 1);
        if board.dispatch_bound() != expected {
            return Err(format!(
                "width {:?} over serving slots {serving:?}: the bound is {:?}, not {expected:?}",
                board.width(),
                board.dispatch_bound()
            ));
        }
        if !self.core.config.hold_when_cpu_bound && board.width().is_some() {
            return Err("a width with the CPU hold off".into());
        }
        let held_back = self.core.shutdown.is_none()
            && !self.world.backlog.is_empty()
            && self.running() < CPUS
            && board.idle_slots().next().is_none()
            && board.counts().idle > 0;
        match (held_back, self.held_back_since) {
            (false, _) => self.held_back_since = None,
            (true, None) => self.held_back_since = Some(self.world.now),
            (true, Some(since)) if self.world.now - since > HELD_BACK_AT_MOST => {
                return Err(format!(
                    "connections waited {} ms with idle children beyond the width {:?} \
                     while the CPUs had room (board {}, bound {:?}, {} waiting, {} running, rolling {}, refork {})",
                    (self.world.now - since) / MS,
                    board.width(),
                    board.line(),
                    board.dispatch_bound(),
                    self.world.backlog.len(),
                    self.running(),
                    self.core.rolling(),
                    self.core.refork_wants_spare()
                ));
            }
            (true, Some(_)) => {}
        }
        Ok(())
    }
}

/// Whether a worker serves a connection that computes (wants a CPU).
fn computes(p: &Proc) -> bool {
    !p.exited && p.serving.is_some_and(|conn| conn % SLEEPS_EVERY != 0)
}
