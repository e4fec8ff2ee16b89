//! The drain delay: warn the balancer before stopping.
//!
//! A balancer learns that a pool is going away only at its next check. So
//! when a stop (`TERM`, `INT`) or a `USR2` hand-over comes and something
//! can tell the balancer (an agent port or a readiness endpoint), the
//! supervisor first reports `drain` / not ready for `drain_delay` while it
//! keeps serving normally, and only then stops or hands over as before.
//! With nothing to tell the balancer with, or a zero delay, there is no
//! one to warn: it proceeds at once. A second `TERM` or `INT` during the
//! delay skips the rest of it and stops. Once the machine has said
//! proceed, later signals are the supervisor's ordinary business (a second
//! `INT` stopping at once, and so on) and this machine ignores them.
//!
//! [`Drain`] holds no clock: every call takes `now`, and
//! [`Drain::deadline`] tells the event loop when to call [`Drain::poll`].

use std::time::{Duration, Instant};

/// What the supervisor does when the delay is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// Stop as on `TERM` today: finish in-flight work, then exit.
    Stop,
    /// Hand over to the `USR2` successor as today.
    HandOver,
}

/// What the supervisor should do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing changes.
    Nothing,
    /// Start reporting drain / not ready, keep serving, and come back (call
    /// [`Drain::poll`]) at `until`.
    Announce {
        /// When the delay ends.
        until: Instant,
    },
    /// Carry out the stop or the hand-over now.
    Proceed(After),
}

/// The drain-delay state machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drain {
    delay: Duration,
    can_announce: bool,
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Serving,
    Draining { until: Instant, then: After },
    Done,
}

impl Drain {
    /// A machine for a pool with this `drain_delay`; `can_announce` is true
    /// when an agent port or a readiness endpoint is configured.
    pub fn new(delay: Duration, can_announce: bool) -> Drain {
        Drain {
            delay,
            can_announce,
            state: State::Serving,
        }
    }

    /// A `TERM` or `INT` arrived.
    pub fn on_stop_signal(&mut self, now: Instant) -> Step {
        match self.state {
            State::Serving => self.begin(now, After::Stop),
            // The operator insists: skip the rest of the delay.
            State::Draining { .. } => self.proceed(After::Stop),
            State::Done => Step::Nothing,
        }
    }

    /// A `USR2` successor is ready to take over.
    pub fn on_hand_over(&mut self, now: Instant) -> Step {
        match self.state {
            State::Serving => self.begin(now, After::HandOver),
            // Already on the way out; a hand-over does not shorten or
            // lengthen the delay.
            State::Draining { .. } | State::Done => Step::Nothing,
        }
    }

    /// Time passed: proceeds once the delay is over.
    pub fn poll(&mut self, now: Instant) -> Step {
        match self.state {
            State::Draining { until, then } if now >= until => self.proceed(then),
            _ => Step::Nothing,
        }
    }

    /// When [`Drain::poll`] should next be called, while draining.
    pub fn deadline(&self) -> Option<Instant> {
        match self.state {
            State::Draining { until, .. } => Some(until),
            _ => None,
        }
    }

    /// True while the pool should report drain / not ready and keep
    /// serving.
    pub fn is_draining(&self) -> bool {
        matches!(self.state, State::Draining { .. })
    }

    fn begin(&mut self, now: Instant, then: After) -> Step {
        if !self.can_announce || self.delay.is_zero() {
            return self.proceed(then);
        }
        let until = now + self.delay;
        self.state = State::Draining { until, then };
        Step::Announce { until }
    }

    fn proceed(&mut self, then: After) -> Step {
        self.state = State::Done;
        Step::Proceed(then)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DELAY: Duration = Duration::from_secs(5);

    #[test]
    fn term_with_an_agent_drains_then_stops() {
        let t0 = Instant::now();
        let mut d = Drain::new(DELAY, true);
        assert!(!d.is_draining());
        assert_eq!(d.on_stop_signal(t0), Step::Announce { until: t0 + DELAY });
        assert!(d.is_draining());
        assert_eq!(d.deadline(), Some(t0 + DELAY));
        assert_eq!(d.poll(t0 + DELAY - Duration::from_millis(1)), Step::Nothing);
        assert!(d.is_draining(), "still serving during the delay");
        assert_eq!(d.poll(t0 + DELAY), Step::Proceed(After::Stop));
        assert!(!d.is_draining());
        assert_eq!(d.deadline(), None);
        assert_eq!(d.poll(t0 + DELAY * 2), Step::Nothing, "proceeds once");
    }

    #[test]
    fn usr2_drains_then_hands_over() {
        let t0 = Instant::now();
        let mut d = Drain::new(DELAY, true);
        assert_eq!(d.on_hand_over(t0), Step::Announce { until: t0 + DELAY });
        assert_eq!(
            d.on_hand_over(t0),
            Step::Nothing,
            "a second USR2 changes nothing"
        );
        assert_eq!(d.deadline(), Some(t0 + DELAY));
        assert_eq!(d.poll(t0 + DELAY), Step::Proceed(After::HandOver));
    }

    #[test]
    fn nothing_to_announce_with_stops_at_once() {
        let t0 = Instant::now();
        let mut d = Drain::new(DELAY, false);
        assert_eq!(d.on_stop_signal(t0), Step::Proceed(After::Stop));
        assert!(!d.is_draining());
        let mut d = Drain::new(DELAY, false);
        assert_eq!(d.on_hand_over(t0), Step::Proceed(After::HandOver));
    }

    #[test]
    fn a_zero_delay_proceeds_at_once() {
        let mut d = Drain::new(Duration::ZERO, true);
        assert_eq!(d.on_stop_signal(Instant::now()), Step::Proceed(After::Stop));
    }

    #[test]
    fn a_second_stop_signal_skips_the_rest() {
        let t0 = Instant::now();
        let mut d = Drain::new(DELAY, true);
        d.on_stop_signal(t0);
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(d.on_stop_signal(t1), Step::Proceed(After::Stop));
        assert!(!d.is_draining());
        // After that, signals are the supervisor's ordinary business.
        assert_eq!(d.on_stop_signal(t1), Step::Nothing);
        assert_eq!(d.poll(t0 + DELAY), Step::Nothing);
    }

    #[test]
    fn a_stop_signal_during_a_hand_over_drain_stops() {
        let t0 = Instant::now();
        let mut d = Drain::new(DELAY, true);
        d.on_hand_over(t0);
        assert_eq!(d.on_stop_signal(t0), Step::Proceed(After::Stop));
    }

    #[test]
    fn a_hand_over_during_a_stop_drain_is_ignored() {
        let t0 = Instant::now();
        let mut d = Drain::new(DELAY, true);
        d.on_stop_signal(t0);
        assert_eq!(d.on_hand_over(t0), Step::Nothing);
        assert_eq!(d.poll(t0 + DELAY), Step::Proceed(After::Stop));
    }
}
