//! The `forkpool` command, as a library: each subcommand's options and its
//! `run`, so that `src/main.rs` stays a thin dispatcher and the benchmark
//! crate (`forkpool-bench`) can start the very same demo server.
//!
//! Purpose: the command line over the `forkpool` library (settings from
//! flags and a config file, the demo handlers, `status`, `check`, `run`).
//! Not a goal: an API for applications (use the `forkpool` crate), nor any
//! benchmark or fault-injection tooling beyond what the CLI tests need.
#![deny(missing_docs)]
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod check;
pub mod demo;
pub mod milter;
pub mod pool_args;
pub mod run;
pub mod serve;
pub mod settings;
pub mod status;
pub mod top;

use std::io::IsTerminal;

/// Sends logs to stderr, colored only on a terminal; `FORKPOOL_LOG` (or
/// `RUST_LOG`) sets the filter, `info` by default.
pub fn init_logging() {
    let filter = std::env::var("FORKPOOL_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info".to_string());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
}
