//! What a request costs the pool: context switches, CPU time and futile
//! wake-ups, per dispatch mode.
//!
//! Each row is a fresh pool held at 16 children (`--min-children 16`), so
//! there are always idle children to wake: that is where a thundering herd
//! shows. The load is close per request (every request is an accept). Context
//! switches and CPU seconds are read from `/proc` for the parent and all its
//! children at the window's edges (see `procstat` for what survives children
//! exiting); futile wake-ups come from the pool's own `totals` line and
//! cover its whole life, warm-up included, so they are divided by the
//! connections it accepted, not by the window's requests.

use forkpool::config::DispatchMode;
use serde::Serialize;

use super::loadgen::{self, ConnectionMode, Phase};
use super::pool_process::PoolProcess;
use super::procstat::{self, Snapshot};
use super::target::Target;
use super::{pool_args, progress, BenchArgs, POOL_START, POOL_STOP};

/// Children the pool keeps in the wake-up benchmark.
const CHILDREN: &str = "16";

/// One dispatch mode at one concurrency.
#[derive(Debug, Clone, Serialize)]
pub struct WakeupRow {
    /// The dispatch mode.
    pub dispatch: DispatchMode,
    /// Concurrent connections (close per request).
    pub concurrency: usize,
    /// Status-200 responses in the window.
    pub requests: u64,
    /// Requests per second of the window.
    pub rps: f64,
    /// Failed requests in the window.
    pub errors: u64,
    /// Voluntary plus involuntary context switches of the parent and its
    /// children in the window, per request.
    pub ctxt_switches_per_request: f64,
    /// User plus system CPU seconds of the parent and its children in the
    /// window, per 10,000 requests.
    pub cpu_seconds_per_10k: f64,
    /// Connections the pool accepted over its life (its `totals` line).
    pub accepted: u64,
    /// Futile wake-ups over the pool's life per accepted connection.
    pub futile_wakeups_per_request: f64,
}

/// Measures `mode` at `concurrency` on a fresh pool.
pub fn measure(
    mode: DispatchMode,
    concurrency: usize,
    args: &BenchArgs,
) -> Result<WakeupRow, String> {
    progress(&format!("wakeups forkpool/{mode} c={concurrency}"));
    let pool =
        PoolProcess::start_demo(&pool_args(mode, &["--min-children", CHILDREN]), POOL_START)?;
    let spec = args.load(
        Target::at(pool.addr(), "/"),
        ConnectionMode::Close,
        concurrency,
    );
    let (mut before, mut after) = (None, None);
    let outcome = loadgen::run(&spec, &mut |phase| {
        let snapshot = Snapshot::take(pool.pid());
        match phase {
            Phase::WindowStart => before = Some(snapshot),
            Phase::WindowEnd => after = Some(snapshot),
        }
    })?;
    let totals = pool.stop(POOL_STOP)?;
    let read = |s: Option<std::io::Result<Snapshot>>| {
        s.ok_or("the load generator skipped a phase")?
            .map_err(|e| format!("cannot read the pool's /proc entries: {e}"))
    };
    let (before, after) = (read(before)?, read(after)?);
    let usage = procstat::usage_between(&before, &after, procstat::clock_ticks_per_second());
    let requests = outcome.requests.max(1) as f64;
    let row = WakeupRow {
        dispatch: mode,
        concurrency,
        requests: outcome.requests,
        rps: outcome.rate(),
        errors: outcome.errors.total(),
        ctxt_switches_per_request: usage.ctxt_switches as f64 / requests,
        cpu_seconds_per_10k: usage.cpu_seconds / requests * 10_000.0,
        accepted: totals.accepted,
        futile_wakeups_per_request: totals.futile_wakeups as f64 / totals.accepted.max(1) as f64,
    };
    progress(&format!(
        "  {:.1} switches/req, {:.2} CPU s/10k req, {:.2} futile/req",
        row.ctxt_switches_per_request, row.cpu_seconds_per_10k, row.futile_wakeups_per_request
    ));
    Ok(row)
}
