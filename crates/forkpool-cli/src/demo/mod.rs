//! `forkpool demo`: a preforked pool serving the built-in HTTP handler, or
//! with `--sessions` a line protocol with many sessions per child.

pub mod http;
pub mod line;
pub mod request;
pub mod sessions;

use clap::Args;

use crate::settings::ServeArgs;

/// Options of `forkpool demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Where to listen and how to run the pool.
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Requests served on one kept-alive connection before closing it, so
    /// that clients beyond the pool's size get a turn.
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub keepalive_requests: u32,
    /// Serve the demo line protocol (NOOP, WORK <ms>, QUIT) with many
    /// sessions per child instead of HTTP one connection at a time.
    // The doc comment is the --help text: `<ms>` is not HTML there.
    #[allow(rustdoc::invalid_html_tags)]
    #[arg(long)]
    pub sessions: bool,
    /// Worker threads in each child's session pool (with --sessions) [default: 4].
    #[arg(long, value_name = "N", requires = "sessions")]
    pub session_workers: Option<usize>,
    /// The most sessions one child holds (with --sessions) [default: 256].
    #[arg(long, value_name = "N", requires = "sessions")]
    pub sessions_per_child: Option<usize>,
}

/// `defer_accept` for the HTTP demo unless a flag or the file sets it: an
/// HTTP client speaks first, so the kernel hands over a connection only
/// once its request has arrived (Apache's `AcceptFilter http data` and
/// nginx's `listen ... deferred` do the same), and a client that connects
/// and says nothing never occupies a child.
pub const DEFAULT_DEFER_ACCEPT: std::time::Duration = std::time::Duration::from_secs(5);

/// Worker threads per child with `--sessions`, unless told otherwise.
pub const DEFAULT_SESSION_WORKERS: usize = 4;
/// Sessions per child with `--sessions`, unless told otherwise.
pub const DEFAULT_SESSIONS_PER_CHILD: usize = 256;

/// Runs the demo pool until it is stopped.
pub fn run(args: DemoArgs) -> Result<(), String> {
    run_with(args, Vec::new(), None)
}

/// Runs the demo pool until it is stopped, every child holding `table`,
/// built in the supervisor before the first fork and so shared
/// copy-on-write (`forkpool-bench demo --preload-mib` measures that), and
/// the HTTP demo honouring `?chaos=` with `chaos` (`forkpool-bench demo
/// --chaos`, for fault-injection tests).
pub fn run_with(
    mut args: DemoArgs,
    table: Vec<u8>,
    chaos: Option<http::ChaosHooks>,
) -> Result<(), String> {
    if !args.sessions {
        args.serve.default_defer_accept = DEFAULT_DEFER_ACCEPT;
    }
    let settings = args.serve.resolve()?;
    let session_options = sessions::SessionOptions {
        workers: args.session_workers.unwrap_or(DEFAULT_SESSION_WORKERS),
        per_child: args
            .sessions_per_child
            .unwrap_or(DEFAULT_SESSIONS_PER_CHILD),
    };
    if args.sessions {
        settings
            .pool
            .validate_for_sessions()
            .and_then(|()| session_options.config().validate())
            .map_err(|e| format!("invalid configuration: {e}"))?;
    }
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

    let totals = if args.sessions {
        sessions::run(pool, &session_options, table)
    } else {
        let options = http::DemoOptions {
            chaos,
            keepalive_requests: args.keepalive_requests,
        };
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
