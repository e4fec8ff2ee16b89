//! The `forkpool` command: run preforked pools, the demo server, benchmarks.

mod bench;
mod bench_sessions;
mod check;
mod demo;
mod pool_args;
mod run;
mod serve;
mod settings;
mod status;
mod top;

use std::io::IsTerminal;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// Preforked server pools: adaptive size, directed dispatch, no thundering herd.
#[derive(Debug, Parser)]
#[command(name = "forkpool", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a pool serving the built-in demo HTTP handler
    /// (`GET /?work_ms=N&cpu_ms=N` answers `hello`), or with `--sessions`
    /// a line protocol with many sessions per child.
    Demo(demo::DemoArgs),
    /// Print a running pool's scoreboard and totals.
    Status(status::StatusArgs),
    /// A live view of a running pool: children, CPU, memory, busy time,
    /// request rate, listen queue (plain text when not on a terminal).
    Top(top::TopArgs),
    /// Validate settings (a --config file and flags) without starting.
    Check(check::CheckArgs),
    /// Measure the pool's dispatch modes side by side, and against other
    /// servers (see docs/benchmarks.md).
    Bench(bench::BenchArgs),
    /// Run a pool of another program: for each slot, fork and exec
    /// `CMD [ARGS...]` (given after `--`) with the listeners passed the
    /// systemd way and the back-channel announced in FORKPOOL_CHANNEL_FD.
    Run(run::RunArgs),
    /// Many mostly idle sessions against forkpool --sessions, a session
    /// pool and a thread-per-session baseline (temporary home until
    /// `forkpool bench` runs it).
    #[command(hide = true)]
    BenchSessions(bench_sessions::SessionBenchArgs),
}

fn main() {
    init_logging();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Status(args) => status::run(args),
        Command::Top(args) => top::run(args),
        Command::Check(args) => check::run(args),
        Command::Bench(args) => bench::run(&args),
        Command::Run(args) => run::run(args),
        Command::BenchSessions(args) => bench_sessions::command(args),
    };
    if let Err(e) = result {
        eprintln!("forkpool: {e}");
        std::process::exit(1);
    }
}

/// Logs go to stderr; `FORKPOOL_LOG` (or `RUST_LOG`) sets the filter,
/// `info` by default.
fn init_logging() {
    let filter = std::env::var("FORKPOOL_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info".to_string());
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
}
