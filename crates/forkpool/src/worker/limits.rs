//! `kernel` dispatch: the memory and lifetime limits a child checks itself
//! after each connection, before it goes idle on the scoreboard.
//!
//! In `kernel` dispatch the kernel hands a child its next connection the
//! moment the child stores idle, without the supervisor; a supervisor that
//! learned of a limit from its own look (the board every 100 ms, `/proc`
//! every second) would learn it a few connections late. So the child looks
//! itself, as it counts its own share of `max_requests_per_child`: past a
//! limit, it stays busy (the kernel's program never picks a busy slot),
//! says `X` and exits once the supervisor has looked at it
//! (docs/protocol.md, "Recycling: the parent counts").
//!
//! The look costs nothing when no limit is set, a `clock_gettime` (vDSO, no
//! system call) for a lifetime, and one `pread` of `/proc/self/statm` for
//! memory: USS is never above RSS, so `/proc/self/smaps_rollup` (a walk of
//! the whole address space) is read only once RSS is above the limit.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use tracing::warn;

use crate::observe::procfs::parse_smaps_rollup;

/// The limits a `kernel` dispatch child is given to check itself (none
/// in other modes, where the supervisor sees every connection end).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SelfLimits {
    /// `max_child_memory`: bytes of USS it may hold; 0: no limit.
    pub max_memory: u64,
    /// Its lifetime, counted from its start (its `K`); zero: no limit.
    pub lifetime: Duration,
}

impl SelfLimits {
    /// Whether there is nothing to check.
    pub fn is_none(&self) -> bool {
        self.max_memory == 0 && self.lifetime.is_zero()
    }

    /// The lifetime in whole milliseconds, rounded up (what
    /// `FORKPOOL_MAX_CHILD_LIFETIME_MS` says): a worker that leaves at
    /// that age is never younger than the lifetime it was drawn.
    pub fn lifetime_ms(&self) -> u64 {
        let ms = self.lifetime.as_nanos().div_ceil(1_000_000);
        u64::try_from(ms).unwrap_or(u64::MAX)
    }
}

/// Which limit a child is past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Past {
    /// Its USS, in bytes, is above `max_memory`.
    Memory(u64),
    /// It is older than its lifetime.
    Lifetime,
}

/// The running check: started in the child itself (after its fork), so
/// that `/proc/self` names it and its age counts from its own start.
#[derive(Debug)]
pub(crate) struct LimitCheck {
    max_memory: u64,
    /// `/proc/self/statm`, kept open and read at offset 0 each time, with
    /// the page size its counts are in; `None` without a memory limit.
    statm: Option<(File, u64)>,
    /// When the lifetime ends; `None` without one.
    leave_at: Option<Instant>,
}

impl LimitCheck {
    /// Starts checking `limits` now; `None` when there is no limit (the
    /// child then adds nothing to a connection).
    pub fn start(limits: SelfLimits) -> Option<LimitCheck> {
        if limits.is_none() {
            return None;
        }
        let statm = if limits.max_memory == 0 {
            None
        } else {
            match (File::open("/proc/self/statm"), page_size()) {
                (Ok(file), Some(page)) => Some((file, page)),
                (Err(e), _) => {
                    // The supervisor's own look (each second) still holds.
                    warn!(
                        "cannot read /proc/self/statm ({e}): the worker does not check its memory"
                    );
                    None
                }
                (_, None) => {
                    warn!("no page size: the worker does not check its memory");
                    None
                }
            }
        };
        let leave_at = (!limits.lifetime.is_zero()).then(|| Instant::now() + limits.lifetime);
        Some(LimitCheck {
            max_memory: limits.max_memory,
            statm,
            leave_at,
        })
    }

    /// The limit this child is past now, if any.
    pub fn past(&self) -> Option<Past> {
        if let Some((statm, page)) = &self.statm {
            if let Some(uss) = self.uss_over_limit(statm, *page) {
                return Some(Past::Memory(uss));
            }
        }
        match self.leave_at {
            Some(at) if Instant::now() >= at => Some(Past::Lifetime),
            _ => None,
        }
    }

    /// The USS when it is above the limit: RSS first (one `pread`), the
    /// rollup only when RSS is above the limit too.
    fn uss_over_limit(&self, statm: &File, page: u64) -> Option<u64> {
        let mut buf = [0u8; 128];
        let n = statm.read_at(&mut buf, 0).ok()?;
        let resident = parse_statm_resident(&buf[..n])?.saturating_mul(page);
        if resident <= self.max_memory {
            return None;
        }
        let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").ok()?;
        let uss = parse_smaps_rollup(&rollup).ok()?.uss_bytes;
        (uss > self.max_memory).then_some(uss)
    }
}

/// The resident pages in `/proc/PID/statm` (its second number).
fn parse_statm_resident(text: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(text).ok()?;
    text.split_ascii_whitespace().nth(1)?.parse().ok()
}

fn page_size() -> Option<u64> {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE) {
        Ok(Some(n)) if n > 0 => Some(n as u64),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statm_says_resident_pages_second() {
        assert_eq!(parse_statm_resident(b"1000 250 40 10 0 300 0\n"), Some(250));
        assert_eq!(parse_statm_resident(b"1000"), None);
        assert_eq!(parse_statm_resident(b""), None);
    }

    #[test]
    fn no_limit_starts_no_check() {
        assert!(LimitCheck::start(SelfLimits::default()).is_none());
    }

    #[test]
    fn lifetime_in_milliseconds_rounds_up() {
        let limits = |lifetime| SelfLimits {
            max_memory: 0,
            lifetime,
        };
        assert_eq!(limits(Duration::from_millis(1500)).lifetime_ms(), 1500);
        assert_eq!(
            limits(Duration::from_nanos(1_500_000_001)).lifetime_ms(),
            1501
        );
        assert_eq!(limits(Duration::ZERO).lifetime_ms(), 0);
    }

    #[test]
    fn a_lifetime_ends() {
        let check = LimitCheck::start(SelfLimits {
            max_memory: 0,
            lifetime: Duration::from_millis(30),
        })
        .unwrap();
        assert_eq!(check.past(), None);
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(check.past(), Some(Past::Lifetime));
    }

    #[test]
    fn memory_over_the_limit_is_seen_and_under_it_is_not() {
        // This test process holds more than 1 KiB of its own, and less
        // than a petabyte.
        let check = |max_memory| {
            LimitCheck::start(SelfLimits {
                max_memory,
                lifetime: Duration::ZERO,
            })
            .unwrap()
            .past()
        };
        assert!(matches!(check(1024), Some(Past::Memory(uss)) if uss > 1024));
        assert_eq!(check(1 << 50), None);
    }
}
