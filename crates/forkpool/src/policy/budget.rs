//! Budgets that bound what one child can make the supervisor do: the
//! messages it may send on its back-channel per second, and the stderr
//! lines and bytes per second the supervisor logs for it. Pure rules with
//! no I/O; `supervisor/reports.rs` and `supervisor/output.rs` apply them.

use std::time::{Duration, Instant};

/// Messages per second a child may send, on average, before it is killed
/// as `misbehaved`. A child serving one connection at a time sends about
/// one message per connection plus one Pong per ping, so this is far above
/// any honest rate; it stops a flood from holding the supervisor's CPU.
pub(crate) const MESSAGES_PER_SECOND: u32 = 20_000;
/// Stderr lines per second logged for one worker (a burst of
/// [`STDERR_LINE_BURST`] passes at once, a traceback or a stack dump).
/// Well above an access log's line per request: a worker answering a
/// small request in 0.2 ms, faster than any Python or Perl app, logs
/// 5,000 lines a second, and must never be taken for a flood.
pub(crate) const STDERR_LINES_PER_SECOND: u32 = 10_000;
const STDERR_LINE_BURST: u32 = 20_000;
/// Stderr bytes per second logged for one worker (10,000 access-log lines
/// of 200 bytes).
const STDERR_BYTES_PER_SECOND: u32 = 2 * 1024 * 1024;
const STDERR_BYTE_BURST: u32 = 4 * 1024 * 1024;
/// A worker still over its stderr budget after this long is killed.
pub(crate) const STDERR_FLOOD_LIMIT: Duration = Duration::from_secs(5);
/// Drops this far apart belong to different floods.
const FLOOD_GAP: Duration = Duration::from_secs(1);

/// A token bucket: `rate` tokens a second, at most `burst` saved up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Budget {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Option<Instant>,
}

impl Budget {
    /// A full bucket.
    pub fn new(rate: u32, burst: u32) -> Budget {
        Budget {
            rate: f64::from(rate),
            burst: f64::from(burst),
            tokens: f64::from(burst),
            at: None,
        }
    }

    /// Tokens a second.
    pub fn rate(&self) -> u32 {
        self.rate as u32
    }

    /// Spends `n` tokens at `now` if there are that many; says whether it
    /// could.
    pub fn spend(&mut self, now: Instant, n: u32) -> bool {
        if let Some(at) = self.at {
            let refill = now.saturating_duration_since(at).as_secs_f64() * self.rate;
            self.tokens = (self.tokens + refill).min(self.burst);
        }
        self.at = Some(now);
        let n = f64::from(n);
        if self.tokens >= n {
            self.tokens -= n;
            true
        } else {
            false
        }
    }
}

/// The budget of one child's back-channel messages.
pub(crate) fn message_budget() -> Budget {
    Budget::new(MESSAGES_PER_SECOND, MESSAGES_PER_SECOND)
}

/// The budget of a `kernel` child on the messages path (`G`): twice the
/// others', for it says both busy and idle for each busy period (`B`,
/// `I`) where a handoff child says one (`I` or `N`) and a `K` child none.
pub(crate) fn message_budget_by_messages() -> Budget {
    Budget::new(2 * MESSAGES_PER_SECOND, 2 * MESSAGES_PER_SECOND)
}

/// What to do with one stderr line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Log it.
    Log,
    /// Drop it; `first` for the first line of a flood, which gets the one
    /// summary line in the log.
    Drop { first: bool },
}

/// The stderr budget of one worker.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OutputGate {
    lines: Budget,
    bytes: Budget,
    /// The flood in progress: when it started and when a line was last
    /// dropped.
    flood: Option<(Instant, Instant)>,
    /// Lines dropped and not yet counted in the totals.
    pub dropped: u64,
}

impl Default for OutputGate {
    fn default() -> Self {
        OutputGate {
            lines: Budget::new(STDERR_LINES_PER_SECOND, STDERR_LINE_BURST),
            bytes: Budget::new(STDERR_BYTES_PER_SECOND, STDERR_BYTE_BURST),
            flood: None,
            dropped: 0,
        }
    }
}

impl OutputGate {
    /// Whether a line of `len` bytes read at `now` is logged.
    pub fn admit(&mut self, now: Instant, len: usize) -> Admit {
        let len = u32::try_from(len).unwrap_or(u32::MAX);
        // Both budgets are charged only for a line that is logged.
        let lines_ok = self.lines.spend(now, 0) && self.lines.tokens >= 1.0;
        if lines_ok && self.bytes.spend(now, len) {
            self.lines.spend(now, 1);
            return Admit::Log;
        }
        self.dropped += 1;
        let first = match self.flood {
            Some((start, last)) if now.saturating_duration_since(last) < FLOOD_GAP => {
                self.flood = Some((start, now));
                false
            }
            _ => {
                self.flood = Some((now, now));
                true
            }
        };
        Admit::Drop { first }
    }

    /// Whether the worker has been over budget, without a pause, for
    /// [`STDERR_FLOOD_LIMIT`].
    pub fn flooding_too_long(&self, now: Instant) -> bool {
        self.flood.is_some_and(|(start, last)| {
            now.saturating_duration_since(last) < FLOOD_GAP
                && last.saturating_duration_since(start) >= STDERR_FLOOD_LIMIT
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_spends_its_burst_then_refills_at_its_rate() {
        let t0 = Instant::now();
        let mut b = Budget::new(10, 5);
        assert!((0..5).all(|_| b.spend(t0, 1)));
        assert!(!b.spend(t0, 1));
        assert!(b.spend(t0 + Duration::from_millis(100), 1));
        assert!(!b.spend(t0 + Duration::from_millis(100), 1));
        // Saving up stops at the burst.
        let later = t0 + Duration::from_secs(60);
        assert!((0..5).all(|_| b.spend(later, 1)));
        assert!(!b.spend(later, 1));
    }

    #[test]
    fn a_flood_of_lines_is_dropped_with_one_first_and_then_judged() {
        let t0 = Instant::now();
        let mut g = OutputGate::default();
        let mut firsts = 0;
        let mut logged = 0;
        // 100,000 lines a second for 6 seconds.
        for i in 0..600_000u64 {
            let now = t0 + Duration::from_micros(i * 10);
            match g.admit(now, 40) {
                Admit::Log => logged += 1,
                Admit::Drop { first } => firsts += u32::from(first),
            }
        }
        assert_eq!(firsts, 1);
        let allowed = STDERR_LINE_BURST + 6 * STDERR_LINES_PER_SECOND;
        assert!(logged <= allowed + 1, "{logged} logged");
        assert_eq!(g.dropped, 600_000 - u64::from(logged));
        assert!(g.flooding_too_long(t0 + Duration::from_secs(6)));
        // A pause ends the flood.
        let after = t0 + Duration::from_secs(9);
        assert!(!g.flooding_too_long(after));
        assert_eq!(g.admit(after, 40), Admit::Log);
    }

    #[test]
    fn honest_output_is_all_logged() {
        let t0 = Instant::now();
        let mut g = OutputGate::default();
        // A 500-line traceback, then 50 lines a second for a minute.
        assert!((0..500).all(|_| g.admit(t0, 120) == Admit::Log));
        for i in 0..3_000u64 {
            let now = t0 + Duration::from_millis(i * 20);
            assert_eq!(g.admit(now, 120), Admit::Log);
        }
        assert!(!g.flooding_too_long(t0 + Duration::from_secs(60)));
        // Then a busy worker's access log: 5,000 lines of 200 bytes a
        // second for 20 s.
        let t1 = t0 + Duration::from_secs(61);
        for i in 0..100_000u64 {
            let now = t1 + Duration::from_micros(i * 200);
            assert_eq!(g.admit(now, 200), Admit::Log, "line {i}");
        }
        assert!(!g.flooding_too_long(t1 + Duration::from_secs(20)));
    }

    #[test]
    fn bytes_count_too() {
        let t0 = Instant::now();
        let mut g = OutputGate::default();
        let long = 8 * 1024;
        let logged = (0..1_000)
            .filter(|_| g.admit(t0, long) == Admit::Log)
            .count();
        assert_eq!(logged, STDERR_BYTE_BURST as usize / long);
    }
}
