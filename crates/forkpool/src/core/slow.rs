//! Slow requests, as the core decides them: which busy child is captured
//! (once per connection, past `slow_threshold`, within the capture rate),
//! when the next one passes the threshold, and whether a capture is still
//! gathering the child's stack (its busy deadline then waits for it). The
//! shell takes the capture (`/proc`, the stack on stderr) and logs it
//! (`supervisor/slow.rs`).

use std::time::{Duration, Instant};

use super::child::HasChild;
use super::Core;
use crate::observe::CaptureLimiter;
use crate::scoreboard::SlotState;

/// Captures allowed at once, and then one per [`CAPTURE_INTERVAL`].
const CAPTURE_BURST: u32 = 5;
const CAPTURE_INTERVAL: Duration = Duration::from_secs(10);

/// The rate of captures: a pool whose every child is slow at once does
/// not flood the log with stacks.
pub(crate) fn capture_limiter() -> CaptureLimiter {
    CaptureLimiter::new(CAPTURE_BURST, CAPTURE_INTERVAL)
}

/// A capture the core asks for: the child and the connection it is on
/// (the slot's busy-since instant).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CaptureOf {
    pub slot: usize,
    pub pid: i32,
    pub since: Instant,
}

impl<L: HasChild> Core<L> {
    /// The threshold in force: none for workers that never report (`none`
    /// dispatch), which look busy from start to end.
    fn slow_threshold(&self) -> Duration {
        if self.config.dispatch.speaks_protocol() {
            self.config.slow_threshold
        } else {
            Duration::ZERO
        }
    }

    /// The busy children (one connection each) not captured yet on this
    /// connection, with the moment each passes the threshold.
    fn slow_candidates(&self) -> impl Iterator<Item = (CaptureOf, Instant)> + '_ {
        let threshold = self.slow_threshold();
        self.board
            .iter()
            .filter(move |_| !threshold.is_zero())
            .filter(|(_, s)| s.state == SlotState::Busy && s.load.is_none())
            .filter(|(_, s)| s.link.child().role.captured != Some(s.since))
            .map(move |(slot, s)| {
                let of = CaptureOf {
                    slot,
                    pid: s.pid,
                    since: s.since,
                };
                (of, s.since + threshold)
            })
    }

    /// The children to capture now: each busy past `slow_threshold` on a
    /// connection not captured yet. Each is marked captured for that
    /// connection; one the capture rate refuses is counted as suppressed
    /// and not asked for.
    pub fn slow_captures_due(&mut self, now: Instant) -> Vec<CaptureOf> {
        let due: Vec<CaptureOf> = self
            .slow_candidates()
            .filter(|&(_, at)| now >= at)
            .map(|(of, _)| of)
            .collect();
        due.into_iter()
            .filter(|&of| self.capture_allowed(of, now))
            .collect()
    }

    /// A child about to be killed for `busy_timeout`: the capture to take
    /// first, unless the capture rate refuses it (the kill is then done at
    /// once).
    pub fn capture_before_kill(&mut self, slot: usize, now: Instant) -> Option<CaptureOf> {
        let entry = self.board.get(slot)?;
        let of = CaptureOf {
            slot,
            pid: entry.pid,
            since: entry.since,
        };
        self.capture_allowed(of, now).then_some(of)
    }

    /// Marks `of`'s connection captured and asks the capture rate.
    fn capture_allowed(&mut self, of: CaptureOf, now: Instant) -> bool {
        if let Some(link) = self.board.link_mut(of.slot) {
            link.child_mut().role.captured = Some(of.since);
        }
        let allowed = self.slow.allow(now);
        if !allowed {
            self.count(super::Counted::SlowCaptureSuppressed);
        }
        allowed
    }

    /// The captures the rate refused since the last capture logged.
    pub fn take_captures_suppressed(&mut self) -> u64 {
        self.slow.take_suppressed()
    }

    /// When the next busy child passes the threshold.
    pub fn next_slow(&self) -> Option<Instant> {
        self.slow_candidates().map(|(_, at)| at).min()
    }

    /// Whether a capture of the child `pid` in `slot` is gathering its
    /// stack: its busy deadline waits for it (the capture carries the
    /// kill). A capture that outlived its child says nothing of the next.
    pub fn set_capturing(&mut self, slot: usize, pid: i32, capturing: bool) {
        if self.board.get(slot).is_some_and(|s| s.pid == pid) {
            if let Some(link) = self.board.link_mut(slot) {
                link.child_mut().role.capturing = capturing;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use crate::config::PoolConfig;
    use crate::core::child::Child;
    use crate::core::Core;
    use crate::protocol::ChildMessage;

    fn busy_pool(children: usize, now: Instant) -> Core<Child> {
        let mut core: Core<Child> = Core::new(PoolConfig {
            slow_threshold: Duration::from_secs(1),
            dispatch: crate::config::DispatchMode::Handoff,
            ..PoolConfig::default()
        });
        for slot in 0..children {
            let pid = 40 + slot as i32;
            core.adopt(slot, pid, 1, Child::new(now, true, 1), now);
            core.report(slot, ChildMessage::Ready { pid: pid as u32 }, now);
            core.handed(slot, now);
            assert_eq!(
                core.board.get(slot).unwrap().state,
                crate::scoreboard::SlotState::Busy
            );
        }
        core
    }

    #[test]
    fn a_connection_is_captured_once_past_the_threshold() {
        let t0 = Instant::now();
        let mut core = busy_pool(1, t0);
        assert_eq!(core.next_slow(), Some(t0 + Duration::from_secs(1)));
        assert!(core.slow_captures_due(t0).is_empty());
        let late = t0 + Duration::from_secs(1);
        let due = core.slow_captures_due(late);
        assert_eq!(due.len(), 1);
        assert_eq!((due[0].slot, due[0].pid), (0, 40));
        // Once per connection: no second capture, no deadline left.
        assert!(core.slow_captures_due(late).is_empty());
        assert_eq!(core.next_slow(), None);
        // Its next connection may be captured again.
        core.report(0, ChildMessage::Idle, late);
        core.handed(0, late);
        assert_eq!(core.next_slow(), Some(late + Duration::from_secs(1)));
    }

    #[test]
    fn the_capture_rate_holds_a_pool_slow_at_once() {
        let t0 = Instant::now();
        let mut core = busy_pool(8, t0);
        let due = core.slow_captures_due(t0 + Duration::from_secs(1));
        assert_eq!(due.len(), super::CAPTURE_BURST as usize);
        assert_eq!(core.totals.slow_captures_suppressed, 3);
        assert_eq!(core.take_captures_suppressed(), 3);
        // A child killed for busy_timeout past the rate is killed at once.
        assert_eq!(
            core.capture_before_kill(7, t0 + Duration::from_secs(2)),
            None
        );
    }
}
