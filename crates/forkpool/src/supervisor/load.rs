//! Children that serve many connections at once: what their load reports
//! mean, and how the pool's size is counted when what is spare is places
//! for connections rather than idle children.

use super::Supervisor;
use crate::config::{ConfigError, PoolConfig};
use crate::scaling::{self, PlaceCounts, PoolCounts};

impl Supervisor {
    /// Whether this pool's children serve many connections at once.
    pub(super) fn hosts_sessions(&self) -> bool {
        self.core.hosts_sessions()
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
