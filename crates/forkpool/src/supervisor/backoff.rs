//! Workers that fail as they start: exponential back-off, pool-wide.
//!
//! A worker that cannot start (a missing program, a bad configuration, a
//! crash on import) dies again each time it is replaced. Replacing it at
//! once would fork as fast as the machine allows, for nothing. So each
//! start-up failure doubles a delay that holds back every spawn (100 ms,
//! 200 ms, … up to 30 s), and a worker that proves it can start resets it.
//!
//! A start is *proven* once the child has said `Ready` (protocol modes)
//! and has been alive for [`START_WINDOW`]; in `none` mode, where there is
//! no `Ready`, surviving the window is the proof. A child that dies or is
//! killed before its start is proven is a start-up failure, unless the
//! supervisor asked it to stop.

use std::time::{Duration, Instant};

use tracing::error;

use super::{ChildLink, Supervisor};
use crate::sys::process::ExitStatus;

/// How long a child must live before its start counts as proven.
pub(crate) const START_WINDOW: Duration = Duration::from_secs(1);
/// The delay after the first failure in a row.
const FIRST_DELAY: Duration = Duration::from_millis(100);
/// The longest delay.
const MAX_DELAY: Duration = Duration::from_secs(30);

/// The current run of start-up failures.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StartBackoff {
    /// The delay after the last failure; `None` when the last start worked.
    delay: Option<Duration>,
}

impl StartBackoff {
    /// One more failure: returns how long to hold spawns back.
    pub fn failed(&mut self) -> Duration {
        let delay = self
            .delay
            .map_or(FIRST_DELAY, |d| d.saturating_mul(2).min(MAX_DELAY));
        self.delay = Some(delay);
        delay
    }

    /// A start was proven: the next failure starts from the first delay.
    pub fn reset(&mut self) {
        self.delay = None;
    }
}

impl ChildLink {
    /// Whether this child has shown that the worker can start.
    pub(crate) fn start_proven(&self, now: Instant) -> bool {
        self.ready && now.duration_since(self.spawned_at) >= START_WINDOW
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
            self.start_backoff.reset();
            return None;
        }
        if asked_to_stop || self.shutdown.is_some() {
            return None;
        }
        // A sibling that is up and proven shows the command works; this
        // one failed for its own reasons, so the run starts over.
        let others_fine = self.links.iter().flatten().any(|l| l.start_proven(now));
        if others_fine {
            self.start_backoff.reset();
        }
        let delay = self.start_backoff.failed();
        let until = now + delay;
        self.spawn_blocked_until = Some(self.spawn_blocked_until.map_or(until, |t| t.max(until)));
        let how = match &link.leaving {
            Some(reason) => format!("killed: {reason}"),
            None => status.to_string(),
        };
        // In `none` mode `ready` is set from the start: the first second
        // is all the start-up there is.
        let when = if link.ready && self.config.dispatch.speaks_protocol() {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_doubles_up_to_the_cap_and_resets() {
        let mut b = StartBackoff::default();
        let delays: Vec<Duration> = (0..12).map(|_| b.failed()).collect();
        assert_eq!(delays[0], Duration::from_millis(100));
        assert_eq!(delays[1], Duration::from_millis(200));
        assert_eq!(delays[4], Duration::from_millis(1600));
        assert_eq!(delays[11], MAX_DELAY);
        assert!(delays.windows(2).all(|w| w[0] <= w[1]));
        b.reset();
        assert_eq!(b.failed(), FIRST_DELAY);
    }
}
