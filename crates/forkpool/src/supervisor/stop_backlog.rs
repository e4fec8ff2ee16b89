//! A graceful stop serves the backlog: connections the kernel had already
//! queued on the listeners when the stop came (and any parked in the
//! supervisor) are accepted and served before the listeners close, instead
//! of being reset when the supervisor exits.
//!
//! At the stop the supervisor counts what waits (the kernel's listen-queue
//! figure plus parked connections) and keeps running as usual until that
//! many more connections have been dispatched, or nothing waits any more,
//! or `shutdown_timeout` has passed; then the ordinary graceful stop
//! begins. Counting, not "until the backlog is empty", so a stream of new
//! connections cannot hold the stop off.
//!
//! Skipped when `serve_backlog_on_stop` is off, when the listeners came
//! from systemd socket activation (they outlive the supervisor: systemd
//! keeps the queue for the next start), and for `dispatch = none`, whose
//! children do not report what they accept.

use std::time::Instant;

use tracing::info;

use super::Supervisor;

/// The backlog being served before a stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BacklogFinish {
    /// `totals.accepted` at which everything queued at the stop is served.
    target: u64,
    /// Stop anyway at this time.
    until: Instant,
}

impl BacklogFinish {
    /// What waited at the stop: `queued` in the kernel, `parked` in the
    /// supervisor, with `accepted` dispatched so far.
    pub fn new(accepted: u64, queued: u64, parked: u64, until: Instant) -> BacklogFinish {
        BacklogFinish {
            target: accepted.saturating_add(queued).saturating_add(parked),
            until,
        }
    }

    /// True when the stop may go on: everything counted has been
    /// dispatched, nothing waits any more, or time is up.
    pub fn done(&self, accepted: u64, waiting: u64, now: Instant) -> bool {
        accepted >= self.target || waiting == 0 || now >= self.until
    }

    /// When to look again at the latest.
    pub fn deadline(&self) -> Instant {
        self.until
    }
}

impl Supervisor {
    /// The stop after the drain delay: serve what waits first, if anything
    /// does and the pool should.
    pub(super) fn stop_after_backlog(&mut self, now: Instant) {
        let queued = u64::from(self.queued());
        let parked = self.dispatcher.parked() as u64;
        let applies = self.core.config().serve_backlog_on_stop
            && !self.options.listeners_outlive_pool
            && self.core.config().dispatch.speaks_protocol();
        if !applies || queued + parked == 0 {
            self.begin_shutdown(now);
            return;
        }
        info!(
            queued,
            parked,
            timeout = ?self.core.config().shutdown_timeout,
            "stopping: serving the connections already waiting first"
        );
        self.balancer.finishing = Some(BacklogFinish::new(
            self.core.totals().accepted,
            queued,
            parked,
            now + self.core.config().shutdown_timeout,
        ));
    }

    /// Begins the graceful stop once the backlog counted at the stop is
    /// served.
    pub(super) fn check_backlog_finish(&mut self, now: Instant) {
        let Some(finish) = self.balancer.finishing else {
            return;
        };
        let waiting = u64::from(self.queued()) + self.dispatcher.parked() as u64;
        if finish.done(self.core.totals().accepted, waiting, now) {
            self.balancer.finishing = None;
            self.begin_shutdown(now);
        }
    }

    /// A second stop signal while serving the backlog: stop now.
    pub(super) fn cut_backlog_finish(&mut self, now: Instant) -> bool {
        if self.balancer.finishing.take().is_some() {
            info!("second stop signal: not waiting for the backlog");
            self.begin_shutdown(now);
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn done_once_what_waited_is_dispatched() {
        let now = Instant::now();
        let f = BacklogFinish::new(10, 5, 1, now + Duration::from_secs(30));
        assert!(!f.done(10, 6, now));
        assert!(!f.done(15, 3, now), "one of the six still to go");
        assert!(f.done(16, 3, now), "new arrivals do not hold the stop off");
    }

    #[test]
    fn done_when_nothing_waits_or_time_is_up() {
        let now = Instant::now();
        let until = now + Duration::from_secs(30);
        let f = BacklogFinish::new(0, 8, 0, until);
        assert!(f.done(2, 0, now), "the queue emptied (clients gave up)");
        assert!(!f.done(2, 6, until - Duration::from_millis(1)));
        assert!(f.done(2, 6, until));
        assert_eq!(f.deadline(), until);
    }
}
