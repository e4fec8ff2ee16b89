//! Serves the demo line protocol (`forkpool_cli::demo::line`) with a
//! session pool: many connections, a few worker threads.
//!
//! ```text
//! cargo run -p forkpool-cli --example line_sessions -- [ADDR] [WORKERS] [MAX_SESSIONS]
//! printf 'NOOP\r\nWORK 200\r\nQUIT\r\n' | nc 127.0.0.1 2525
//! ```
//!
//! Press Enter (or close stdin) to shut down gracefully. `RUST_LOG=debug`
//! shows every session opening and closing.
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::net::TcpListener;
use std::time::Duration;

use forkpool_cli::demo::line::LineSession;
use forkpool_sessions::{CapPolicy, LoadHook, SessionConfig, SessionPool};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();

    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:2525".to_string());
    let workers = args.next().map(|n| n.parse()).transpose()?.unwrap_or(4);
    let max_sessions = args.next().map(|n| n.parse()).transpose()?.unwrap_or(1000);

    let config = SessionConfig {
        workers,
        max_sessions,
        cap_policy: CapPolicy::Refuse,
        idle_timeout: Some(Duration::from_secs(60)),
        name: "demo".to_string(),
        on_load: Some(LoadHook::new(|open| tracing::debug!(open, "load changed"))),
    };
    let pool = SessionPool::<LineSession>::start(config, ())?;
    let listener = TcpListener::bind(&addr)?;
    println!(
        "line protocol on {} ({workers} workers, at most {max_sessions} sessions); Enter stops",
        listener.local_addr()?
    );
    pool.serve(listener)?;

    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    println!("shutting down with {} open sessions", pool.open_sessions());
    pool.shutdown();
    Ok(())
}
