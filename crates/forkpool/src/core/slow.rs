//! Slow requests, as the core decides them: which busy child is captured
//! (once per connection, past `slow_threshold`, within the capture rate),
//! when the next one passes the threshold, and a capture gathering the
//! worker's stack from its stderr: until the lines stop coming for
//! [`QUIET`], or [`STACK_WAIT`] at most, with the `busy_timeout` kill it
//! holds done then only if the child is still on that connection (its
//! busy deadline waits for it meanwhile). The shell reads `/proc`, sends
//! the stack-dump signal, feeds the stderr lines and logs the capture
//! (`supervisor/slow.rs`).

use std::time::{Duration, Instant};

use super::child::HasChild;
use super::Core;
use crate::observe::{CaptureLimiter, SlowCapture};
use crate::scoreboard::SlotState;
use crate::status::KillReason;

/// Captures allowed at once, and then one per [`CAPTURE_INTERVAL`].
const CAPTURE_BURST: u32 = 5;
const CAPTURE_INTERVAL: Duration = Duration::from_secs(10);
/// The longest a capture waits for the worker's stack.
pub(crate) const STACK_WAIT: Duration = Duration::from_secs(2);
/// A stack is complete once the worker wrote nothing more for this long.
pub(crate) const QUIET: Duration = Duration::from_millis(300);
/// The most stack text kept from one dump.
const MAX_STACK_BYTES: usize = 64 * 1024;

/// A kill held until a capture completes (`busy_timeout`): why, for the
/// totals and for the log.
pub(crate) type HeldKill = (KillReason, String);

/// The slow-request captures: their rate, and those gathering a stack.
#[derive(Debug)]
pub(crate) struct Captures {
    /// A pool whose every child is slow at once does not flood the log
    /// with stacks.
    limiter: CaptureLimiter,
    gathering: Vec<Gathering>,
}

impl Default for Captures {
    fn default() -> Self {
        Captures {
            limiter: CaptureLimiter::new(CAPTURE_BURST, CAPTURE_INTERVAL),
            gathering: Vec::new(),
        }
    }
}

/// A capture waiting for the worker's stack.
#[derive(Debug)]
struct Gathering {
    of: CaptureOf,
    /// What `/proc` said when it began.
    record: SlowCapture,
    /// The stack lines gathered so far.
    stack: String,
    started: Instant,
    last_line: Option<Instant>,
    then_kill: Option<HeldKill>,
}

impl Gathering {
    /// When the capture is complete, given what arrived so far.
    fn done_at(&self) -> Instant {
        let limit = self.started + STACK_WAIT;
        self.last_line.map_or(limit, |t| (t + QUIET).min(limit))
    }
}

/// A capture complete: the record to log, with the worker's stack, and
/// the kill it held if the child is still on the connection captured.
#[derive(Debug)]
pub(crate) struct Captured {
    pub record: SlowCapture,
    pub kill: Option<HeldKill>,
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
        let allowed = self.slow.limiter.allow(now);
        if !allowed {
            self.count(super::Counted::SlowCaptureSuppressed);
        }
        allowed
    }

    /// The captures the rate refused since the last capture logged.
    pub fn take_captures_suppressed(&mut self) -> u64 {
        self.slow.limiter.take_suppressed()
    }

    /// When the next busy child passes the threshold.
    pub fn next_slow(&self) -> Option<Instant> {
        self.slow_candidates().map(|(_, at)| at).min()
    }

    /// Whether a capture of the child `pid` in `slot` is gathering its
    /// stack: its busy deadline waits for it (the capture carries the
    /// kill). A capture that outlived its child says nothing of the next.
    fn set_capturing(&mut self, slot: usize, pid: i32, capturing: bool) {
        if self.board.get(slot).is_some_and(|s| s.pid == pid) {
            if let Some(link) = self.board.link_mut(slot) {
                link.child_mut().role.capturing = capturing;
            }
        }
    }

    /// Whether a capture of the child in `slot` is gathering its stack.
    pub fn capture_gathering(&self, slot: usize) -> bool {
        self.slow.gathering.iter().any(|g| g.of.slot == slot)
    }

    /// A `busy_timeout` kill of the child in `slot`: held by the capture
    /// gathering its stack, if one is (the first kill held stands);
    /// otherwise given back. A capture of the slot's previous child holds
    /// nothing of this one.
    pub fn hold_kill(&mut self, slot: usize, kill: HeldKill) -> Option<HeldKill> {
        let pid = self.board.get(slot).map(|s| s.pid);
        let of_this_child = |g: &&mut Gathering| g.of.slot == slot && Some(g.of.pid) == pid;
        match self.slow.gathering.iter_mut().find(of_this_child) {
            Some(g) => {
                g.then_kill.get_or_insert(kill);
                None
            }
            None => Some(kill),
        }
    }

    /// The shell took `record` of `of` and asked the worker for its stack
    /// at `now`: the capture gathers the lines that follow, holding
    /// `then_kill`.
    pub fn capture_started(
        &mut self,
        of: CaptureOf,
        record: SlowCapture,
        then_kill: Option<HeldKill>,
        now: Instant,
    ) {
        self.slow.gathering.push(Gathering {
            of,
            record,
            stack: String::new(),
            started: now,
            last_line: None,
            then_kill,
        });
        self.set_capturing(of.slot, of.pid, true);
    }

    /// A line the worker `pid` in `slot` wrote to its stderr at `now`.
    pub fn capture_line(&mut self, slot: usize, pid: i32, line: &str, now: Instant) {
        for g in &mut self.slow.gathering {
            if g.of.slot == slot && g.of.pid == pid {
                if g.stack.len() + line.len() < MAX_STACK_BYTES {
                    g.stack.push_str(line);
                    g.stack.push('\n');
                }
                g.last_line = Some(now);
            }
        }
    }

    /// The earliest moment a capture completes.
    pub(super) fn captures_deadline(&self) -> Option<Instant> {
        self.slow.gathering.iter().map(Gathering::done_at).min()
    }

    /// The captures complete at `now`, each with the kill it held if the
    /// child is still on the connection captured.
    pub fn captures_done(&mut self, now: Instant) -> Vec<Captured> {
        let (done, gathering) = std::mem::take(&mut self.slow.gathering)
            .into_iter()
            .partition(|g| g.done_at() <= now);
        self.slow.gathering = gathering;
        let done: Vec<Gathering> = done;
        done.into_iter()
            .map(|mut g| {
                let CaptureOf { slot, pid, since } = g.of;
                // A capture of its next connection may still gather.
                let more =
                    (self.slow.gathering.iter()).any(|g| g.of.slot == slot && g.of.pid == pid);
                self.set_capturing(slot, pid, more);
                let stuck = self.board.get(slot).is_some_and(|s| {
                    s.pid == pid && s.state == SlotState::Busy && s.since == since
                });
                if !g.stack.is_empty() {
                    g.record.worker_stack = Some(g.stack.trim_end().to_string());
                }
                Captured {
                    record: g.record,
                    kill: g.then_kill.filter(|_| stuck),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{MAX_STACK_BYTES, QUIET, STACK_WAIT};
    use crate::config::PoolConfig;
    use crate::core::child::Child;
    use crate::core::Core;
    use crate::observe::SlowCapture;
    use crate::protocol::ChildMessage;
    use crate::status::KillReason;

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

    fn record(slot: usize, pid: i32) -> SlowCapture {
        SlowCapture {
            slot,
            pid,
            peer: None,
            busy: Duration::ZERO,
            worker_stack: None,
            wchan: None,
            syscall: None,
            kernel_stack: None,
        }
    }

    /// Slot 0's child, busy since `t0`, with a capture of its connection
    /// started at `t0` holding a kill.
    fn gathering(t0: Instant) -> Core<Child> {
        let mut core = busy_pool(1, t0);
        let of = core.capture_before_kill(0, t0).expect("within the rate");
        let kill = core.hold_kill(0, (KillReason::BusyTimeout, "busy".into()));
        core.capture_started(of, record(0, 40), kill, t0);
        assert!(core.capture_gathering(0));
        assert!(core.board.link(0).unwrap().role.capturing);
        core
    }

    #[test]
    fn a_silent_worker_gets_the_whole_wait_and_a_quiet_one_less() {
        let t0 = Instant::now();
        let mut core = gathering(t0);
        assert_eq!(core.captures_deadline(), Some(t0 + STACK_WAIT));
        let at = t0 + Duration::from_millis(100);
        core.capture_line(0, 40, "File \"x.py\", line 3 in crunch", at);
        // Lines of another slot or pid are not this capture's.
        core.capture_line(1, 40, "other", at);
        core.capture_line(0, 41, "other", at);
        assert_eq!(core.captures_deadline(), Some(at + QUIET));
        assert!(core
            .captures_done(at + QUIET - Duration::from_millis(1))
            .is_empty());
        let done = core.captures_done(at + QUIET);
        assert_eq!(done.len(), 1);
        let stack = done[0].record.worker_stack.as_deref();
        assert_eq!(stack, Some("File \"x.py\", line 3 in crunch"));
        // Still on the connection captured: the kill it held stands.
        assert_eq!(
            done[0].kill.as_ref().map(|k| k.0),
            Some(KillReason::BusyTimeout)
        );
        assert!(!core.capture_gathering(0));
        assert!(!core.board.link(0).unwrap().role.capturing);
        assert_eq!(core.captures_deadline(), None);
    }

    #[test]
    fn a_worker_that_never_stops_writing_is_cut_off() {
        let t0 = Instant::now();
        let mut core = gathering(t0);
        for ms in (0..5000).step_by(100) {
            core.capture_line(0, 40, &"x".repeat(1000), t0 + Duration::from_millis(ms));
        }
        assert_eq!(core.captures_deadline(), Some(t0 + STACK_WAIT));
        let done = core.captures_done(t0 + STACK_WAIT);
        let stack = done[0].record.worker_stack.as_deref().unwrap();
        assert!(stack.len() <= MAX_STACK_BYTES);
    }

    #[test]
    fn a_kill_waits_for_the_capture_and_lapses_with_the_connection() {
        let t0 = Instant::now();
        let mut core = gathering(t0);
        // A second kill while it gathers is held too; the first stands.
        let second = (KillReason::Misbehaved, "again".into());
        assert_eq!(core.hold_kill(0, second), None);
        assert!(core
            .hold_kill(1, (KillReason::Misbehaved, "x".into()))
            .is_some());
        // The child finished that connection and took the next one.
        let later = t0 + Duration::from_millis(50);
        core.report(0, ChildMessage::Idle, later);
        core.handed(0, later);
        let done = core.captures_done(t0 + STACK_WAIT);
        assert_eq!(done.len(), 1);
        assert!(done[0].kill.is_none());
    }
}
