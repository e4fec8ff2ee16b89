//! Liveness: which deadline a child must meet next, and when.
//!
//! One rule per child at a time, in priority order: a child on its way out
//! must exit by its leave deadline; a child that speaks no protocol has no
//! other limit; while a slow-request capture gathers a child's stack it is
//! left alone; an outstanding ping must be answered; a starting child must
//! say `Ready`; an accept order must be answered; a quiet idle child is
//! pinged; a child serving one connection must finish within
//! `busy_timeout`. The supervisor both acts on the answer and sets its
//! timer from it, so the rules are stated once, here.

use std::time::{Duration, Instant};

use crate::config::PoolConfig;
use crate::scoreboard::SlotState;

/// What the next liveness deadline of a child is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Check {
    /// Told to quit (or its channel closed): it must exit.
    Stop,
    /// A ping is outstanding: it must answer.
    PingAnswer,
    /// Forked: it must say `Ready`.
    Start,
    /// Ordered to accept (`order` dispatch): it must say `B` or `M`.
    Order,
    /// Idle and quiet: time to ping it.
    PingDue,
    /// Serving one connection: it must finish within `busy_timeout`.
    Busy,
}

/// What the rule reads about one child.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChildFacts {
    /// What it is doing.
    pub state: SlotState,
    /// When it entered that state.
    pub since: Instant,
    /// When it last sent anything.
    pub last_heard: Instant,
    /// When it must be gone, once it is leaving.
    pub leave_deadline: Option<Instant>,
    /// When the ping it has not answered yet was sent.
    pub ping_sent: Option<Instant>,
    /// It serves many connections at once (a session pool): its channel
    /// is read by a thread that serves none, so it answers pings while busy.
    pub many_connections: bool,
    /// A slow-request capture is gathering its stack.
    pub capture_pending: bool,
}

/// The pool's limits the rule applies.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadlines {
    /// Ping a child quiet for this long.
    pub ping_interval: Duration,
    /// A ping or accept order must be answered within this.
    pub ping_timeout: Duration,
    /// One connection may take this long (zero: no limit).
    pub busy_timeout: Duration,
    /// Children report (every dispatch mode but `none`).
    pub speaks_protocol: bool,
}

impl Deadlines {
    /// The limits `config` sets.
    pub fn of(config: &PoolConfig) -> Deadlines {
        Deadlines {
            ping_interval: config.ping_interval,
            ping_timeout: config.ping_timeout,
            busy_timeout: config.busy_timeout,
            speaks_protocol: config.dispatch.speaks_protocol(),
        }
    }

    /// A child (or a template) must say `Ready` within one ping interval
    /// plus one ping timeout.
    pub fn start_timeout(&self) -> Duration {
        self.ping_interval + self.ping_timeout
    }
}

/// Whether a child in `state` is pinged once it has been quiet for a
/// while: an idle child, or a many-connection child in any serving state.
pub(crate) fn awaits_pings(state: SlotState, many_connections: bool) -> bool {
    match state {
        SlotState::Idle => true,
        SlotState::Partial | SlotState::Busy => many_connections,
        _ => false,
    }
}

/// The one rule that applies to `child` next, and when it is due.
pub(crate) fn next_check(child: &ChildFacts, limits: &Deadlines) -> Option<(Instant, Check)> {
    if let Some(deadline) = child.leave_deadline {
        // A killed child is past every deadline: it only waits to be reaped.
        return (child.state != SlotState::Killed).then_some((deadline, Check::Stop));
    }
    if !limits.speaks_protocol || child.capture_pending {
        // Workers that never report have no start, ping or busy limits; a
        // capture holds its own kill, which follows once the stack is in.
        return None;
    }
    if let Some(sent) = child.ping_sent {
        return Some((sent + limits.ping_timeout, Check::PingAnswer));
    }
    match child.state {
        SlotState::Starting => Some((child.since + limits.start_timeout(), Check::Start)),
        // An accept order takes one `accept` call: a child still sitting
        // on it after a ping timeout is hung.
        SlotState::Ordered => Some((child.since + limits.ping_timeout, Check::Order)),
        state if awaits_pings(state, child.many_connections) => {
            Some((child.last_heard + limits.ping_interval, Check::PingDue))
        }
        // (A busy many-connection child was caught by the arm above.)
        SlotState::Busy if !limits.busy_timeout.is_zero() => {
            Some((child.since + limits.busy_timeout, Check::Busy))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    fn limits() -> Deadlines {
        Deadlines {
            ping_interval: 10 * SEC,
            ping_timeout: 3 * SEC,
            busy_timeout: 60 * SEC,
            speaks_protocol: true,
        }
    }

    fn child(state: SlotState, t0: Instant) -> ChildFacts {
        ChildFacts {
            state,
            since: t0,
            last_heard: t0 + SEC,
            leave_deadline: None,
            ping_sent: None,
            many_connections: false,
            capture_pending: false,
        }
    }

    #[test]
    fn a_starting_child_must_say_ready_within_interval_plus_timeout() {
        let t0 = Instant::now();
        let got = next_check(&child(SlotState::Starting, t0), &limits());
        assert_eq!(got, Some((t0 + 13 * SEC, Check::Start)));
    }

    #[test]
    fn an_accept_order_must_be_answered_within_the_ping_timeout() {
        let t0 = Instant::now();
        let got = next_check(&child(SlotState::Ordered, t0), &limits());
        assert_eq!(got, Some((t0 + 3 * SEC, Check::Order)));
    }

    #[test]
    fn a_quiet_idle_child_is_pinged_an_interval_after_it_was_last_heard() {
        let t0 = Instant::now();
        let got = next_check(&child(SlotState::Idle, t0), &limits());
        assert_eq!(got, Some((t0 + 11 * SEC, Check::PingDue)));
    }

    #[test]
    fn an_outstanding_ping_comes_before_the_state_rule() {
        let t0 = Instant::now();
        let mut c = child(SlotState::Idle, t0);
        c.ping_sent = Some(t0 + 2 * SEC);
        assert_eq!(
            next_check(&c, &limits()),
            Some((t0 + 5 * SEC, Check::PingAnswer))
        );
    }

    #[test]
    fn a_busy_child_has_busy_timeout_and_none_when_it_is_zero() {
        let t0 = Instant::now();
        let c = child(SlotState::Busy, t0);
        assert_eq!(
            next_check(&c, &limits()),
            Some((t0 + 60 * SEC, Check::Busy))
        );
        let unlimited = Deadlines {
            busy_timeout: Duration::ZERO,
            ..limits()
        };
        assert_eq!(next_check(&c, &unlimited), None);
    }

    #[test]
    fn a_busy_many_connection_child_is_pinged_not_timed() {
        let t0 = Instant::now();
        for state in [SlotState::Busy, SlotState::Partial] {
            let mut c = child(state, t0);
            c.many_connections = true;
            assert_eq!(
                next_check(&c, &limits()),
                Some((t0 + 11 * SEC, Check::PingDue))
            );
        }
    }

    #[test]
    fn a_leaving_child_must_exit_by_its_deadline_whatever_else_is_due() {
        let t0 = Instant::now();
        let mut c = child(SlotState::Retiring, t0);
        c.leave_deadline = Some(t0 + 30 * SEC);
        c.ping_sent = Some(t0);
        c.capture_pending = true;
        assert_eq!(
            next_check(&c, &limits()),
            Some((t0 + 30 * SEC, Check::Stop))
        );
        let none_mode = Deadlines {
            speaks_protocol: false,
            ..limits()
        };
        assert_eq!(
            next_check(&c, &none_mode),
            Some((t0 + 30 * SEC, Check::Stop))
        );
    }

    #[test]
    fn a_killed_child_has_no_deadline_left() {
        let t0 = Instant::now();
        let mut c = child(SlotState::Killed, t0);
        c.leave_deadline = Some(t0);
        assert_eq!(next_check(&c, &limits()), None);
    }

    #[test]
    fn a_pending_capture_holds_every_other_deadline() {
        let t0 = Instant::now();
        let mut c = child(SlotState::Busy, t0);
        c.capture_pending = true;
        assert_eq!(next_check(&c, &limits()), None);
    }

    #[test]
    fn children_that_never_report_have_only_the_stop_deadline() {
        let t0 = Instant::now();
        let none_mode = Deadlines {
            speaks_protocol: false,
            ..limits()
        };
        for state in [SlotState::Starting, SlotState::Idle, SlotState::Busy] {
            assert_eq!(next_check(&child(state, t0), &none_mode), None);
        }
    }

    #[test]
    fn leaving_states_are_not_pinged() {
        let t0 = Instant::now();
        for state in [SlotState::Retiring, SlotState::Killed] {
            assert!(!awaits_pings(state, true));
            assert_eq!(next_check(&child(state, t0), &limits()), None);
        }
    }
}
