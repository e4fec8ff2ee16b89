//! Changing the pool while it runs: SIGHUP rolls the children to a new
//! generation under a freshly read configuration (the rollout is the
//! core's, `core/rollout.rs`); SIGTTIN and SIGTTOU move the spare-children
//! target by one.
//!
//! The shell's side of a reload is here: the configuration read and
//! checked for what only the shell can check, the listeners watched as
//! the dispatch mode in force wants, and a failed reload logged with the
//! failed child's stderr and told to systemd. A new child that fails at
//! start-up (exits, cannot exec, misses its start deadline) abandons the
//! rollout: the configuration that was serving comes back, the new
//! generation's children are told to quit, the log says `reload failed:
//! ...; generation N keeps serving`, and systemd gets `READY=1` with a
//! `STATUS=` saying the same.

use std::time::Instant;

use tracing::{error, info};

use super::{notify, Supervisor};
use crate::config::PoolConfig;
use crate::core::{slot_limit, Input, ReloadFailed};

/// Where a reload reads the new configuration from.
pub type ReloadSource = Box<dyn FnMut() -> Result<PoolConfig, String>>;

impl Supervisor {
    /// SIGHUP: read the configuration again and roll to a new generation
    /// (see `rollout.rs`): a canary first, then the rest, each old child
    /// retiring only once a new one is ready to take its place. A
    /// configuration that cannot be read or does not validate is logged and
    /// nothing changes.
    pub(super) fn reload(&mut self, now: Instant) {
        let config = self.read_reloaded_config().map(Box::new);
        self.core.on(Input::Reload(config), now);
        self.carry_out(now);
    }

    /// The configuration read again and checked for what only the shell
    /// can check (the command the pool runs, the listeners' options,
    /// applied here), or why it cannot be used.
    fn read_reloaded_config(&mut self) -> Result<PoolConfig, String> {
        let config = match self.options.reload_source.as_mut() {
            Some(read) => read().map_err(|e| format!("cannot read the configuration: {e}"))?,
            None => self.core.config().clone(),
        };
        let mut config = config;
        config.dispatch = self.settled_mode(config.dispatch);
        kernel_refuses(self.core.config(), &config, self.kernel_slots())?;
        self.core.reloadable(&config)?;
        self.check_reloaded_config(&config)
            .map_err(|e| e.to_string())?;
        if config.backlog != self.core.config().backlog {
            info!(
                "backlog changes apply to new listeners only; restart or upgrade (USR2) to apply"
            );
        }
        if config.defer_accept != self.core.config().defer_accept {
            self.listeners
                .iter()
                .try_for_each(|l| l.listener.set_defer_accept(config.defer_accept))
                .and_then(|()| self.follow_defer_accept())
                .map_err(|e| format!("cannot set defer_accept on the listeners: {e}"))?;
        }
        if config.merge_pages != self.core.config().merge_pages {
            super::merge_pages::apply(config.merge_pages)?;
        }
        Ok(config)
    }

    /// SIGTTIN (+1) and SIGTTOU (-1): move the spare target at run time.
    pub(super) fn adjust_spare(&mut self, delta: i64) {
        let (min_spare, max_spare) = self.core.move_spare(delta);
        info!(
            min_spare,
            max_spare, "spare-children target changed (until the next reload)"
        );
    }

    /// Carries out [`crate::core::Effect::Rewatch`]: the listeners are
    /// watched if the dispatch mode now in force wants it, and no longer
    /// if the one before did and this one does not.
    pub(super) fn rewatch(&mut self, was_watching: bool, now: Instant) {
        if was_watching && !self.core.config().dispatch.parent_watches_listeners() {
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

/// Why kernel dispatch, set up for `slots` slots under `serving`, cannot
/// take `config` without a restart: a switch to or from it (each slot's
/// socket and the program are set up at start), or more slots than its
/// scoreboard has (a rollout takes twice `max_children`).
fn kernel_refuses(serving: &PoolConfig, config: &PoolConfig, slots: usize) -> Result<(), String> {
    let kernel = |c: &PoolConfig| c.dispatch == crate::config::DispatchMode::Kernel;
    if kernel(config) != kernel(serving) {
        return Err("switching dispatch to or from 'kernel' needs a restart".into());
    }
    if kernel(config) && slot_limit(config.max_children, true) > slots {
        return Err(format!(
            "kernel dispatch was set up for {slots} slots; raising max_children past {} needs \
             a restart",
            slots / 2
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DispatchMode;

    fn config(dispatch: DispatchMode, max_children: u32) -> PoolConfig {
        PoolConfig {
            dispatch,
            max_children,
            ..PoolConfig::default()
        }
    }

    #[test]
    fn kernel_dispatch_takes_a_reload_within_its_slots_only() {
        let kernel = config(DispatchMode::Kernel, 8);
        assert_eq!(
            kernel_refuses(&kernel, &config(DispatchMode::Kernel, 8), 16),
            Ok(())
        );
        let more = kernel_refuses(&kernel, &config(DispatchMode::Kernel, 9), 16);
        assert!(more.is_err_and(|why| why.contains("past 8")));
        let switch = kernel_refuses(&kernel, &config(DispatchMode::Handoff, 8), 16);
        assert!(switch.is_err_and(|why| why.contains("needs a restart")));
        let handoff = config(DispatchMode::Handoff, 8);
        assert!(kernel_refuses(&handoff, &config(DispatchMode::Kernel, 8), 0).is_err());
        // Without kernel dispatch, slots are not its to count.
        assert_eq!(
            kernel_refuses(&handoff, &config(DispatchMode::Handoff, 500), 0),
            Ok(())
        );
    }
}
