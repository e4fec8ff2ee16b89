//! `forkpool check --config FILE`: validates settings without starting.

use clap::Args;

use crate::settings::ServeArgs;

/// Options of `forkpool check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Where to listen and how to run the pool.
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// Resolves and validates; prints a summary on success.
pub fn run(args: CheckArgs) -> Result<(), String> {
    let settings = args.serve.resolve()?;
    let where_from = args
        .serve
        .config
        .as_ref()
        .map_or("command line".to_string(), |p| p.display().to_string());
    let listen: Vec<String> = settings
        .listen
        .iter()
        .map(|l| {
            if l.name.is_empty() {
                l.addr.to_string()
            } else {
                format!("{}={}", l.name, l.addr)
            }
        })
        .collect();
    let p = &settings.pool;
    println!(
        "{where_from}: ok\n  listen {}\n  dispatch {}, children {}..{}, spare {}..{}, \
         max requests per child {}, busy timeout {}\n  control {}",
        listen.join(", "),
        p.dispatch,
        p.min_children,
        p.max_children,
        p.min_spare,
        p.max_spare,
        p.max_requests_per_child,
        humantime::format_duration(p.busy_timeout),
        settings.control.0.display(),
    );
    Ok(())
}
