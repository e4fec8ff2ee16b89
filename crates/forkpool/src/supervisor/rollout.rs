//! The shell's side of a reload: the rules and the rollout's state are the
//! core's (`core/rollout.rs`); here the listeners are watched as the
//! dispatch mode in force wants, and a failed reload is logged with the
//! failed child's stderr and told to systemd.
//!
//! A new child that fails at start-up (exits, cannot exec, misses its
//! start deadline) abandons the rollout: the configuration that was
//! serving comes back, the new generation's children are told to quit,
//! the log says `reload failed: ...; generation N keeps serving`, and
//! systemd gets `READY=1` with a `STATUS=` saying the same.

use std::time::Instant;

use tracing::error;

use super::{notify, Supervisor};
use crate::core::ReloadFailed;

impl Supervisor {
    /// Carries out [`crate::core::Effect::Rewatch`]: the listeners are
    /// watched if the dispatch mode now in force wants it, and no longer
    /// if the one before did and this one does not.
    pub(super) fn rewatch(&mut self, was_watching: bool, now: Instant) {
        if was_watching && !self.core.config.dispatch.parent_watches_listeners() {
            self.unwatch_listeners();
        }
        if let Err(e) = self.watch_listeners(now) {
            error!("cannot watch the listeners after the reload: {e}");
        }
    }

    /// Logs a reload its new generation's failed start abandoned, quoting
    /// the last lines of the failed child's stderr, and tells systemd.
    pub(super) fn log_reload_failed(&self, failed: &ReloadFailed, stderr: &[String]) {
        let said = if stderr.is_empty() {
            String::from("(nothing on stderr)")
        } else {
            format!("stderr: {}", stderr.join(" | "))
        };
        error!(
            "reload failed: a worker of generation {} {}; {said}; generation {} keeps serving",
            failed.failed, failed.how, failed.serving
        );
        notify::ready_with_status(&format!(
            "reload failed: generation {} did not start; generation {} keeps serving",
            failed.failed, failed.serving
        ));
    }
}
