//! `forkpool demo`: a preforked pool serving the built-in HTTP handler.

pub mod chaos;
pub mod http;

use clap::Args;

use crate::settings::ServeArgs;

/// Options of `forkpool demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Allocate and touch this many MiB in the supervisor before forking,
    /// to show copy-on-write sharing (benchmarks).
    #[arg(long, value_name = "MIB", default_value_t = 0)]
    pub preload_mib: usize,
    /// Honour `?chaos=garbage|flood|exit|panic` (fault-injection tests only).
    #[arg(long)]
    pub chaos: bool,
    /// Requests served on one kept-alive connection before closing it, so
    /// that clients beyond the pool's size get a turn.
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub keepalive_requests: u32,
}

/// Runs the demo pool until it is stopped.
pub fn run(args: DemoArgs) -> Result<(), String> {
    let settings = args.serve.resolve()?;
    let pool = crate::serve::prepare(&args.serve, &settings)?;
    // Accepted connections inherit the listener's read timeout: the
    // keep-alive limit costs no system call per connection.
    for listener in pool.listeners() {
        listener
            .set_read_timeout(http::KEEPALIVE_TIMEOUT)
            .map_err(|e| {
                format!(
                    "cannot set a read timeout on {}: {e}",
                    listener.local_addr()
                )
            })?;
    }

    let table = preload(args.preload_mib);
    let options = http::DemoOptions {
        chaos: args.chaos,
        keepalive_requests: args.keepalive_requests,
    };
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
