//! The slow-request capture: what a worker was doing when it had been busy
//! on one connection for too long, gathered without stopping it, and the
//! limiter that keeps a pool full of slow workers from flooding the log.

use std::fmt;
use std::time::{Duration, Instant};

use super::procfs;

/// Everything captured about one slow (or about to be killed) worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlowCapture {
    /// The worker's slot.
    pub slot: usize,
    /// Its process id.
    pub pid: i32,
    /// The client's address, when known.
    pub peer: Option<String>,
    /// How long it had been busy on the connection.
    pub busy: Duration,
    /// The stack the worker wrote itself on the stack-dump signal (Python
    /// and Perl helpers), when it wrote one.
    pub worker_stack: Option<String>,
    /// `/proc/PID/wchan`: the kernel function it sleeps in.
    pub wchan: Option<String>,
    /// `/proc/PID/syscall`: the system call it is blocked in, and its
    /// arguments.
    pub syscall: Option<String>,
    /// `/proc/PID/stack`: its kernel stack (usually root only).
    pub kernel_stack: Option<String>,
}

impl SlowCapture {
    /// Reads what `/proc` tells about `pid` now. The worker's own stack is
    /// added by the caller once the worker has written it.
    pub fn take(slot: usize, pid: i32, peer: Option<String>, busy: Duration) -> SlowCapture {
        SlowCapture {
            slot,
            pid,
            peer,
            busy,
            worker_stack: None,
            wchan: procfs::read_wchan(pid),
            syscall: procfs::read_syscall(pid),
            kernel_stack: procfs::read_kernel_stack(pid),
        }
    }
}

/// One log record: a header line with `key=value` fields, then each
/// multi-line part under its own `--- name` line, indented, so the record
/// reads as one block and a missing part says so rather than vanishing.
impl fmt::Display for SlowCapture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unknown = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".to_string());
        write!(
            f,
            "slow request: slot={} pid={} peer={} busy_ms={} wchan={} syscall={}",
            self.slot,
            self.pid,
            unknown(&self.peer),
            self.busy.as_millis(),
            unknown(&self.wchan),
            unknown(&self.syscall),
        )?;
        for (name, text, missing) in [
            (
                "worker stack",
                &self.worker_stack,
                "(none: the worker wrote no stack)",
            ),
            (
                "kernel stack",
                &self.kernel_stack,
                "(not readable: needs root)",
            ),
        ] {
            write!(f, "\n--- {name}")?;
            match text {
                Some(text) => {
                    for line in text.lines() {
                        write!(f, "\n    {line}")?;
                    }
                }
                None => write!(f, "\n    {missing}")?,
            }
        }
        Ok(())
    }
}

/// Allows at most `burst` captures at once and one more every `interval`
/// after that (a token bucket), so a stuck pool logs a few complete
/// records instead of thousands. Pure: the caller passes the time.
#[derive(Debug, Clone)]
pub struct CaptureLimiter {
    interval: Duration,
    burst: u32,
    tokens: u32,
    refilled: Option<Instant>,
    suppressed: u64,
}

impl CaptureLimiter {
    /// A limiter allowing `burst` captures, then one per `interval`.
    /// `burst` 0 is taken as 1.
    pub fn new(burst: u32, interval: Duration) -> Self {
        let burst = burst.max(1);
        CaptureLimiter {
            interval,
            burst,
            tokens: burst,
            refilled: None,
            suppressed: 0,
        }
    }

    /// Whether a capture may be taken at `now`. A refusal is counted; the
    /// next allowed capture can report the count with
    /// [`CaptureLimiter::take_suppressed`].
    pub fn allow(&mut self, now: Instant) -> bool {
        let since = *self.refilled.get_or_insert(now);
        if !self.interval.is_zero() {
            let elapsed = now.saturating_duration_since(since);
            let earned = (elapsed.as_nanos() / self.interval.as_nanos()) as u64;
            if earned > 0 {
                self.tokens = (self.tokens as u64 + earned).min(self.burst as u64) as u32;
                self.refilled = Some(since + self.interval * earned as u32);
            }
        } else {
            self.tokens = self.burst;
        }
        if self.tokens > 0 {
            self.tokens -= 1;
            true
        } else {
            self.suppressed += 1;
            false
        }
    }

    /// Captures refused since the last call.
    pub fn take_suppressed(&mut self) -> u64 {
        std::mem::take(&mut self.suppressed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> SlowCapture {
        SlowCapture {
            slot: 3,
            pid: 4242,
            peer: Some("127.0.0.1:50312".to_string()),
            busy: Duration::from_millis(5012),
            worker_stack: Some(
                "Thread 0x7f (most recent call first):\n  File \"app.py\", line 9 in crunch"
                    .to_string(),
            ),
            wchan: Some("do_select".to_string()),
            syscall: Some("23 0x5 0x7ffd 0x0 0x0 0x7ffd 0x0 0x7ffd 0x7f12".to_string()),
            kernel_stack: None,
        }
    }

    #[test]
    fn record_has_every_field_and_the_stack_indented() {
        let text = record().to_string();
        let expected = "slow request: slot=3 pid=4242 peer=127.0.0.1:50312 busy_ms=5012 \
wchan=do_select syscall=23 0x5 0x7ffd 0x0 0x0 0x7ffd 0x0 0x7ffd 0x7f12
--- worker stack
    Thread 0x7f (most recent call first):
      File \"app.py\", line 9 in crunch
--- kernel stack
    (not readable: needs root)";
        assert_eq!(text, expected);
    }

    #[test]
    fn missing_parts_are_marked() {
        let mut r = record();
        r.peer = None;
        r.worker_stack = None;
        r.wchan = None;
        let text = r.to_string();
        assert!(text.contains("peer=- "), "{text}");
        assert!(text.contains("wchan=- "), "{text}");
        assert!(text.contains("(none: the worker wrote no stack)"), "{text}");
    }

    #[test]
    fn take_reads_proc_of_a_sleeping_process() {
        let child = procfs::tests::Sleeper::start();
        let wchan = child.wait_asleep();
        let capture = SlowCapture::take(0, child.pid(), None, Duration::ZERO);
        assert!(wchan.is_some());
        assert_eq!(capture.wchan, wchan, "{capture}");
        assert_eq!(capture.pid, child.pid());
    }

    #[test]
    fn limiter_allows_a_burst_then_one_per_interval() {
        let t0 = Instant::now();
        let second = Duration::from_secs(1);
        let mut l = CaptureLimiter::new(2, second * 10);
        assert!(l.allow(t0));
        assert!(l.allow(t0));
        assert!(!l.allow(t0));
        assert!(!l.allow(t0 + second * 9));
        assert_eq!(l.take_suppressed(), 2);
        assert_eq!(l.take_suppressed(), 0);
        assert!(l.allow(t0 + second * 10));
        assert!(!l.allow(t0 + second * 11));
        // A long quiet spell refills up to the burst, no further.
        let later = t0 + second * 1000;
        assert!(l.allow(later));
        assert!(l.allow(later));
        assert!(!l.allow(later));
    }

    #[test]
    fn limiter_refill_keeps_the_remainder() {
        let t0 = Instant::now();
        let mut l = CaptureLimiter::new(1, Duration::from_secs(10));
        assert!(l.allow(t0));
        // 15 s earn one token; the 5 s left over count towards the next.
        assert!(l.allow(t0 + Duration::from_secs(15)));
        assert!(l.allow(t0 + Duration::from_secs(20)));
        assert!(!l.allow(t0 + Duration::from_secs(21)));
    }
}
