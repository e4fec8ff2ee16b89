//! Holding spawns back while workers fail at start-up: the judgement of
//! each reaped child's start, and the log line that explains it. The rule
//! (what proves a start, how the delay grows) is `policy::backoff`.

use std::time::Instant;

use tracing::error;

use super::{ChildLink, LeaveCause, Supervisor};
use crate::policy::backoff::{self, START_WINDOW};
use crate::sys::process::ExitStatus;

impl ChildLink {
    /// Whether this child has shown that the worker can start.
    pub(crate) fn start_proven(&self, now: Instant) -> bool {
        backoff::start_proven(self.is_ready(), self.spawned_at, now)
    }
}

impl Supervisor {
    /// Called for every child reaped: a start-up failure holds spawns
    /// back; a proven start ends the current run of failures. Returns how
    /// the child failed at start-up, if it did.
    pub(super) fn judge_start(
        &mut self,
        link: &ChildLink,
        status: ExitStatus,
        asked_to_stop: bool,
        now: Instant,
    ) -> Option<String> {
        if link.start_proven(now) {
            self.start_backoff.proven(link.spawned_at);
            return None;
        }
        if asked_to_stop || self.shutdown.is_some() {
            return None;
        }
        // A child started since the last failure that is up and proven
        // shows new starts work again; one that was up before proves
        // nothing about them.
        for (_, child) in self.board.iter() {
            if child.link.start_proven(now) {
                self.start_backoff.proven(child.link.spawned_at);
            }
        }
        let delay = self.start_backoff.failed(now);
        let until = now + delay;
        self.spawn_blocked_until = Some(self.spawn_blocked_until.map_or(until, |t| t.max(until)));
        let how = match link.leaving.as_ref().map(|l| &l.cause) {
            Some(LeaveCause::Killed(reason)) => format!("killed: {reason}"),
            _ => status.to_string(),
        };
        // In `none` mode `ready` is set from the start: the first second
        // is all the start-up there is.
        let when = if link.is_ready() && self.config.dispatch.speaks_protocol() {
            format!("within {START_WINDOW:?} of starting")
        } else {
            "during start-up".to_string()
        };
        error!(
            "worker exited {when} ({how}); check the command and its stderr: retrying in {delay:?}"
        );
        Some(format!("exited {when} ({how})"))
    }
}
