//! Workers that fail as they start: exponential back-off, pool-wide.
//!
//! A worker that cannot start (a missing program, a bad configuration, a
//! crash on import) dies again each time it is replaced. Replacing it at
//! once would fork as fast as the machine allows, for nothing. So each
//! start-up failure doubles a delay that holds back every spawn (100 ms,
//! 200 ms, … up to 30 s), and only a child *started after the last
//! failure* that proves it can start resets it: siblings that were already
//! up before the failures began prove nothing about new starts (the code
//! on disk may have changed since they started). A fork that fails for
//! lack of resources (`EAGAIN`, `ENOMEM`, no descriptors) counts as a
//! failure too.
//!
//! A start is *proven* once the child has said `Ready` (protocol modes)
//! and has been alive for [`START_WINDOW`]; in `none` mode, where there is
//! no `Ready`, surviving the window is the proof. A child that dies or is
//! killed before its start is proven is a start-up failure, unless the
//! supervisor asked it to stop.

use std::time::{Duration, Instant};

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
    /// When the last failure happened.
    last_failure: Option<Instant>,
}

impl StartBackoff {
    /// One more failure at `now`: returns how long to hold spawns back.
    pub fn failed(&mut self, now: Instant) -> Duration {
        let delay = self
            .delay
            .map_or(FIRST_DELAY, |d| d.saturating_mul(2).min(MAX_DELAY));
        self.delay = Some(delay);
        self.last_failure = Some(now);
        delay
    }

    /// A child forked at `spawned_at` proved its start: that ends the run
    /// of failures only if it was started after the last one.
    pub fn proven(&mut self, spawned_at: Instant) {
        if self.last_failure.is_none_or(|t| spawned_at > t) {
            self.reset();
        }
    }

    /// Forget the run: the next failure starts from the first delay.
    pub fn reset(&mut self) {
        *self = StartBackoff::default();
    }
}

/// Whether a child forked at `spawned_at` has proven its start by `now`:
/// it is ready (said so, or never will) and has lived through
/// [`START_WINDOW`].
pub(crate) fn start_proven(ready: bool, spawned_at: Instant, now: Instant) -> bool {
    ready && now.saturating_duration_since(spawned_at) >= START_WINDOW
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_doubles_up_to_the_cap_and_resets() {
        let mut b = StartBackoff::default();
        let now = Instant::now();
        let delays: Vec<Duration> = (0..12).map(|_| b.failed(now)).collect();
        assert_eq!(delays[0], Duration::from_millis(100));
        assert_eq!(delays[1], Duration::from_millis(200));
        assert_eq!(delays[4], Duration::from_millis(1600));
        assert_eq!(delays[11], MAX_DELAY);
        assert!(delays.windows(2).all(|w| w[0] <= w[1]));
        b.reset();
        assert_eq!(b.failed(now), FIRST_DELAY);
    }

    #[test]
    fn only_a_start_after_the_last_failure_ends_the_run() {
        let t0 = Instant::now();
        let mut b = StartBackoff::default();
        let healthy_sibling = t0;
        b.failed(t0 + Duration::from_secs(1));
        b.failed(t0 + Duration::from_secs(2));
        // A sibling started before the failures proves nothing.
        b.proven(healthy_sibling);
        assert_eq!(b.failed(t0 + Duration::from_secs(3)), FIRST_DELAY * 4);
        // A child started after the last failure that proves itself does.
        b.proven(t0 + Duration::from_secs(4));
        assert_eq!(b.failed(t0 + Duration::from_secs(6)), FIRST_DELAY);
    }

    #[test]
    fn a_proven_start_with_no_failures_changes_nothing() {
        let mut b = StartBackoff::default();
        b.proven(Instant::now());
        assert_eq!(b, StartBackoff::default());
    }

    #[test]
    fn a_start_is_proven_by_being_ready_through_the_window() {
        let t0 = Instant::now();
        assert!(!start_proven(true, t0, t0 + START_WINDOW / 2));
        assert!(start_proven(true, t0, t0 + START_WINDOW));
        assert!(!start_proven(false, t0, t0 + START_WINDOW * 10));
    }
}
