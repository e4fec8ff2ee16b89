//! Preload: a heavy Python app (`bench/apps/heavy_app.py`: a 100 MiB
//! table filled and 0.5 s slept at import) under `forkpool run`, each
//! worker exec'd and loading it for itself, next to `forkpool run
//! --preload`, where a template loads it once and forks every worker.
//!
//! For each, two pools:
//! - *one start at a time*: a pool resting at 2 idle workers gets
//!   [`STEPS`] long requests one after another; each makes the pool fork
//!   exactly one worker (to keep 2 spare), and that worker's fork-order-to-
//!   Ready time is read from `slots[].ready_after_ms` in the status;
//! - *burst*: a pool resting at 2 idle workers (up to 32) gets
//!   [`BURST`] concurrent `?work_ms=1000` requests; reported are the time
//!   until the last is answered, the fork-order-to-Ready times of the
//!   workers it forked (queued behind each other: one template forks them
//!   in turn), and, once they are idle, USS/PSS per worker and the whole
//!   pool's PSS. Idle workers are kept (`--retire-grace 60s`) so the
//!   memory is read at the burst's size.
//!
//! The Rust demo (`forkpool-bench demo`, forked from its loaded parent)
//! takes the same burst, as the reference.

use std::net::SocketAddr;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use forkpool::status::Snapshot;
use serde::Serialize;

use super::app_pool::{self, AppPool, PoolMemory};
use super::latency::{self, Percentiles};
use super::pool_process::PoolProcess;
use super::{progress, POOL_START, POOL_STOP};

/// Long requests in the one-at-a-time part, each forking one worker.
pub const STEPS: usize = 6;
/// Concurrent requests in the burst, and the burst pool's ceiling.
pub const BURST: usize = 32;
/// Work per request in the burst, in milliseconds.
pub const BURST_WORK_MS: u64 = 1000;
/// The heavy app.
const APP: &str = "heavy_app:app";
/// How long any one pool may take to start or to settle.
const SETTLE: Duration = Duration::from_secs(60);
/// A request unanswered this long is an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// One way of running the heavy app.
#[derive(Debug, Clone, Serialize)]
pub struct PreloadRun {
    /// `forkpool run --preload` (true) or plain `forkpool run`.
    pub preload: bool,
    /// Fork order to Ready of workers forked one at a time, in ms.
    pub start_one: Percentiles,
    /// Fork order to Ready of the workers the burst forked, in ms.
    pub start_in_burst: Percentiles,
    /// Milliseconds from the burst until its last request was answered.
    pub burst_ms: u64,
    /// Burst requests that failed.
    pub burst_errors: usize,
    /// The pool after the burst, all workers idle.
    pub memory: PoolMemory,
}

/// The preload benchmark's results.
#[derive(Debug, Clone, Serialize)]
pub struct PreloadReport {
    /// Without and with `--preload`.
    pub runs: Vec<PreloadRun>,
    /// The Rust demo's burst, for reference: ms until the last answer.
    pub rust_demo_burst_ms: Option<u64>,
    /// Refork: see [`super::refork`].
    pub refork: Option<super::refork::ReforkRun>,
}

/// Runs both variants, the Rust reference and the refork part; what
/// cannot be measured is explained in `notes`.
pub fn run(notes: &mut Vec<String>) -> PreloadReport {
    let mut runs = Vec::new();
    for preload in [false, true] {
        let name = if preload { "run --preload" } else { "run" };
        progress(&format!("preload: heavy app under forkpool {name}"));
        match measure(preload) {
            Ok(run) => runs.push(run),
            Err(why) => {
                progress(&format!("  {why}"));
                notes.push(format!("preload, forkpool {name}: {why}"));
            }
        }
    }
    progress("preload: the Rust demo's burst");
    let rust_demo_burst_ms = match rust_demo_burst() {
        Ok(ms) => Some(ms),
        Err(why) => {
            notes.push(format!("preload, Rust demo burst: {why}"));
            None
        }
    };
    progress("preload: refork");
    let refork = match super::refork::measure() {
        Ok(run) => Some(run),
        Err(why) => {
            progress(&format!("  {why}"));
            notes.push(format!("refork: {why}"));
            None
        }
    };
    PreloadReport {
        runs,
        rust_demo_burst_ms,
        refork,
    }
}

fn options(preload: bool, max_children: usize, extra: &[&'static str]) -> Vec<String> {
    let mut options: Vec<String> = ["--min-children", "2", "--min-spare", "2", "--max-children"]
        .map(String::from)
        .to_vec();
    options.push(max_children.to_string());
    options.extend(extra.iter().map(|s| s.to_string()));
    if preload {
        options.push("--preload".to_string());
    }
    options
}

fn measure(preload: bool) -> Result<PreloadRun, String> {
    let start_one = one_at_a_time(preload)?;
    progress(&format!(
        "  one at a time: fork order to Ready median {:.0} ms",
        start_one.p50_ms
    ));
    let options = options(preload, BURST, &["--retire-grace", "60s"]);
    let pool = AppPool::start(APP, &as_str(&options), SETTLE)?;
    let before = pool.status()?;
    let (burst_ms, burst_errors) = burst(pool.addr())?;
    let after = pool.wait_for("idle after the burst", SETTLE, |s| {
        s.starting == 0 && s.busy == 0 && s.idle as usize == s.slots.len()
    })?;
    let start_in_burst = percentiles_ms(&starts_since(&before, &after));
    std::thread::sleep(Duration::from_millis(500));
    let memory = pool.memory()?;
    pool.stop()?;
    progress(&format!(
        "  burst answered in {burst_ms} ms ({burst_errors} errors); per idle worker PSS {} KiB, USS {} KiB",
        memory.worker_mean.pss_kib, memory.worker_mean.uss_kib
    ));
    Ok(PreloadRun {
        preload,
        start_one,
        start_in_burst,
        burst_ms,
        burst_errors,
        memory,
    })
}

fn as_str(options: &[String]) -> Vec<&str> {
    options.iter().map(String::as_str).collect()
}

/// [`STEPS`] long requests, one after another, each waited on until the
/// worker it made the pool fork is ready; their fork-to-Ready times.
fn one_at_a_time(preload: bool) -> Result<Percentiles, String> {
    let pool = AppPool::start(APP, &as_str(&options(preload, STEPS + 2, &[])), SETTLE)?;
    let first = pool.status()?;
    // Every held request must outlast all the steps, or a worker freed
    // early would stand in for the spare the next step should fork: each
    // is held until this file is gone (a time guessed from the first
    // starts fell short on a loaded machine, where later starts and the
    // pool's CPU hold take longer).
    let hold = HoldFile::create()?;
    let path = format!("/?hold={}", hold.path.display());
    let addr = pool.addr();
    let mut previous = first;
    let mut starts = Vec::new();
    let result = std::thread::scope(|scope| {
        let mut held = Vec::new();
        let mut stepped = Ok(());
        for step in 1..=STEPS {
            let path = path.clone();
            held.push(scope.spawn(move || app_pool::get(addr, &path, REQUEST_TIMEOUT)));
            match pool.wait_for("grown by one worker", SETTLE, |s| {
                s.busy as usize == step && s.idle >= 2 && s.starting == 0
            }) {
                Ok(now) => {
                    starts.extend(starts_since(&previous, &now));
                    previous = now;
                }
                Err(e) => {
                    stepped = Err(e);
                    break;
                }
            }
        }
        hold.release();
        for request in held {
            request
                .join()
                .map_err(|_| "a request thread panicked".to_string())??;
        }
        stepped
    });
    let stopped = pool.stop();
    result?;
    stopped?;
    if starts.len() != STEPS {
        return Err(format!(
            "expected {STEPS} new workers one at a time, saw {}",
            starts.len()
        ));
    }
    Ok(percentiles_ms(&starts))
}

/// A file whose existence holds the heavy app's `?hold=PATH` requests.
struct HoldFile {
    path: std::path::PathBuf,
}

impl HoldFile {
    fn create() -> Result<HoldFile, String> {
        static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("forkpool-bench-hold-{}-{n}", std::process::id()));
        std::fs::write(&path, b"").map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(HoldFile { path })
    }

    /// Lets every held request answer.
    fn release(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for HoldFile {
    fn drop(&mut self) {
        self.release();
    }
}

/// The fork-order-to-Ready times of the workers in `after` that were not
/// in `before`.
fn starts_since(before: &Snapshot, after: &Snapshot) -> Vec<u64> {
    after
        .slots
        .iter()
        .filter(|s| !before.slots.iter().any(|b| b.pid == s.pid))
        .filter_map(|s| s.ready_after_ms)
        .collect()
}

fn percentiles_ms(values: &[u64]) -> Percentiles {
    let mut histogram = latency::histogram();
    for &ms in values {
        latency::record(&mut histogram, Duration::from_millis(ms));
    }
    Percentiles::of(&histogram)
}

/// [`BURST`] concurrent `?work_ms=1000` requests: ms until the last was
/// answered, and how many failed.
fn burst(addr: SocketAddr) -> Result<(u64, usize), String> {
    let path = format!("/?work_ms={BURST_WORK_MS}");
    let barrier = Barrier::new(BURST + 1);
    let (started, outcomes) = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..BURST)
            .map(|_| {
                let (barrier, path) = (&barrier, &path);
                scope.spawn(move || {
                    barrier.wait();
                    let result = app_pool::get(addr, path, REQUEST_TIMEOUT);
                    (Instant::now(), result)
                })
            })
            .collect();
        barrier.wait();
        let started = Instant::now();
        let outcomes: Vec<_> = clients.into_iter().filter_map(|c| c.join().ok()).collect();
        (started, outcomes)
    });
    if outcomes.len() != BURST {
        return Err("a burst client thread panicked".to_string());
    }
    let last = outcomes.iter().map(|(at, _)| *at).max().unwrap_or(started);
    let errors = outcomes.iter().filter(|(_, r)| r.is_err()).count();
    if let Some((_, Err(why))) = outcomes.iter().find(|(_, r)| r.is_err()) {
        progress(&format!("  burst: {errors} failed, e.g. {why}"));
    }
    Ok((last.duration_since(started).as_millis() as u64, errors))
}

/// The same burst against the Rust demo, resting at 2 children.
fn rust_demo_burst() -> Result<u64, String> {
    let options = options(false, BURST, &["--retire-grace", "60s"]);
    let pool = PoolProcess::start_demo(&options, POOL_START)?;
    pool.settle(2, Duration::from_millis(300), SETTLE)?;
    let (ms, errors) = burst(pool.addr())?;
    pool.stop(POOL_STOP)?;
    if errors > 0 {
        return Err(format!("{errors} of the burst's requests failed"));
    }
    progress(&format!("  burst answered in {ms} ms"));
    Ok(ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkpool::status::SlotStatus;

    fn slot(pid: i32, ready_after_ms: Option<u64>) -> SlotStatus {
        let mut s: SlotStatus = serde_json::from_value(serde_json::json!({
            "slot": 0, "pid": pid, "state": "idle", "generation": 1, "served": 0,
            "last_heard_ms": 0
        }))
        .unwrap();
        s.ready_after_ms = ready_after_ms;
        s
    }

    fn snapshot(slots: Vec<SlotStatus>) -> Snapshot {
        let mut s: Snapshot = serde_json::from_value(serde_json::json!({
            "pid": 1, "generation": 1, "dispatch": "handoff", "uptime_ms": 0, "line": "",
            "starting": 0, "idle": 0, "busy": 0, "leaving": 0, "bounds": [0, 0, 0, 0],
            "slots": [], "totals": {}
        }))
        .unwrap();
        s.slots = slots;
        s
    }

    #[test]
    fn only_new_workers_count_as_starts() {
        let before = snapshot(vec![slot(10, Some(700)), slot(11, Some(650))]);
        let after = snapshot(vec![
            slot(10, Some(700)),
            slot(12, Some(4)),
            slot(11, Some(650)),
            slot(13, None), // not ready yet
            slot(14, Some(9)),
        ]);
        assert_eq!(starts_since(&before, &after), [4, 9]);
    }
}
