//! The `forkpool` command.

mod bench;

// --- Temporary wiring of `forkpool bench` (branch `bench`) -----------------
// Only so the benchmark can be run and tested before the real command line
// lands on main; replace this block with main's subcommand enum, which calls
// `bench::run(&args)` for `Bench(bench::BenchArgs)`.
use clap::Parser;

#[derive(Parser)]
#[command(name = "forkpool", version)]
enum Command {
    /// Measure forkpool's dispatch modes and compare with other servers.
    Bench(bench::BenchArgs),
}

fn main() {
    let Command::Bench(args) = Command::parse();
    if let Err(e) = bench::run(&args) {
        eprintln!("forkpool bench: {e}");
        std::process::exit(1);
    }
}
// --- End of temporary wiring ------------------------------------------------
