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
    /// Honour `?chaos=garbage|exit|panic` (fault-injection tests only).
    #[arg(long)]
    pub chaos: bool,
}

/// Runs the demo pool until it is stopped.
pub fn run(args: DemoArgs) -> Result<(), String> {
    let settings = args.serve.resolve()?;
    let pool = crate::serve::prepare(&args.serve, &settings)?;

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
