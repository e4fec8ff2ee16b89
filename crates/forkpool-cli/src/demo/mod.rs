//! `forkpool demo`: a preforked pool serving the built-in HTTP handler.

pub mod chaos;
pub mod http;

use std::io::Write;

use clap::Args;
use forkpool::{ListenAddr, Pool, PoolConfig};

use crate::pool_args::PoolArgs;

/// Options of `forkpool demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Address to listen on (HOST:PORT, [IPv6]:PORT or unix:PATH); repeatable.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub listen: Vec<ListenAddr>,
    #[command(flatten)]
    pub pool: PoolArgs,
    /// Allocate and touch this many MiB in the supervisor before forking,
    /// to show copy-on-write sharing (benchmarks).
    #[arg(long, value_name = "MIB", default_value_t = 0)]
    pub preload_mib: usize,
    /// Honour `?chaos=garbage|exit|panic` (fault-injection tests only).
    #[arg(long)]
    pub chaos: bool,
}

/// Runs the demo pool until it is stopped.
pub fn run(args: DemoArgs) -> Result<(), String> {
    let config = args.pool.apply(PoolConfig::default());
    config
        .validate()
        .map_err(|e| format!("invalid configuration: {e}"))?;
    let mut pool = Pool::new(config);
    let mut out = std::io::stdout().lock();
    for addr in &args.listen {
        let bound = pool.listen(addr).map_err(|e| e.to_string())?;
        writeln!(out, "forkpool: listening on {bound}").map_err(|e| e.to_string())?;
    }
    out.flush().map_err(|e| e.to_string())?;
    drop(out);

    let table = preload(args.preload_mib);
    let options = http::DemoOptions { chaos: args.chaos };
    let totals = pool
        .run(move |conn: forkpool::Connection<'_>| {
            std::hint::black_box(&table);
            http::serve(conn, &options);
        })
        .map_err(|e| e.to_string())?;
    let json = serde_json::to_string(&totals).map_err(|e| e.to_string())?;
    println!("forkpool: totals {json}");
    Ok(())
}

/// A table the size asked for, every page written so it is really resident.
fn preload(mib: usize) -> Vec<u8> {
    let mut table = vec![0u8; mib * 1024 * 1024];
    for (i, page) in table.chunks_mut(4096).enumerate() {
        page[0] = (i % 251) as u8 + 1;
    }
    table
}
