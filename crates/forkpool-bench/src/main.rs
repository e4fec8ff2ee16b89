//! `forkpool-bench`: forkpool's benchmarks, kept out of the shipped
//! `forkpool` command.
//!
//! Purpose: measure the pool's dispatch modes side by side and against
//! other servers (throughput, wake-ups including the thundering `herd`,
//! scale-up, memory per child with a preloaded table, many sessions), in
//! one invocation whose options are those `forkpool bench` had. To do so
//! it runs its own servers as children of itself: `forkpool-bench demo`
//! (the `forkpool demo` server plus `--preload-mib`) and the session
//! benchmark's baselines. `docs/benchmarks.md` tells how to read it.
//!
//! Not a goal: being installed for operators (`publish = false`), or any
//! feature the `forkpool` command needs.
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod bench;
mod bench_milter;
mod bench_sessions;
mod chaos;
mod sys;

use clap::{Parser, Subcommand};

/// Measure forkpool's dispatch modes side by side, and against other
/// servers (see docs/benchmarks.md).
#[derive(Debug, Parser)]
#[command(
    name = "forkpool-bench",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(flatten)]
    bench: bench::BenchArgs,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The demo pool the benchmarks and the fault-injection tests use:
    /// `forkpool demo` with `--preload-mib` and `--chaos`.
    #[command(hide = true)]
    Demo(Box<PreloadedDemoArgs>),
    /// Many mostly idle sessions against forkpool --sessions, a session
    /// pool and a thread-per-session baseline, on its own.
    #[command(hide = true)]
    BenchSessions(bench_sessions::SessionBenchArgs),
    /// Many milter conversations against a mail filter: threads, memory,
    /// latency and CPU per message (bench/milter.sh).
    #[command(hide = true)]
    BenchMilter(bench_milter::MilterBenchArgs),
}

/// Options of `forkpool-bench demo`.
#[derive(Debug, clap::Args)]
struct PreloadedDemoArgs {
    #[command(flatten)]
    demo: forkpool_cli::demo::DemoArgs,
    /// Allocate and touch this many MiB in the supervisor before forking,
    /// to show copy-on-write sharing.
    #[arg(long, value_name = "MIB", default_value_t = 0)]
    preload_mib: usize,
    /// Honour `?chaos=garbage|flood|exit|panic` (fault-injection tests).
    #[arg(long, conflicts_with = "sessions")]
    chaos: bool,
}

fn main() {
    forkpool_cli::init_logging();
    let cli = Cli::parse();
    let result = match cli.command {
        None => bench::run(&cli.bench),
        Some(Command::Demo(args)) => {
            let PreloadedDemoArgs {
                demo,
                preload_mib,
                chaos,
            } = *args;
            forkpool_cli::demo::run_with(demo, preload(preload_mib), chaos.then(chaos::hooks))
        }
        Some(Command::BenchSessions(args)) => bench_sessions::command(args),
        Some(Command::BenchMilter(args)) => bench_milter::command(args),
    };
    if let Err(e) = result {
        eprintln!("forkpool-bench: {e}");
        std::process::exit(1);
    }
}

/// A table the size asked for, every page written so it is really resident.
fn preload(mib: usize) -> Vec<u8> {
    let mut table = vec![0u8; mib * 1024 * 1024];
    for (i, page) in table.chunks_mut(4096).enumerate() {
        page[0] = (i % 251) as u8 + 1;
    }
    table
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        super::Cli::command().debug_assert();
    }
}
