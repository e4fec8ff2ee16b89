//! Throughput and latency: close per request and keep-alive, at each
//! concurrency, against one server.
//!
//! The pool is started once per dispatch mode with `--max-children 64`
//! (the same ceiling as the Apache peer's `MaxRequestWorkers 64`) and
//! serves all of that mode's runs; each run has its own warm-up, so growth
//! left over from the run before does not count against it.

use forkpool::config::DispatchMode;
use serde::Serialize;

use super::latency::Percentiles;
use super::loadgen::{self, ConnectionMode, ErrorCounts};
use super::pool_process::PoolProcess;
use super::target::Target;
use super::{pool_args, progress, BenchArgs, POOL_START, POOL_STOP};

/// One server at one concurrency in one connection mode.
#[derive(Debug, Clone, Serialize)]
pub struct ThroughputRow {
    /// `forkpool/<dispatch>`, a peer's name, or `url`.
    pub server: String,
    /// Close per request or keep-alive.
    pub connection: ConnectionMode,
    /// Connections with a request outstanding at all times.
    pub concurrency: usize,
    /// Status-200 responses completed in the window.
    pub requests: u64,
    /// `requests` per second of the window.
    pub rps: f64,
    /// Latency percentiles of those requests.
    #[serde(flatten)]
    pub latency: Percentiles,
    /// Failed requests in the window, by kind.
    pub errors: ErrorCounts,
}

/// Every connection mode and concurrency against `target`.
pub fn measure(
    server: &str,
    target: &Target,
    args: &BenchArgs,
) -> Result<Vec<ThroughputRow>, String> {
    let mut rows = Vec::new();
    for connection in [ConnectionMode::Close, ConnectionMode::KeepAlive] {
        for &concurrency in &args.concurrency {
            progress(&format!(
                "throughput {server} {} c={concurrency}",
                connection.name()
            ));
            let outcome = loadgen::run(
                &args.load(target.clone(), connection, concurrency),
                &mut |_| {},
            )?;
            let row = ThroughputRow {
                server: server.to_string(),
                connection,
                concurrency,
                requests: outcome.requests,
                rps: outcome.rate(),
                latency: Percentiles::of(&outcome.latency),
                errors: outcome.errors,
            };
            progress(&format!(
                "  {:.0} req/s, p99 {:.2} ms, {} errors",
                row.rps,
                row.latency.p99_ms,
                row.errors.total()
            ));
            rows.push(row);
        }
    }
    Ok(rows)
}

/// [`measure`] against a `forkpool demo` started in `mode`.
pub fn measure_pool(mode: DispatchMode, args: &BenchArgs) -> Result<Vec<ThroughputRow>, String> {
    let pool = PoolProcess::start_demo(&pool_args(mode, &["--max-children", "64"]), POOL_START)?;
    let rows = measure(
        &format!("forkpool/{mode}"),
        &Target::at(pool.addr(), "/"),
        args,
    )?;
    pool.stop(POOL_STOP)?;
    Ok(rows)
}
