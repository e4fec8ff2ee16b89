//! Memory per idle child, with and without a table preloaded in the parent.
//!
//! `forkpool-bench demo --preload-mib N` (the demo server with a preloaded table) makes the parent allocate and touch an
//! N MiB table before forking, so its children share it copy-on-write. Each
//! child's RSS then includes the table, but its USS (pages only it has)
//! should not grow, and its PSS should grow by only N MiB divided by the
//! number of processes sharing it. The pool is held at 4 idle children and
//! read from `/proc/PID/smaps_rollup` once its child count has been steady
//! for half a second.

use std::time::Duration;

use serde::Serialize;

use super::pool_process::PoolProcess;
use super::procstat::{self, Memory};
use super::{progress, POOL_START, POOL_STOP};

/// The preloads compared, in MiB.
pub const PRELOADS_MIB: [u64; 2] = [0, 100];
/// Idle children in the pool.
const CHILDREN: usize = 4;

/// One preload size.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryRow {
    /// The parent's preloaded table, in MiB.
    pub preload_mib: u64,
    /// Children measured.
    pub children: usize,
    /// The mean over the children.
    pub child_mean: Memory,
    /// The parent.
    pub parent: Memory,
}

/// Starts a pool with `preload_mib` and measures its idle children.
pub fn measure(preload_mib: u64) -> Result<MemoryRow, String> {
    progress(&format!("memory --preload-mib {preload_mib}"));
    let args = [
        "--preload-mib".to_string(),
        preload_mib.to_string(),
        "--min-children".to_string(),
        CHILDREN.to_string(),
    ];
    let pool = PoolProcess::start_demo(&args, POOL_START)?;
    let children = pool.settle(
        CHILDREN,
        Duration::from_millis(500),
        Duration::from_secs(10),
    )?;
    let read = |pid: i32| {
        procstat::memory_of(pid).map_err(|e| format!("cannot read memory of pid {pid}: {e}"))
    };
    let parent = read(pool.pid())?;
    let each = children
        .iter()
        .map(|&pid| read(pid))
        .collect::<Result<Vec<_>, _>>()?;
    pool.stop(POOL_STOP)?;
    let row = MemoryRow {
        preload_mib,
        children: each.len(),
        child_mean: Memory::mean(&each),
        parent,
    };
    progress(&format!(
        "  per child: USS {} KiB, PSS {} KiB, RSS {} KiB",
        row.child_mean.uss_kib, row.child_mean.pss_kib, row.child_mean.rss_kib
    ));
    Ok(row)
}
