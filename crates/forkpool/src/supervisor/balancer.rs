//! Being a backend for a load balancer, wired into the loop: the pool's
//! [`Capacity`] read off the scoreboard, the agent-check line, the `/live`
//! and `/ready` answers, and the drain delay before a stop or a hand-over.
//! The rules themselves are in [`crate::fleet`]; this file only fills in
//! the numbers and carries out what the rules say.

use std::time::Instant;

use tracing::info;

use super::Supervisor;
use crate::fleet::drain::{After, Drain, Step};
use crate::fleet::Phase;

/// The balancer-facing state: the drain-delay machine, made at the first
/// stop signal or hand-over (so it uses the `drain_delay` in force then).
#[derive(Debug, Default)]
pub(crate) struct Balancer {
    drain: Option<Drain>,
    /// Serving the backlog queued when a stop came (`stop_backlog.rs`):
    /// the balancer sees the pool stopping meanwhile.
    pub finishing: Option<super::stop_backlog::BacklogFinish>,
}

impl Supervisor {
    /// Where the pool is in its life, as a balancer should see it.
    pub(super) fn phase(&self) -> Phase {
        phase_of(
            self.core.shutdown().is_some() || self.balancer.finishing.is_some(),
            self.balancer.drain.as_ref().is_some_and(Drain::is_draining),
            self.notify.told_ready,
        )
    }

    fn drain_machine(&mut self) -> &mut Drain {
        let delay = self.core.config().drain_delay;
        let can_announce = self.endpoints.can_announce();
        self.balancer
            .drain
            .get_or_insert_with(|| Drain::new(delay, can_announce))
    }

    /// `TERM`, or a first `INT`: stop, after the drain delay if there is
    /// a balancer to warn; a second one during the delay stops at once.
    pub(super) fn stop_requested(&mut self, now: Instant) {
        if self.cut_backlog_finish(now) {
            return;
        }
        let step = self.drain_machine().on_stop_signal(now);
        self.drain_step(step, now);
    }

    /// The `USR2` successor is ready: hand over, after the drain delay.
    pub(super) fn successor_ready(&mut self, now: Instant) {
        // From now on the successor speaks to systemd.
        self.handover.handed_over = true;
        let step = self.drain_machine().on_hand_over(now);
        self.drain_step(step, now);
    }

    /// Ends the drain delay when it is over.
    pub(super) fn check_drain(&mut self, now: Instant) {
        if let Some(drain) = self.balancer.drain.as_mut() {
            let step = drain.poll(now);
            self.drain_step(step, now);
        }
    }

    /// When the drain delay ends, while it runs.
    pub(super) fn drain_deadline(&self) -> Option<Instant> {
        self.balancer.drain.as_ref().and_then(Drain::deadline)
    }

    fn drain_step(&mut self, step: Step, now: Instant) {
        match step {
            Step::Nothing => {}
            Step::Announce { until } => info!(
                delay = ?until.saturating_duration_since(now),
                "draining: telling the balancer to send no new work, still serving; \
                 a second TERM or INT stops now"
            ),
            Step::Proceed(After::Stop) => self.stop_after_backlog(now),
            // The successor accepts on the same listeners: it takes the backlog.
            Step::Proceed(After::HandOver) => self.begin_shutdown(now),
        }
    }
}

/// The phase of a pool `stopping` (or serving its backlog's last before
/// it stops), `draining` (the balancer told to send nothing new), and
/// `ready` (systemd told so): the first that holds, in that order.
fn phase_of(stopping: bool, draining: bool, ready: bool) -> Phase {
    match (stopping, draining, ready) {
        (true, _, _) => Phase::Stopping,
        (_, true, _) => Phase::Draining,
        (_, _, false) => Phase::Starting,
        _ => Phase::Serving,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_outranks_a_drain_which_outranks_a_start() {
        assert_eq!(phase_of(true, true, false), Phase::Stopping);
        assert_eq!(phase_of(false, true, false), Phase::Draining);
        assert_eq!(phase_of(false, true, true), Phase::Draining);
        assert_eq!(phase_of(false, false, false), Phase::Starting);
        assert_eq!(phase_of(false, false, true), Phase::Serving);
    }
}
