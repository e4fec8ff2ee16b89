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
//!
//! A child that is merely slow is not a child that misbehaves: one that
//! closed its channel and is still tearing down its heap when
//! `exit_timeout` runs out is killed as `exit_timeout`, one that sent an
//! empty datagram and kept its channel open as `channel_failed`
//! ([`closed_channel_grace`], [`missed_exit`]).

use std::time::{Duration, Instant};

use crate::config::PoolConfig;
use crate::slot::SlotState;
use crate::status::KillReason;

/// How long a child that sent an empty datagram (its channel reads as
/// closed, but its end of it is still open) has to exit. The protocol
/// forbids the empty datagram, so this is short and has no setting; a
/// child that really closed its channel gets `exit_timeout` instead.
pub(crate) const EMPTY_DATAGRAM_GRACE: Duration = Duration::from_millis(500);

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
    /// A new child must say `Ready` within this.
    pub start_timeout: Duration,
    /// A child that closed its channel must exit within this.
    pub exit_timeout: Duration,
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
            start_timeout: config.start_timeout,
            exit_timeout: config.exit_timeout,
            busy_timeout: config.busy_timeout,
            speaks_protocol: config.dispatch.speaks_protocol(),
        }
    }
}

/// How long a child whose channel just read as closed has to exit.
/// `peer_hung_up`: its end of the channel is closed too, so it is on its
/// way out (asked or not) and gets `exit_timeout` for its tear-down;
/// otherwise it sent an empty datagram and keeps its channel open, and it
/// gets [`EMPTY_DATAGRAM_GRACE`] (or `ping_timeout`, if shorter). Either
/// way a deadline already set (a stop's) is only ever moved earlier.
pub(crate) fn closed_channel_grace(peer_hung_up: bool, limits: &Deadlines) -> Duration {
    if peer_hung_up {
        limits.exit_timeout
    } else {
        EMPTY_DATAGRAM_GRACE.min(limits.ping_timeout)
    }
}

/// How long a worker ordered from a template, not verified yet, has
/// after its channel closed. With no `W` for it yet (`claimed` false)
/// the template's answer is due at once: the intermediate sends it right
/// after its fork, so a template that closed the order's descriptors
/// without answering is caught within the short grace. A claimed worker
/// is exiting like any other and has its tear-down time.
pub(crate) fn unverified_closed_grace(claimed: bool, limits: &Deadlines) -> Duration {
    closed_channel_grace(claimed, limits)
}

/// When a child told to quit at `now`, or whose channel closed at `now`,
/// must be gone: `exit_timeout` later, but never after `stop_deadline` (a
/// graceful stop's), so a long `exit_timeout` cannot stretch a stop past
/// its `shutdown_timeout`.
pub(crate) fn exit_deadline(
    now: Instant,
    exit_timeout: Duration,
    stop_deadline: Option<Instant>,
) -> Instant {
    let by = now + exit_timeout;
    stop_deadline.map_or(by, |stop| stop.min(by))
}

/// Why a child still running at its leave deadline is killed.
/// `channel_closed`: its channel read as closed; `peer_hung_up`: its end
/// is closed (checked at the deadline, so a child that sent an empty
/// datagram and then closed counts as closed). A child that closed its
/// channel is leaving and only slow to exit (`exit_timeout`); one that
/// sent an empty datagram and kept its channel broke the protocol
/// (`channel_failed`); one that never closed it did not stop within its
/// `shutdown_timeout` (`stop_timeout`).
pub(crate) fn missed_exit(channel_closed: bool, peer_hung_up: bool) -> KillReason {
    match (channel_closed, peer_hung_up) {
        (true, true) => KillReason::ExitTimeout,
        (true, false) => KillReason::ChannelFailed,
        (false, _) => KillReason::StopTimeout,
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
        SlotState::Starting => Some((child.since + limits.start_timeout, Check::Start)),
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

/// What a template's next deadline is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TemplateCheck {
    /// Told to quit (or its channel closed): it must exit.
    Exit,
    /// Started: it must say `R`.
    Start,
    /// Ordered to fork: it must answer `W` or `E`.
    Fork,
    /// A ping is outstanding: it must answer.
    PingAnswer,
    /// Quiet: time to ping it.
    PingDue,
}

/// Where a template is, as its deadlines see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TemplatePhase {
    /// Exec'd, loading; it has not said `R`.
    Starting,
    /// Taking fork orders.
    Ready,
    /// Told to quit, or killed: only its exit deadline, if any, applies.
    Leaving,
}

/// What the rule reads about one template.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TemplateFacts {
    /// Where it is.
    pub phase: TemplatePhase,
    /// When it was started.
    pub started_at: Instant,
    /// When it last sent anything.
    pub last_heard: Instant,
    /// By when it must have exited (told to quit, or its channel closed);
    /// none once it has been killed.
    pub exit_deadline: Option<Instant>,
    /// When its oldest unanswered fork order was sent.
    pub oldest_order: Option<Instant>,
    /// When the ping it has not answered yet was sent.
    pub ping_sent: Option<Instant>,
}

/// The one rule that applies to a template next, and when: its exit
/// deadline once it has one; before `R`, the start deadline; once ready,
/// the earliest of its oldest fork order's deadline and its ping's.
pub(crate) fn template_check(
    t: &TemplateFacts,
    limits: &Deadlines,
) -> Option<(Instant, TemplateCheck)> {
    if let Some(deadline) = t.exit_deadline {
        return Some((deadline, TemplateCheck::Exit));
    }
    match t.phase {
        TemplatePhase::Starting => {
            Some((t.started_at + limits.start_timeout, TemplateCheck::Start))
        }
        TemplatePhase::Ready => {
            let fork = t
                .oldest_order
                .map(|sent| (sent + limits.start_timeout, TemplateCheck::Fork));
            let ping = match t.ping_sent {
                Some(sent) => (sent + limits.ping_timeout, TemplateCheck::PingAnswer),
                None => (t.last_heard + limits.ping_interval, TemplateCheck::PingDue),
            };
            Some(fork.map_or(ping, |f| if f.0 < ping.0 { f } else { ping }))
        }
        TemplatePhase::Leaving => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(phase: TemplatePhase, t0: Instant) -> TemplateFacts {
        TemplateFacts {
            phase,
            started_at: t0,
            last_heard: t0,
            exit_deadline: None,
            oldest_order: None,
            ping_sent: None,
        }
    }

    #[test]
    fn a_template_meets_one_deadline_at_a_time() {
        let (t0, l) = (Instant::now(), limits());
        let starting = template(TemplatePhase::Starting, t0);
        assert_eq!(
            template_check(&starting, &l),
            Some((t0 + l.start_timeout, TemplateCheck::Start))
        );
        let ready = template(TemplatePhase::Ready, t0);
        assert_eq!(
            template_check(&ready, &l),
            Some((t0 + l.ping_interval, TemplateCheck::PingDue))
        );
        let pinged = TemplateFacts {
            ping_sent: Some(t0),
            ..ready
        };
        assert_eq!(
            template_check(&pinged, &l),
            Some((t0 + l.ping_timeout, TemplateCheck::PingAnswer))
        );
        // An order older than the ping's deadline comes first.
        let old_order = t0 - l.start_timeout;
        let ordered = TemplateFacts {
            oldest_order: Some(old_order),
            ..pinged
        };
        assert_eq!(
            template_check(&ordered, &l),
            Some((t0, TemplateCheck::Fork))
        );
        // Told to quit: only the exit deadline, in any phase.
        for phase in [
            TemplatePhase::Starting,
            TemplatePhase::Ready,
            TemplatePhase::Leaving,
        ] {
            let quitting = TemplateFacts {
                exit_deadline: Some(t0 + SEC),
                ..template(phase, t0)
            };
            assert_eq!(
                template_check(&quitting, &l),
                Some((t0 + SEC, TemplateCheck::Exit))
            );
        }
        assert_eq!(
            template_check(&template(TemplatePhase::Leaving, t0), &l),
            None
        );
    }

    #[test]
    fn an_unanswered_order_whose_channel_closed_gets_the_short_grace() {
        let l = limits();
        assert!(unverified_closed_grace(false, &l) <= EMPTY_DATAGRAM_GRACE);
        assert_eq!(unverified_closed_grace(true, &l), l.exit_timeout);
    }

    const SEC: Duration = Duration::from_secs(1);

    fn limits() -> Deadlines {
        Deadlines {
            ping_interval: 10 * SEC,
            ping_timeout: 3 * SEC,
            start_timeout: 45 * SEC,
            exit_timeout: 8 * SEC,
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
    fn a_starting_child_must_say_ready_within_start_timeout() {
        let t0 = Instant::now();
        let got = next_check(&child(SlotState::Starting, t0), &limits());
        assert_eq!(got, Some((t0 + 45 * SEC, Check::Start)));
        // Its own setting: not derived from the ping settings.
        let short_pings = Deadlines {
            ping_interval: SEC,
            ping_timeout: SEC,
            ..limits()
        };
        let got = next_check(&child(SlotState::Starting, t0), &short_pings);
        assert_eq!(got, Some((t0 + 45 * SEC, Check::Start)));
    }

    #[test]
    fn a_child_that_closed_its_channel_has_exit_timeout_to_exit() {
        assert_eq!(closed_channel_grace(true, &limits()), 8 * SEC);
        // Longer than the ping timeout: a tear-down is not a ping.
        let long_exit = Deadlines {
            exit_timeout: 30 * SEC,
            ..limits()
        };
        assert_eq!(closed_channel_grace(true, &long_exit), 30 * SEC);
    }

    #[test]
    fn an_empty_datagram_gets_the_short_grace_whatever_exit_timeout_is() {
        assert_eq!(closed_channel_grace(false, &limits()), EMPTY_DATAGRAM_GRACE);
        let short_ping = Deadlines {
            ping_timeout: Duration::from_millis(100),
            ..limits()
        };
        assert_eq!(
            closed_channel_grace(false, &short_ping),
            Duration::from_millis(100)
        );
    }

    #[test]
    fn an_exit_deadline_never_stretches_a_stop() {
        let t0 = Instant::now();
        assert_eq!(exit_deadline(t0, 10 * SEC, None), t0 + 10 * SEC);
        assert_eq!(
            exit_deadline(t0, 10 * SEC, Some(t0 + 4 * SEC)),
            t0 + 4 * SEC
        );
        assert_eq!(
            exit_deadline(t0, 10 * SEC, Some(t0 + 30 * SEC)),
            t0 + 10 * SEC
        );
    }

    #[test]
    fn a_slow_exit_is_counted_apart_from_misbehaviour_and_a_missed_stop() {
        assert_eq!(missed_exit(true, true), KillReason::ExitTimeout);
        assert_eq!(missed_exit(true, false), KillReason::ChannelFailed);
        assert_eq!(missed_exit(false, false), KillReason::StopTimeout);
        assert_eq!(missed_exit(false, true), KillReason::StopTimeout);
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
