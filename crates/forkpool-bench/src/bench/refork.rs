//! Refork: `bench/apps/lazy_cache_app.py` fills a 50 MiB cache over its
//! first ten requests, so under plain `--preload` every worker builds its
//! own copy. With `--refork-after N`, once the lowest slot has served N
//! connections it becomes the template and the pool rolls onto workers
//! forked from it, which share its warm cache.
//!
//! A pool of [`WORKERS`] is warmed with rounds of concurrent requests
//! until every worker has served ten (each holds its own cache); the
//! whole pool's PSS is read. Then requests one at a time go to the lowest
//! slot until the refork has happened and the roll is over, every worker
//! serves one more request, and the PSS is read again.

use std::time::Duration;

use serde::Serialize;

use super::app_pool::{self, AppPool, PoolMemory};
use super::progress;

/// Workers in the pool.
pub const WORKERS: usize = 4;
/// The refork threshold: connections the lowest slot serves first.
pub const REFORK_AFTER: u64 = 200;
/// Requests after which a worker's cache is full.
const WARM_REQUESTS: u64 = 10;
const APP: &str = "lazy_cache_app:app";
const SETTLE: Duration = Duration::from_secs(60);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The refork part's results.
#[derive(Debug, Clone, Serialize)]
pub struct ReforkRun {
    /// Workers in the pool.
    pub workers: usize,
    /// `--refork-after`.
    pub refork_after: u64,
    /// The pool with every worker warm, before the refork.
    pub before: PoolMemory,
    /// The pool after the refork, every worker forked from the warm one.
    pub after: PoolMemory,
    /// The template's pid before and after.
    pub template_pids: (i32, i32),
    /// Requests sent over the run.
    pub requests: u64,
    /// Requests that failed.
    pub errors: u64,
}

/// Runs the refork part once.
pub fn measure() -> Result<ReforkRun, String> {
    let workers = WORKERS.to_string();
    let refork_after = REFORK_AFTER.to_string();
    let options = [
        "--preload",
        "--refork-after",
        &refork_after,
        "--min-children",
        &workers,
        "--max-children",
        &workers,
        "--min-spare",
        "0",
    ];
    let pool = AppPool::start(APP, &options, SETTLE)?;
    let result = warm_and_refork(&pool);
    let stopped = pool.stop();
    let run = result?;
    stopped?;
    Ok(run)
}

fn warm_and_refork(pool: &AppPool) -> Result<ReforkRun, String> {
    let mut counts = Counts::default();
    // Rounds of concurrent requests that each take a moment, so that
    // each lands on its own worker, until all are warm.
    for _ in 0..WARM_REQUESTS * 10 {
        counts.round(pool, "/?work_ms=20");
        let status = pool.status()?;
        if status.slots.iter().all(|s| s.served >= WARM_REQUESTS) {
            break;
        }
    }
    let warm = pool.wait_for("idle and warm", SETTLE, |s| {
        s.busy == 0 && s.slots.iter().all(|s| s.served >= WARM_REQUESTS)
    })?;
    let template_before = warm.templates.first().map_or(0, |t| t.pid);
    let before = pool.memory()?;
    progress(&format!(
        "  warm, before the refork: pool PSS {} KiB",
        before.total_pss_kib
    ));
    // One at a time: each goes to the lowest slot, until it reforks.
    for sent in 0..REFORK_AFTER * 2 {
        counts.one(pool, "/");
        if sent % 10 == 0 && pool.status()?.totals.reforks >= 1 {
            break;
        }
    }
    let after = pool.wait_for("rolled onto the new template", SETTLE, |s| {
        s.totals.reforks >= 1
            && s.starting == 0
            && s.leaving == 0
            && s.busy == 0
            && s.slots.len() == WORKERS
            && s.slots.iter().all(|w| w.generation == s.serving_generation)
            && s.templates.len() == 1
    })?;
    let template_after = after.templates.first().map_or(0, |t| t.pid);
    counts.round(pool, "/?work_ms=20");
    pool.wait_for("idle", SETTLE, |s| s.busy == 0)?;
    std::thread::sleep(Duration::from_millis(300));
    let after = pool.memory()?;
    progress(&format!(
        "  after the refork: pool PSS {} KiB ({} requests, {} failed)",
        after.total_pss_kib, counts.sent, counts.failed
    ));
    Ok(ReforkRun {
        workers: WORKERS,
        refork_after: REFORK_AFTER,
        before,
        after,
        template_pids: (template_before, template_after),
        requests: counts.sent,
        errors: counts.failed,
    })
}

/// Requests sent and failed.
#[derive(Default)]
struct Counts {
    sent: u64,
    failed: u64,
}

impl Counts {
    fn one(&mut self, pool: &AppPool, path: &str) {
        self.sent += 1;
        if app_pool::get(pool.addr(), path, REQUEST_TIMEOUT).is_err() {
            self.failed += 1;
        }
    }

    /// [`WORKERS`] requests at once.
    fn round(&mut self, pool: &AppPool, path: &str) {
        let addr = pool.addr();
        let failed = std::thread::scope(|scope| {
            let requests: Vec<_> = (0..WORKERS)
                .map(|_| scope.spawn(move || app_pool::get(addr, path, REQUEST_TIMEOUT)))
                .collect();
            requests
                .into_iter()
                .map(|r| r.join())
                .filter(|r| !matches!(r, Ok(Ok(()))))
                .count()
        });
        self.sent += WORKERS as u64;
        self.failed += failed as u64;
    }
}
