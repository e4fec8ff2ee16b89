//! Shutdown escalation: which stop a burst of stop signals asks for.
//!
//! SIGTERM or one SIGINT asks for a graceful stop (no new connections,
//! busy children finish, stragglers are killed at `shutdown_timeout`).
//! SIGQUIT, a second SIGINT, or any SIGINT while a stop is under way asks
//! for an immediate one: an operator pressing Ctrl-C twice wants out now.

/// The stop the signals ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Finish what is in hand, then exit.
    Graceful,
    /// SIGKILL every child now.
    Now,
}

/// The stop asked for by the signals that arrived since the last look:
/// `interrupts` SIGINTs, a SIGTERM (`terminate`), a SIGQUIT (`quit`),
/// while a stop is or is not already under way (`stopping`).
pub(crate) fn on_stop_signals(
    interrupts: usize,
    terminate: bool,
    quit: bool,
    stopping: bool,
) -> Option<Stop> {
    if quit || interrupts > 1 || (interrupts > 0 && stopping) {
        Some(Stop::Now)
    } else if interrupts == 1 || terminate {
        Some(Stop::Graceful)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_interrupt_or_a_terminate_stops_gracefully() {
        assert_eq!(
            on_stop_signals(1, false, false, false),
            Some(Stop::Graceful)
        );
        assert_eq!(on_stop_signals(0, true, false, false), Some(Stop::Graceful));
    }

    #[test]
    fn a_second_interrupt_stops_now_in_one_burst_or_during_a_stop() {
        assert_eq!(on_stop_signals(2, false, false, false), Some(Stop::Now));
        assert_eq!(on_stop_signals(1, false, false, true), Some(Stop::Now));
    }

    #[test]
    fn quit_stops_now() {
        assert_eq!(on_stop_signals(0, false, true, false), Some(Stop::Now));
    }

    #[test]
    fn a_terminate_during_a_stop_changes_nothing_more() {
        assert_eq!(on_stop_signals(0, true, false, true), Some(Stop::Graceful));
        assert_eq!(on_stop_signals(0, false, false, true), None);
    }
}
