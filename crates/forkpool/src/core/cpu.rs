//! How the pool uses the CPUs, as the core keeps it: two watches of the
//! run-queue looks (`policy::cpu_wait`), one over the busy children (the
//! scaling hold) and one over every serving child (the dispatch width),
//! and the moments the loop must wake for their next looks. The shell
//! reads `/proc` when a look is due and hands the core what it found.

use std::time::Instant;

use super::child::HasChild;
use super::Core;
use crate::policy::cpu_wait::{CpuWatch, Turns, LOOK_INTERVAL};
use std::collections::HashMap;

/// The core's two watches.
#[derive(Debug, Default)]
pub(crate) struct Watches {
    /// Over the busy children: the scaling policy's hold.
    busy: CpuWatch,
    /// Over every serving child, busy or idle: the dispatch width.
    pool: CpuWatch,
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

    /// A look at the busy children's turns on the CPUs, at `now`.
    pub fn busy_looked(&mut self, turns: HashMap<i32, Turns>, now: Instant) {
        self.watches.busy.look(turns, now);
    }

    /// A look at every serving child's turns on the CPUs, at `now`.
    pub fn pool_looked(&mut self, turns: HashMap<i32, Turns>, now: Instant) {
        self.watches.pool.look(turns, now);
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
