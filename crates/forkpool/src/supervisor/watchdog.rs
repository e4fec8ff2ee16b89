//! systemd's watchdog: when the unit sets `WatchdogSec=`, systemd passes
//! `WATCHDOG_USEC` (and `WATCHDOG_PID`) and restarts the service if it
//! does not hear `WATCHDOG=1` within that time. The supervisor sends it
//! from its event loop, at half the interval, so a loop that stops turning
//! (a stuck supervisor) stops the keep-alives and systemd steps in.

use std::time::{Duration, Instant};

use sd_notify::NotifyState;
use tracing::{debug, info};

use super::Supervisor;

/// How often to send `WATCHDOG=1` for a watchdog timeout of `timeout`:
/// half of it, as `sd_watchdog_enabled(3)` advises. `None` for a zero
/// timeout (systemd never asks for that; it would mean a busy loop).
pub(crate) fn keepalive_interval(timeout: Duration) -> Option<Duration> {
    (!timeout.is_zero()).then(|| timeout / 2)
}

/// The keep-alive schedule.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Watchdog {
    interval: Duration,
    next: Instant,
}

impl Watchdog {
    /// The watchdog systemd asked for through the environment, if any: it
    /// needs `NOTIFY_SOCKET` to send on, `WATCHDOG_USEC`, and
    /// `WATCHDOG_PID` unset or this process.
    pub fn from_env(now: Instant) -> Option<Watchdog> {
        std::env::var_os("NOTIFY_SOCKET")?;
        let timeout = sd_notify::watchdog_enabled()?;
        let interval = keepalive_interval(timeout)?;
        info!(
            ?timeout,
            "systemd watchdog on: keep-alive every {interval:?}"
        );
        Some(Watchdog {
            interval,
            next: now,
        })
    }

    /// When the next keep-alive is due.
    pub fn due(&self) -> Instant {
        self.next
    }

    /// Whether a keep-alive is due at `now`; if so the next is scheduled.
    pub fn take_due(&mut self, now: Instant) -> bool {
        if now < self.next {
            return false;
        }
        self.next = now + self.interval;
        true
    }
}

impl Supervisor {
    /// Sends `WATCHDOG=1` when due; called once per turn of the loop.
    pub(super) fn keep_watchdog(&mut self, now: Instant) {
        if self
            .notify
            .watchdog
            .as_mut()
            .is_some_and(|w| w.take_due(now))
        {
            if let Err(e) = sd_notify::notify(&[NotifyState::Watchdog]) {
                debug!("sd_notify WATCHDOG=1 failed: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keepalive_is_half_the_timeout() {
        assert_eq!(
            keepalive_interval(Duration::from_secs(10)),
            Some(Duration::from_secs(5))
        );
        assert_eq!(keepalive_interval(Duration::ZERO), None);
    }

    #[test]
    fn due_once_per_interval() {
        let t0 = Instant::now();
        let mut w = Watchdog {
            interval: Duration::from_secs(5),
            next: t0,
        };
        assert!(w.take_due(t0));
        assert!(!w.take_due(t0 + Duration::from_secs(4)));
        assert_eq!(w.due(), t0 + Duration::from_secs(5));
        assert!(w.take_due(t0 + Duration::from_secs(6)));
        assert_eq!(w.due(), t0 + Duration::from_secs(11));
    }
}
