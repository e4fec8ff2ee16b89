//! Lines the supervisor logs at most now and then (a pool held at
//! `max_children`, replacements held back by the rate, the CPU hold, the
//! child-states line): when each was last logged.

use std::time::Instant;

/// When each paced line was last logged.
#[derive(Debug, Default)]
pub(super) struct LogPace {
    /// Replacements wait for the spawn rate.
    pub replacements_held: Option<Instant>,
    /// The pool is at `max_children` with no idle child.
    pub saturated: Option<Instant>,
    /// The pool holds its growth while the CPUs are taken.
    pub cpu_bound: Option<Instant>,
    /// The child-states line, and the board's change count it showed.
    pub scoreboard: (Option<Instant>, u64),
}
