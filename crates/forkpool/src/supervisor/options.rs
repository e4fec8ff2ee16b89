//! What the pool was built with (`Pool`'s builder and `forkpool run`),
//! fixed for the supervisor's life: how children are started, where a
//! reload reads from, and what outlives the pool.

use super::ReloadSource;
use crate::config::Credentials;

/// The shell's settings from the builder.
#[derive(Default)]
pub(crate) struct ShellOptions {
    /// Give each child a pipe for its stderr and log what comes out
    /// (exec'd workers, see `output.rs`).
    pub capture_output: bool,
    /// In `handoff` dispatch, give children the listeners so that one
    /// finishing a connection may take the next waiting one itself
    /// (`Next`, see `worker.rs`). Off only for many-connection children.
    pub children_take_next: bool,
    /// Reads the configuration again on SIGHUP.
    pub reload_source: Option<ReloadSource>,
    /// The listeners came from systemd socket activation and outlive this
    /// process: a stop leaves their backlog to the next start.
    pub listeners_outlive_pool: bool,
    /// Who children run as, if not the supervisor's own user.
    pub credentials: Option<Credentials>,
}
