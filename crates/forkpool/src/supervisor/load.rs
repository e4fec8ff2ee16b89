//! Children that serve many connections at once: what their load reports
//! mean, and how the pool's size is counted when what is spare is places
//! for connections rather than idle children.

use std::time::Instant;

use tracing::debug;

use super::Supervisor;
use crate::config::{ConfigError, PoolConfig};
use crate::protocol::ChildMessage;
use crate::scaling::{self, PlaceCounts, PoolCounts};

impl Supervisor {
    /// Whether this pool's children serve many connections at once.
    pub(super) fn hosts_sessions(&self) -> bool {
        self.core.board.session_capacity().is_some()
    }

    /// Refuses a report of the wrong kind for this pool's children: load
    /// from a one-connection child, idle/busy/missed from a many-connection
    /// one.
    pub(super) fn check_report_kind(&self, msg: &ChildMessage) -> Result<(), String> {
        let hosts = self.hosts_sessions();
        match msg {
            ChildMessage::Load { .. } if !hosts => {
                Err("sent a load report, but this pool runs one connection per child".into())
            }
            ChildMessage::Idle | ChildMessage::Busy | ChildMessage::Missed | ChildMessage::Next
                if hosts =>
            {
                Err(format!(
                    "sent {msg:?}, but this pool's children serve many connections and \
                 report their load instead"
                ))
            }
            _ => Ok(()),
        }
    }

    /// `Load` (`L`): the child's load. A child that has room again takes
    /// the connections parked for want of one first; one that finished
    /// connections may be past a limit and is recycled (see `recycle.rs`).
    pub(super) fn on_load(
        &mut self,
        slot: usize,
        open: u32,
        capacity: u32,
        received: u32,
        now: Instant,
    ) -> Result<(), String> {
        self.core
            .board
            .report_load(slot, open, capacity, received, now)
            .map_err(|e| format!("sent an impossible load report: {e}"))?;
        let in_flight = self
            .core
            .board
            .get(slot)
            .and_then(|s| s.load)
            .map_or(0, |load| load.in_flight());
        debug!(slot, open, capacity, in_flight, "load report");
        self.child_available(now);
        self.recycle_after_connection(slot, now);
        Ok(())
    }

    /// The pool as the scaling policy sees it. The backlog only matters
    /// when no child has room: otherwise every waiting connection is about
    /// to be dispatched. (A many-connection child with free places that
    /// is catching up on connections in flight still has room.)
    pub(super) fn scaling_counts(&self) -> PoolCounts {
        let counts = self.core.board.counts();
        let room = match self.core.board.session_capacity() {
            None => self.core.board.has_room(),
            Some(_) => self.core.board.free_places() > 0,
        };
        let queued = if room { 0 } else { self.queued() };
        match self.core.board.session_capacity() {
            None => PoolCounts {
                starting: counts.starting,
                idle: counts.idle,
                busy: counts.busy,
                queued,
                cpu: scaling::CpuUse::NotLooked,
                start_limit: if self.core.config.hold_when_cpu_bound {
                    self.cpu_count()
                } else {
                    0
                },
            },
            Some(per_child) => scaling::in_child_equivalents(
                PlaceCounts {
                    starting: counts.starting,
                    serving: counts.idle + counts.busy,
                    free: self.core.board.free_places(),
                    queued,
                },
                per_child,
            ),
        }
    }

    /// A configuration read on reload must suit the children this pool
    /// runs: many-connection children get their connections by handoff.
    pub(super) fn check_reloaded_config(&self, config: &PoolConfig) -> Result<(), ConfigError> {
        if self.hosts_sessions() {
            config.validate_for_sessions()?;
        }
        if config.preload && !self.capture_output {
            return Err(ConfigError {
                field: "preload",
                message: "preload is for pools that run a command (`forkpool run`); \
                          this pool's children are forked from the loaded supervisor"
                    .to_string(),
            });
        }
        Ok(())
    }
}
