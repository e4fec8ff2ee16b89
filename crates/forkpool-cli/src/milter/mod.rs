//! `forkpool milter`: a mail filter driven by a rule file, served by
//! preforked children that each hold many MTA conversations on a session
//! pool (`docs/milter.md`).
//!
//! The rule file is read and checked before anything starts, so a bad one
//! is refused with its problem and fix. Each child reads it again when it
//! starts: after `kill -HUP`, the children that replace the old ones
//! filter with the file as it is then (one that no longer parses is
//! logged, and the child keeps the rules the supervisor started with).

pub mod bench;
pub mod filter;
pub mod rules;
pub mod spamd;

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use clap::Args;
use forkpool::config::parse_duration;
use forkpool::sessions::SessionConfig;
use forkpool::WorkerInfo;
use forkpool_milter::{MilterContext, MilterSession};

use crate::settings::ServeArgs;
use filter::{RuleFilter, Shared};
use rules::Rules;

/// How long a conversation may wait for the MTA's next command: libmilter's
/// default (`smfi_settimeout`, 7210 s), above every MTA's own timeouts
/// (Postfix waits at most `smtpd_timeout`, 300 s, for its client between
/// commands; Sendmail up to an hour), so only a dead MTA reaches it.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(7210);
/// How long one filter step may run before its conversation is tempfailed
/// and closed: Postfix's `milter_command_timeout`. The hook's thread runs
/// on (it cannot be stopped) but the MTA is answered at once.
pub const DEFAULT_STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// Worker threads per child unless told otherwise.
pub const DEFAULT_WORKERS: usize = 4;
/// Conversations per child unless told otherwise.
pub const DEFAULT_PER_CHILD: usize = 1024;

/// Options of `forkpool milter`.
#[derive(Debug, Args)]
pub struct MilterArgs {
    /// Where to listen and how to run the pool.
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Print an example rule file and exit.
    #[arg(long)]
    pub example: bool,
    /// Worker threads in each child's session pool [default: 4].
    #[arg(long, value_name = "N")]
    pub session_workers: Option<usize>,
    /// The most conversations one child holds [default: 1024].
    #[arg(long, value_name = "N")]
    pub sessions_per_child: Option<usize>,
    /// Close a conversation whose MTA has sent nothing for this long
    /// [default: 7210s, as libmilter].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub idle_timeout: Option<Duration>,
    /// Tempfail and close a conversation whose filter step (a spamd call,
    /// say) runs longer than this; 0 = never [default: 30s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub step_timeout: Option<Duration>,
    /// The rule file, after `--`.
    #[arg(last = true, value_name = "RULES.toml")]
    pub rules: Vec<PathBuf>,
}

/// Runs the filter until it is stopped.
pub fn run(args: MilterArgs) -> Result<(), String> {
    if args.example {
        print!("{}", rules::EXAMPLE);
        return Ok(());
    }
    let path = match args.rules.as_slice() {
        [path] => path.clone(),
        [] => {
            return Err("no rule file: forkpool milter [OPTIONS] -- RULES.toml \
                        (`forkpool milter --example > rules.toml` writes one to start from)"
                .to_string())
        }
        _ => return Err("give one rule file after `--`".to_string()),
    };
    let rules = Rules::load(&path)?;
    let settings = args.serve.resolve()?;
    let sessions = SessionConfig {
        workers: args.session_workers.unwrap_or(DEFAULT_WORKERS),
        max_sessions: args.sessions_per_child.unwrap_or(DEFAULT_PER_CHILD),
        idle_timeout: Some(args.idle_timeout.unwrap_or(DEFAULT_IDLE_TIMEOUT)),
        name: "milter".to_string(),
        ..SessionConfig::default()
    };
    settings
        .pool
        .validate_for_sessions()
        .and_then(|()| sessions.validate())
        .map_err(|e| format!("invalid configuration: {e}"))?;
    let step_timeout = args.step_timeout.unwrap_or(DEFAULT_STEP_TIMEOUT);
    let pool = crate::serve::prepare(&args.serve, &settings)?;
    tracing::info!(rules = %path.display(), "milter filtering with {} rules", rules.rules.len());
    let totals = pool
        .run_sessions::<MilterSession<RuleFilter>, _>(sessions, move |child: &WorkerInfo| {
            let rules = Rules::load(&path).unwrap_or_else(|e| {
                tracing::warn!("{e}; this child keeps the rules read at start");
                rules
            });
            let shared = Shared {
                rules,
                slot: child.slot,
                pid: child.pid,
                messages: AtomicU64::new(0),
            };
            if step_timeout.is_zero() {
                return MilterContext::new(shared);
            }
            // The shared value moves in only once the thread exists.
            match forkpool_milter::Watchdog::start(step_timeout) {
                Ok(watchdog) => MilterContext {
                    watchdog: Some(watchdog),
                    ..MilterContext::new(shared)
                },
                Err(e) => {
                    tracing::warn!("no step deadline in this child: {e}");
                    MilterContext::new(shared)
                }
            }
        })
        .map_err(|e| e.to_string())?;
    let json = serde_json::to_string(&totals).map_err(|e| e.to_string())?;
    println!("forkpool: totals {json}");
    Ok(())
}
