//! A binary upgrade (SIGUSR2), as the core decides it: whether one may
//! begin, how long the new supervisor has to become ready, and what ends
//! it: its `ready`, its exit, or its deadline. The shell forks and execs
//! the successor, reads its readiness pipe and hands the listeners over
//! (`supervisor/upgrade.rs`); a failed upgrade is counted here.

use std::time::{Duration, Instant};

use super::child::HasChild;
use super::{Core, Counted};

/// What a new supervisor may take beyond its children's start: exec,
/// reading its configuration, adopting the listeners, binding its control
/// socket.
pub const SUCCESSOR_START: Duration = Duration::from_secs(5);

/// How long a new supervisor may take to become ready. It is ready once
/// its first children are, and each of them may take `start_timeout` (the
/// same setting: the successor runs the same command under the same
/// configuration), so it gets that plus [`SUCCESSOR_START`] for its own
/// start; 65 s by default. A longer deadline would only keep a successor
/// whose children never start for longer.
pub fn upgrade_timeout(start_timeout: Duration) -> Duration {
    start_timeout.saturating_add(SUCCESSOR_START)
}

/// The new supervisor being started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Successor {
    /// Its pid, as `fork` returned it.
    pub pid: i32,
    /// It must be ready by then.
    pub deadline: Instant,
    /// How long it was given, for the log.
    pub timeout: Duration,
}

/// Why a SIGUSR2 starts no upgrade.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UpgradeRefused {
    /// The pool was not built with binary upgrades.
    NotEnabled,
    /// One is under way already (the successor's pid).
    UnderWay(i32),
    /// The pool is stopping.
    Stopping,
}

impl std::fmt::Display for UpgradeRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpgradeRefused::NotEnabled => {
                f.write_str("this pool was not built with binary upgrades enabled")
            }
            UpgradeRefused::UnderWay(pid) => {
                write!(f, "an upgrade is already under way (pid {pid})")
            }
            UpgradeRefused::Stopping => f.write_str("the pool is stopping"),
        }
    }
}

impl<L: HasChild> Core<L> {
    /// SIGUSR2: whether an upgrade may begin now.
    pub fn may_upgrade(&self, enabled: bool) -> Result<(), UpgradeRefused> {
        if !enabled {
            return Err(UpgradeRefused::NotEnabled);
        }
        if let Some(successor) = &self.successor {
            return Err(UpgradeRefused::UnderWay(successor.pid));
        }
        if self.shutdown.is_some() {
            return Err(UpgradeRefused::Stopping);
        }
        Ok(())
    }

    /// The new supervisor was forked as `pid` at `now`: its deadline runs.
    pub fn successor_started(&mut self, pid: i32, now: Instant) -> Successor {
        let timeout = upgrade_timeout(self.config.start_timeout);
        let successor = Successor {
            pid,
            deadline: now + timeout,
            timeout,
        };
        self.successor = Some(successor);
        successor
    }

    /// The new supervisor is under way, if one is.
    pub fn successor(&self) -> Option<Successor> {
        self.successor
    }

    /// It said `ready`: the upgrade is over, and this supervisor drains.
    pub fn successor_ready(&mut self) -> Option<Successor> {
        self.successor.take()
    }

    /// The upgrade failed: the successor could not be started, stopped
    /// before it was ready, or was late. Counted; this supervisor keeps
    /// serving. Returns the successor it was, if one had started.
    pub fn upgrade_failed(&mut self) -> Option<Successor> {
        self.count(Counted::UpgradeFailure);
        self.successor.take()
    }

    /// The successor, if it is past its deadline at `now` (the shell kills
    /// it and fails the upgrade).
    pub fn successor_late(&self, now: Instant) -> Option<Successor> {
        self.successor.filter(|s| now >= s.deadline)
    }

    /// Whether the process `pid`, reaped, was the successor.
    pub(super) fn is_successor(&self, pid: i32) -> bool {
        self.successor.is_some_and(|s| s.pid == pid)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{UpgradeRefused, SUCCESSOR_START};
    use crate::config::PoolConfig;
    use crate::core::child::Child;
    use crate::core::{Core, Effect};
    use crate::sys::process::ExitStatus;

    fn core() -> Core<Child> {
        Core::new(PoolConfig {
            start_timeout: Duration::from_secs(10),
            ..PoolConfig::default()
        })
    }

    #[test]
    fn one_upgrade_at_a_time_and_only_when_enabled() {
        let t0 = Instant::now();
        let mut core = core();
        assert_eq!(core.may_upgrade(false), Err(UpgradeRefused::NotEnabled));
        assert_eq!(core.may_upgrade(true), Ok(()));
        core.successor_started(77, t0);
        assert_eq!(core.may_upgrade(true), Err(UpgradeRefused::UnderWay(77)));
        let said = UpgradeRefused::UnderWay(77).to_string();
        assert_eq!(said, "an upgrade is already under way (pid 77)");
        assert_eq!(core.successor_ready().map(|s| s.pid), Some(77));
        assert_eq!(core.may_upgrade(true), Ok(()));
        assert_eq!(core.totals.upgrade_failures, 0);
    }

    #[test]
    fn a_successor_gets_the_start_timeout_and_its_own_start_then_fails() {
        let t0 = Instant::now();
        let mut core = core();
        let s = core.successor_started(77, t0);
        assert_eq!(s.timeout, Duration::from_secs(10) + SUCCESSOR_START);
        assert_eq!(
            core.successor_late(t0 + s.timeout - Duration::from_millis(1)),
            None
        );
        assert_eq!(core.successor_late(t0 + s.timeout), Some(s));
        assert_eq!(core.upgrade_failed(), Some(s));
        assert_eq!(core.totals.upgrade_failures, 1);
        assert_eq!(core.successor(), None);
    }

    #[test]
    fn a_successor_reaped_fails_the_upgrade_and_a_stranger_does_not() {
        let t0 = Instant::now();
        let mut core = core();
        core.successor_started(77, t0);
        core.reaped_pid(78, ExitStatus::Code(0), t0);
        assert!(matches!(
            core.take_effects()[..],
            [Effect::Stranger { pid: 78, .. }]
        ));
        assert!(core.successor().is_some());
        core.reaped_pid(77, ExitStatus::Code(1), t0);
        assert!(matches!(
            core.take_effects()[..],
            [Effect::SuccessorGone { pid: 77, .. }]
        ));
        assert_eq!(core.totals.upgrade_failures, 1);
        assert_eq!(core.successor(), None);
    }
}
