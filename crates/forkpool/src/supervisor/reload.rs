//! Changing the pool while it runs: SIGHUP rolls the children to a new
//! generation under a freshly read configuration; SIGTTIN and SIGTTOU move
//! the spare-children target by one.

use std::time::Instant;

use crate::core::slot_limit;
use tracing::{error, info};

use super::Supervisor;
use crate::config::PoolConfig;

/// Where a reload reads the new configuration from.
pub type ReloadSource = Box<dyn FnMut() -> Result<PoolConfig, String>>;

impl Supervisor {
    /// SIGHUP: read the configuration again and roll to a new generation
    /// (see `rollout.rs`): a canary first, then the rest, each old child
    /// retiring only once a new one is ready to take its place. A
    /// configuration that cannot be read or does not validate is logged and
    /// nothing changes.
    pub(super) fn reload(&mut self, now: Instant) {
        let config = match self.reload_source.as_mut() {
            Some(read) => match read() {
                Ok(config) => config,
                Err(e) => {
                    error!("reload failed, keeping the running configuration: {e}");
                    self.core.totals.reloads_refused += 1;
                    return;
                }
            },
            None => self.core.config.clone(),
        };
        if let Err(e) = config.validate() {
            error!("reload refused, keeping the running configuration: {e}");
            self.core.totals.reloads_refused += 1;
            return;
        }
        let mut config = config;
        config.dispatch = self.settled_mode(config.dispatch);
        let kernel = |c: &PoolConfig| c.dispatch == crate::config::DispatchMode::Kernel;
        if kernel(&config) != kernel(&self.core.config) {
            // Each slot's socket and the program are set up at start.
            error!("reload refused: switching dispatch to or from 'kernel' needs a restart");
            self.core.totals.reloads_refused += 1;
            return;
        }
        if kernel(&config) && slot_limit(config.max_children, true) > self.kernel_slots() {
            error!(
                "reload refused: kernel dispatch was set up for {} slots; raising max_children \
                 past {} needs a restart",
                self.kernel_slots(),
                self.kernel_slots() / 2
            );
            self.core.totals.reloads_refused += 1;
            return;
        }
        let no_protocol = |c: &PoolConfig| !c.dispatch.speaks_protocol();
        if no_protocol(&config) != no_protocol(&self.core.config) {
            // `none` makes the shared listeners blocking, which the
            // supervisor itself cannot accept from in the other modes.
            error!("reload refused: switching dispatch to or from 'none' needs a restart");
            self.core.totals.reloads_refused += 1;
            return;
        }
        if let Err(e) = self.check_reloaded_config(&config) {
            error!("reload refused, keeping the running configuration: {e}");
            self.core.totals.reloads_refused += 1;
            return;
        }
        if config.backlog != self.core.config.backlog {
            info!(
                "backlog changes apply to new listeners only; restart or upgrade (USR2) to apply"
            );
        }
        if config.defer_accept != self.core.config.defer_accept {
            let applied = self
                .listeners
                .iter()
                .try_for_each(|l| l.listener.set_defer_accept(config.defer_accept))
                .and_then(|()| self.follow_defer_accept());
            if let Err(e) = applied {
                error!("reload refused, keeping the running configuration: {e}");
                self.core.totals.reloads_refused += 1;
                return;
            }
        }
        let watching_before = self.core.config.dispatch.parent_watches_listeners();
        self.core.totals.reloads += 1;
        self.begin_rollout(config);
        if watching_before && !self.core.config.dispatch.parent_watches_listeners() {
            self.unwatch_listeners();
        }
        if let Err(e) = self.watch_listeners(now) {
            error!("cannot watch the listeners after reload: {e}");
        }
    }

    /// SIGTTIN (+1) and SIGTTOU (-1): move the spare target at run time.
    pub(super) fn adjust_spare(&mut self, delta: i64) {
        let min_spare = (i64::from(self.core.config.min_spare) + delta)
            .clamp(0, i64::from(self.core.config.max_children)) as u32;
        self.core.config.min_spare = min_spare;
        self.core.config.max_spare = self.core.config.max_spare.max(min_spare);
        info!(
            min_spare = self.core.config.min_spare,
            max_spare = self.core.config.max_spare,
            "spare-children target changed (until the next reload)"
        );
    }
}
