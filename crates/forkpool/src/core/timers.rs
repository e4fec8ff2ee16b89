//! The shell's own timers, held by the core so that its `next_deadline`
//! is the loop's only answer to "how long may I sleep": the accept pause
//! after running out of descriptors, the endpoints' rounds and client deadlines, the drain's deadline,
//! systemd's watchdog and the backlog's last serving on stop. (The
//! upgrade's deadline, the next slow request, a capture waiting for its
//! stack, the `/proc` samples and the status line's pace are the core's
//! own.) Each is decided by
//! the mechanism it belongs to; the shell arms them all at the end of
//! each turn. A timer armed at a moment already passed is reported as it
//! is: the mechanism has work now (an endpoint with more to read), and
//! the loop turns again at once, as it did when the shell kept these
//! timers itself.

use std::time::Instant;

use super::child::HasChild;
use super::Core;

/// One of the shell's timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timer {
    /// A listener paused after an accept failed (descriptors, memory).
    AcceptPause,
    /// The status, metrics and agent endpoints: their next round.
    Endpoints,
    /// systemd's watchdog.
    Watchdog,
    /// The drain delay's end.
    Drain,
    /// The last serving of the backlog on stop.
    Finishing,
}

impl Timer {
    const COUNT: usize = 5;

    fn index(self) -> usize {
        self as usize
    }
}

/// When each of the shell's timers fires next.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    at: [Option<Instant>; Timer::COUNT],
}

impl<L: HasChild> Core<L> {
    /// The shell's `timer` fires at `at` (`None`: not armed).
    pub fn arm(&mut self, timer: Timer, at: Option<Instant>) {
        self.timers.at[timer.index()] = at;
    }

    /// The earliest of the shell's timers.
    pub(super) fn timers_deadline(&self) -> Option<Instant> {
        self.timers.at.iter().flatten().copied().min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PoolConfig;
    use crate::core::child::Child;
    use std::time::Duration;

    #[test]
    fn the_earliest_armed_timer_ahead_is_the_deadline() {
        let now = Instant::now();
        let mut core: Core<Child> = Core::new(PoolConfig::default());
        assert_eq!(core.timers_deadline(), None);
        core.arm(Timer::Watchdog, Some(now + Duration::from_secs(1)));
        core.arm(Timer::Endpoints, Some(now + Duration::from_millis(5)));
        assert_eq!(core.timers_deadline(), Some(now + Duration::from_millis(5)));
        core.arm(Timer::Endpoints, None);
        assert_eq!(core.timers_deadline(), Some(now + Duration::from_secs(1)));
        // And the core's next_deadline answers it.
        assert_eq!(core.next_deadline(now), Some(now + Duration::from_secs(1)));
        // Work due now (an endpoint with more to read) wakes the loop at
        // once.
        core.arm(Timer::Endpoints, Some(now));
        assert_eq!(core.next_deadline(now), Some(now));
    }
}
