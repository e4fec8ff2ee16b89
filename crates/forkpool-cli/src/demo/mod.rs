//! `forkpool demo`: a preforked pool serving the built-in HTTP handler, or
//! with `--sessions` a line protocol with many sessions per child.

pub mod chaos;
pub mod http;
pub mod sessions;

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
    #[arg(long, conflicts_with = "sessions")]
    pub chaos: bool,
    /// Serve the demo line protocol (NOOP, WORK <ms>, QUIT) with many
    /// sessions per child instead of HTTP one connection at a time.
    #[arg(long)]
    pub sessions: bool,
    /// Worker threads in each child's session pool (with --sessions) [default: 4].
    #[arg(long, value_name = "N", requires = "sessions")]
    pub session_workers: Option<usize>,
    /// The most sessions one child holds (with --sessions) [default: 256].
    #[arg(long, value_name = "N", requires = "sessions")]
    pub sessions_per_child: Option<usize>,
}

/// Worker threads per child with `--sessions`, unless told otherwise.
pub const DEFAULT_SESSION_WORKERS: usize = 4;
/// Sessions per child with `--sessions`, unless told otherwise.
pub const DEFAULT_SESSIONS_PER_CHILD: usize = 256;

/// Runs the demo pool until it is stopped.
pub fn run(args: DemoArgs) -> Result<(), String> {
    let config = args.pool.apply(PoolConfig::default());
    let session_options = sessions::SessionOptions {
        workers: args.session_workers.unwrap_or(DEFAULT_SESSION_WORKERS),
        per_child: args
            .sessions_per_child
            .unwrap_or(DEFAULT_SESSIONS_PER_CHILD),
    };
    let valid = if args.sessions {
        config
            .validate_for_sessions()
            .and_then(|()| session_options.config().validate())
    } else {
        config.validate()
    };
    valid.map_err(|e| format!("invalid configuration: {e}"))?;
    let mut pool = Pool::new(config);
    let mut out = std::io::stdout().lock();
    for addr in &args.listen {
        let bound = pool.listen(addr).map_err(|e| e.to_string())?;
        writeln!(out, "forkpool: listening on {bound}").map_err(|e| e.to_string())?;
    }
    out.flush().map_err(|e| e.to_string())?;
    drop(out);

    let table = preload(args.preload_mib);
    let totals = if args.sessions {
        sessions::run(pool, &session_options, table)
    } else {
        let options = http::DemoOptions { chaos: args.chaos };
        pool.run(move |conn: forkpool::Connection<'_>| {
            std::hint::black_box(&table);
            http::serve(conn, &options);
        })
    }
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
