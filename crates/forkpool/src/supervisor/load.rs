//! Children that serve many connections at once: what their load reports
//! mean, and how the pool's size is counted when what is spare is places
//! for connections rather than idle children.

use super::Supervisor;
use crate::config::{ConfigError, PoolConfig};
use crate::scaling::PoolCounts;

impl Supervisor {
    /// The pool as the scaling policy sees it. The backlog only matters
    /// when no child has room: otherwise every waiting connection is about
    /// to be dispatched. (A many-connection child with free places that
    /// is catching up on connections in flight still has room.)
    pub(super) fn scaling_counts(&self) -> PoolCounts {
        let cpus = self.cpu_count();
        self.core.pool_counts(|| self.queued(), cpus)
    }

    /// A configuration read on reload must suit the children this pool
    /// runs: many-connection children get their connections by handoff.
    pub(super) fn check_reloaded_config(&self, config: &PoolConfig) -> Result<(), ConfigError> {
        if self.core.hosts_sessions() {
            config.validate_for_sessions()?;
        }
        if config.preload && !self.options.capture_output {
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
