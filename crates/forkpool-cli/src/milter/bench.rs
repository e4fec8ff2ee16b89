//! The rule file's `[bench]` table: a benchmarking aid that makes the
//! filter do what the reference filters of `bench/milter.sh` do (spin CPU
//! per message, crash on one message in N), so the comparison is even.
//! Not for filtering mail.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nix::time::{clock_gettime, ClockId};
use serde::Deserialize;

/// `[bench]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BenchSpec {
    work_us: Option<u64>,
    crash_every: Option<u64>,
    crash: Option<String>,
}

/// How the filter crashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crash {
    /// `abort()`, as a C library the filter calls might: the child dies.
    Abort,
    /// A Rust panic in the hook: its conversation is tempfailed and closed.
    Panic,
}

/// The most CPU a message may be made to cost: one second.
const MAX_WORK_US: u64 = 1_000_000;

/// What the filter does per message for a benchmark.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bench {
    /// CPU spun at end of message (this thread's CPU time, as
    /// `bench/milter/add_header.c -w` spins).
    pub work: Duration,
    /// Crash on every Nth message of a child, and how.
    pub crash: Option<(u64, Crash)>,
}

impl Bench {
    /// Checks `[bench]`.
    pub fn compile(spec: BenchSpec) -> Result<Bench, String> {
        let work_us = spec.work_us.unwrap_or(0);
        if work_us > MAX_WORK_US {
            return Err(format!(
                "bench: work_us = {work_us} is more than a second of CPU per message; use at most {MAX_WORK_US}"
            ));
        }
        let how = match spec.crash.as_deref() {
            None | Some("abort") => Crash::Abort,
            Some("panic") => Crash::Panic,
            Some(other) => {
                return Err(format!(
                    "bench: crash = {other:?} is unknown; use \"abort\" or \"panic\""
                ))
            }
        };
        let crash = match spec.crash_every {
            None if spec.crash.is_some() => {
                return Err(
                    "bench: `crash` needs crash_every = N (crash on one message in N)".to_string(),
                )
            }
            None => None,
            Some(0) => {
                return Err(
                    "bench: crash_every = 0 crashes on no message; remove it instead".to_string(),
                )
            }
            Some(n) => Some((n, how)),
        };
        Ok(Bench {
            work: Duration::from_micros(work_us),
            crash,
        })
    }

    /// The work for one message at end of message; `messages` counts the
    /// child's messages. Crashes (does not return) on every Nth.
    pub fn on_message(&self, messages: &AtomicU64) {
        if let Some((every, how)) = self.crash {
            let n = messages.fetch_add(1, Ordering::Relaxed) + 1;
            if n % every == 0 {
                match how {
                    Crash::Abort => std::process::abort(),
                    Crash::Panic => panic!("bench: crash on message {n} (crash_every = {every})"),
                }
            }
        }
        if !self.work.is_zero() {
            spin(self.work);
        }
    }
}

/// Spins until this thread has used `work` of CPU.
fn spin(work: Duration) {
    let cpu = || clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).map(Duration::from);
    let Ok(start) = cpu() else { return };
    while cpu().is_ok_and(|now| now.saturating_sub(start) < work) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compile(text: &str) -> Result<Bench, String> {
        Bench::compile(toml::from_str(text).unwrap())
    }

    #[test]
    fn reads_work_and_crash() {
        assert_eq!(compile("").unwrap(), Bench::default());
        let b = compile("work_us = 2000\ncrash_every = 1000\ncrash = \"panic\"").unwrap();
        assert_eq!(b.work, Duration::from_micros(2000));
        assert_eq!(b.crash, Some((1000, Crash::Panic)));
        assert_eq!(
            compile("crash_every = 5").unwrap().crash,
            Some((5, Crash::Abort))
        );
    }

    #[test]
    fn bad_values_name_the_fix() {
        assert!(compile("work_us = 5000000")
            .unwrap_err()
            .contains("at most"));
        assert!(compile("crash_every = 0")
            .unwrap_err()
            .contains("remove it"));
        assert!(compile("crash = \"panic\"")
            .unwrap_err()
            .contains("needs crash_every"));
        assert!(compile("crash_every = 3\ncrash = \"segv\"")
            .unwrap_err()
            .contains("\"abort\" or \"panic\""));
    }

    #[test]
    fn spins_this_threads_cpu() {
        let cpu = || Duration::from(clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).unwrap());
        let before = cpu();
        Bench {
            work: Duration::from_millis(20),
            crash: None,
        }
        .on_message(&AtomicU64::new(0));
        assert!(cpu() - before >= Duration::from_millis(20));
    }

    #[test]
    fn panics_on_every_nth_message() {
        let bench = Bench {
            work: Duration::ZERO,
            crash: Some((3, Crash::Panic)),
        };
        let messages = AtomicU64::new(0);
        let run = || std::panic::catch_unwind(|| bench.on_message(&messages)).is_err();
        let crashed: Vec<bool> = (0..6).map(|_| run()).collect();
        assert_eq!(crashed, [false, false, true, false, false, true]);
    }
}
