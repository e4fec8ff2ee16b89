//! The `forkpool` command: run preforked pools, the demo server, a running
//! pool's status. Benchmarks are a separate binary, `forkpool-bench`.
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

use forkpool_cli::{check, demo, milter, run, status, top};

use clap::{Parser, Subcommand};

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
    /// Run a pool of another program: for each slot, fork and exec
    /// `CMD [ARGS...]` (given after `--`) with the listeners passed the
    /// systemd way and the back-channel announced in FORKPOOL_CHANNEL_FD.
    Run(run::RunArgs),
    /// Run a mail filter (milter) for Postfix or Sendmail, driven by a
    /// rule file given after `--` (`--example` prints one).
    Milter(milter::MilterArgs),
}

fn main() {
    forkpool_cli::init_logging();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Status(args) => status::run(args),
        Command::Top(args) => top::run(args),
        Command::Check(args) => check::run(args),
        Command::Run(args) => run::run(args),
        Command::Milter(args) => milter::run(args),
    };
    if let Err(e) = result {
        eprintln!("forkpool: {e}");
        std::process::exit(1);
    }
}
