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
//! the whole address space, about 16 µs per resident MiB) is read only
//! once RSS is above the limit, and then not after every connection
//! ([`rollup_due`]): a `--preload` worker's RSS counts the pages it shares
//! with its template, and sits above the limit while its USS is far below.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use tracing::warn;

use crate::config::SelfLimits;
use crate::observe::procfs::parse_smaps_rollup;

/// The longest a worker whose RSS is above its memory limit goes between
/// two reads of `/proc/self/smaps_rollup` while its RSS does not grow
/// enough to matter ([`rollup_due`]): the delay within which memory that
/// becomes its own without RSS growing (a copy-on-write break) is seen.
pub(crate) const SMAPS_REREAD: Duration = Duration::from_millis(100);

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
    /// What the last read of `smaps_rollup` found; `None` before the first.
    last_rollup: Option<RollupRead>,
    /// When the lifetime ends; `None` without one.
    leave_at: Option<Instant>,
}

/// What a read of `/proc/self/smaps_rollup` found, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RollupRead {
    /// USS then, in bytes.
    pub uss: u64,
    /// RSS (from `statm`) as it was read, in bytes.
    pub rss: u64,
    /// When it was read.
    pub at: Instant,
}

/// Whether a worker whose RSS, `rss`, is above its memory `limit` reads
/// `smaps_rollup` now, given its `last` read: when there was none; when
/// RSS grew since then by at least what USS had left below the limit (USS
/// grows by at most what RSS grows, plus copy-on-write breaks, so a
/// smaller growth cannot by itself have taken USS past the limit); or when
/// [`SMAPS_REREAD`] has passed since (copy-on-write breaks raise USS
/// without RSS: they are seen within that). Otherwise the worker counts
/// as under the limit. So one that grows toward the limit is looked at
/// after every connection that could have taken it past, and one sitting
/// above the limit on memory it shares pays a read every 100 ms at most.
pub(crate) fn rollup_due(limit: u64, rss: u64, last: Option<&RollupRead>, now: Instant) -> bool {
    let Some(last) = last else {
        return true;
    };
    rss.saturating_sub(last.rss) >= limit.saturating_sub(last.uss)
        || now.saturating_duration_since(last.at) >= SMAPS_REREAD
}

/// The memory look, given RSS: its USS when that is above `limit`, read
/// with `read_uss` (which keeps `last` up to date) only when RSS is above
/// the limit and [`rollup_due`] says so. A read that fails counts as under
/// the limit and leaves `last` as it was.
pub(crate) fn memory_past(
    limit: u64,
    rss: u64,
    last: &mut Option<RollupRead>,
    now: Instant,
    read_uss: impl FnOnce() -> Option<u64>,
) -> Option<u64> {
    if rss <= limit || !rollup_due(limit, rss, last.as_ref(), now) {
        return None;
    }
    let uss = read_uss()?;
    *last = Some(RollupRead { uss, rss, at: now });
    (uss > limit).then_some(uss)
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
            last_rollup: None,
            leave_at,
        })
    }

    /// The limit this child is past now, if any.
    pub fn past(&mut self) -> Option<Past> {
        if let Some(uss) = self.uss_over_limit() {
            return Some(Past::Memory(uss));
        }
        match self.leave_at {
            Some(at) if Instant::now() >= at => Some(Past::Lifetime),
            _ => None,
        }
    }

    /// The USS when it is above the limit: RSS first (one `pread`), the
    /// rollup only when RSS is above the limit too and [`rollup_due`].
    fn uss_over_limit(&mut self) -> Option<u64> {
        let (statm, page) = self.statm.as_ref()?;
        let mut buf = [0u8; 128];
        let n = statm.read_at(&mut buf, 0).ok()?;
        let resident = parse_statm_resident(&buf[..n])?.saturating_mul(*page);
        if resident <= self.max_memory {
            return None; // no clock read either
        }
        memory_past(
            self.max_memory,
            resident,
            &mut self.last_rollup,
            Instant::now(),
            || {
                let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").ok()?;
                Some(parse_smaps_rollup(&rollup).ok()?.uss_bytes)
            },
        )
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
    use proptest::prelude::*;

    const MIB: u64 = 1 << 20;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// The rule at its edges: 64 MiB limit, the last read found 40 MiB of
    /// USS at 100 MiB of RSS.
    #[test]
    fn the_rollup_is_read_when_growth_could_have_passed_the_limit_or_100_ms_have() {
        let t0 = Instant::now();
        let last = RollupRead {
            uss: 40 * MIB,
            rss: 100 * MIB,
            at: t0,
        };
        let due = |rss, after| rollup_due(64 * MIB, rss, Some(&last), t0 + after);
        assert!(rollup_due(64 * MIB, 65 * MIB, None, t0), "no read yet");
        assert!(!due(100 * MIB, ms(0)));
        assert!(!due(123 * MIB, ms(99)), "23 MiB more cannot pass 24 MiB");
        assert!(due(124 * MIB, ms(0)), "24 MiB more could");
        assert!(!due(90 * MIB, ms(50)), "RSS fell");
        assert!(due(100 * MIB, SMAPS_REREAD), "100 ms on");
        // A read that found USS at or past the limit leaves no room.
        let full = RollupRead {
            uss: 64 * MIB,
            ..last
        };
        assert!(rollup_due(64 * MIB, 90 * MIB, Some(&full), t0));
    }

    proptest! {
        /// The rule, against the plain statement of it: the rollup is read
        /// iff there was no read yet, or USS then plus RSS grown since
        /// reaches the limit, or `SMAPS_REREAD` has passed.
        #[test]
        fn rollup_due_is_the_rule(
            limit in 1u64..=1 << 40,
            uss in 0u64..=1 << 41,
            rss_then in 0u64..=1 << 41,
            rss_now in 0u64..=1 << 41,
            elapsed_us in 0u64..300_000,
            read in any::<bool>(),
        ) {
            let t0 = Instant::now();
            let last = RollupRead { uss, rss: rss_then, at: t0 };
            let now = t0 + Duration::from_micros(elapsed_us);
            let grown = u128::from(rss_now.saturating_sub(rss_then));
            let could_pass = u128::from(uss) + grown >= u128::from(limit);
            let want = !read || could_pass || elapsed_us >= 100_000;
            prop_assert_eq!(rollup_due(limit, rss_now, read.then_some(&last), now), want);
        }

        /// A worker over a run of connections, its memory modelled as
        /// private (USS) and shared pages (RSS = both), each connection
        /// allocating, freeing and breaking copy-on-write pages and taking
        /// some time: the look never finds it past the limit while USS is
        /// not; once USS is past, it finds so at the first look after
        /// either no copy-on-write break since its last read, or
        /// `SMAPS_REREAD`; and it reads only when its RSS is above the
        /// limit.
        #[test]
        fn the_look_is_late_only_for_copy_on_write_and_by_100_ms_at_most(
            shared in 0u64..200,
            private in 0u64..64,
            steps in proptest::collection::vec(
                (0u64..24, 0u64..24, prop_oneof![4 => Just(0u64), 1 => 0u64..40], 0u64..60),
                1..200,
            ),
        ) {
            let limit = 64 * MIB;
            let (mut shared, mut private) = (shared * MIB, private * MIB);
            let t0 = Instant::now();
            let mut now = t0;
            let mut last = None;
            // Whether a copy-on-write break came since the last read.
            let mut cow_since_read = false;
            for (alloc, free, cow, took) in steps {
                private = private + alloc * MIB - (free * MIB).min(private);
                let cow = (cow * MIB).min(shared);
                shared -= cow;
                private += cow;
                cow_since_read |= cow > 0;
                now += ms(took);
                let rss = shared + private;
                let before = last;
                let mut read = false;
                let found = memory_past(limit, rss, &mut last, now, || {
                    read = true;
                    Some(private)
                });
                prop_assert!(!read || rss > limit, "a read with RSS under the limit");
                if read {
                    cow_since_read = false;
                }
                let stale = before.is_none_or(|b: RollupRead| now - b.at >= SMAPS_REREAD);
                if private > limit {
                    if !cow_since_read || stale {
                        prop_assert_eq!(found, Some(private), "USS past the limit, unseen");
                    }
                } else {
                    prop_assert_eq!(found, None);
                }
                if found.is_some() {
                    break; // it leaves
                }
            }
        }

        /// A `--preload` worker: RSS above the limit on shared pages, USS
        /// below, looked at every `gap` over a second: one read per
        /// `SMAPS_REREAD` at most, not one per connection.
        #[test]
        fn memory_shared_above_the_limit_is_read_every_100_ms_at_most(
            gap_us in 1u64..50_000,
            uss in 0u64..64,
        ) {
            let (limit, rss, uss) = (64 * MIB, 164 * MIB, uss * MIB);
            let t0 = Instant::now();
            let mut last = None;
            let mut reads = 0u64;
            let mut looks = 0u64;
            let mut now = t0;
            while now - t0 < Duration::from_secs(1) {
                let found = memory_past(limit, rss, &mut last, now, || {
                    reads += 1;
                    Some(uss)
                });
                prop_assert_eq!(found, None);
                looks += 1;
                now += Duration::from_micros(gap_us);
            }
            prop_assert!(reads <= 10, "{} reads over {} looks in a second", reads, looks);
            prop_assert!(reads >= 1);
        }
    }

    #[test]
    fn a_read_that_fails_counts_as_under_and_is_tried_again() {
        let t0 = Instant::now();
        let mut last = None;
        assert_eq!(memory_past(64, 100, &mut last, t0, || None), None);
        assert_eq!(last, None);
        assert_eq!(memory_past(64, 100, &mut last, t0, || Some(80)), Some(80));
    }

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
        let mut check = LimitCheck::start(SelfLimits {
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
            let mut check = LimitCheck::start(SelfLimits {
                max_memory,
                lifetime: Duration::ZERO,
            })
            .unwrap();
            (check.past(), check.last_rollup.map(|read| read.uss))
        };
        assert!(
            matches!(check(1024), (Some(Past::Memory(uss)), Some(read)) if uss > 1024 && read == uss)
        );
        assert_eq!(
            check(1 << 50),
            (None, None),
            "RSS under the limit: no rollup"
        );
    }
}
