//! The supervisor's core: every child's state and every rule that moves
//! it, with no I/O. It is fed inputs (a child's report, a child reaped, a
//! closed channel, a stop, the time) and answers with effects (send this,
//! signal that child, stop reading that channel, spawn), which the shell
//! in `supervisor/` carries out. The simulator in `core/sim` drives the
//! very same code with a fake clock and simulated children.

pub(crate) mod child;

use std::time::Instant;

use crate::config::PoolConfig;
use crate::policy::backoff::SpawnGate;
use crate::scaling::ScalingMemory;
use crate::scoreboard::Scoreboard;
use crate::status::Totals;
use child::HasChild;

/// The shutdown in progress, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shutdown {
    /// Children still there are killed at this moment.
    pub deadline: Instant,
    /// The supervisor exits at this moment, whatever is left.
    pub exit_by: Instant,
}

/// Every child's state and the memory of the rules, with no I/O. `L` is
/// what the shell keeps per child beside the core's [`child::Child`].
pub(crate) struct Core<L> {
    /// The pool's settings (replaced by a reload).
    pub config: PoolConfig,
    /// The children, slot by slot.
    pub board: Scoreboard<L>,
    /// What happened so far, for status and metrics.
    pub totals: Totals,
    /// The generation new children are started in.
    pub generation: u32,
    /// The sequence number of the last ping sent.
    pub ping_seq: u32,
    /// The stop in progress, if any.
    pub shutdown: Option<Shutdown>,
    /// What holds spawns back: a run of start-up failures, and the rate
    /// of replacing workers that had started (`policy/backoff.rs`).
    pub spawn_gate: SpawnGate,
    /// What the scaling rule remembers between turns.
    pub memory: ScalingMemory,
}

impl<L: HasChild> Core<L> {
    /// A core for `config` with no children yet.
    pub fn new(config: PoolConfig) -> Core<L> {
        Core {
            config,
            board: Scoreboard::new(),
            totals: Totals::default(),
            generation: 1,
            ping_seq: 0,
            shutdown: None,
            spawn_gate: SpawnGate::default(),
            memory: ScalingMemory::default(),
        }
    }
}
