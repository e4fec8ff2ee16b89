//! `forkpool run`: a preforked pool of another program's processes.
//!
//! The supervisor binds the listeners and, for each slot, forks and execs
//! the command. Workers written against the back-channel protocol (the
//! Rust, Python and Perl helpers, or anything following
//! `docs/protocol.md`) get the adaptive pool and directed dispatch; with
//! `--dispatch none` any program that understands systemd socket
//! activation runs unmodified in a fixed-size pool. Everything else (the
//! config file, control socket, metrics, user, reload and upgrade) is as
//! for `forkpool demo`.

use std::ffi::OsString;

use clap::Args;
use forkpool::WorkerCommand;

use crate::settings::ServeArgs;

/// Options of `forkpool run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Where to listen and how to run the pool.
    #[command(flatten)]
    pub serve: ServeArgs,
    /// The worker program and its arguments, after `--`; without them, the
    /// config file's `command = ["program", "arg", ...]`. Workers find the
    /// listeners at fd 3 onwards, in the order of --listen.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// Runs the pool until it is stopped.
pub fn run(args: RunArgs) -> Result<(), String> {
    let settings = args.serve.resolve()?;
    let words: Vec<OsString> = if args.command.is_empty() {
        settings
            .command
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(OsString::from)
            .collect()
    } else {
        args.command
    };
    let mut words = words.into_iter();
    let program = words.next().ok_or(
        "no command to run: put it after `--` (forkpool run [OPTIONS] -- CMD [ARGS...]) \
         or set `command` in the config file",
    )?;
    let command = WorkerCommand::new(program).args(words);
    let pool = crate::serve::prepare(&args.serve, &settings)?;
    tracing::info!(dispatch = %pool.config().dispatch, "running `{command}` in every slot");
    let totals = pool.run_command(&command).map_err(|e| e.to_string())?;
    let json = serde_json::to_string(&totals).map_err(|e| e.to_string())?;
    println!("forkpool: totals {json}");
    Ok(())
}
