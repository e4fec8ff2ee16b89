//! The pool options shared by every subcommand that runs a pool.

use std::time::Duration;

use clap::Args;
use forkpool::config::parse_duration;
use forkpool::{DispatchMode, PoolConfig};

/// Pool sizing, liveness and shutdown options. Unset options keep
/// [`PoolConfig::default`]'s values.
#[derive(Debug, Clone, Default, Args)]
pub struct PoolArgs {
    /// How connections reach children: handoff, order, shared or kernel (the
    /// kernel picks the lowest idle child: Linux 5.12+ and CAP_BPF, else
    /// handoff); `forkpool run` also takes none (unmodified
    /// socket-activated programs).
    #[arg(long, value_name = "MODE")]
    pub dispatch: Option<DispatchMode>,
    /// Never fewer children than this [default: 2].
    #[arg(long, value_name = "N")]
    pub min_children: Option<u32>,
    /// Never more children than this [default: 64].
    #[arg(long, value_name = "N")]
    pub max_children: Option<u32>,
    /// Spawn while fewer children than this are idle [default: 2].
    #[arg(long, value_name = "N")]
    pub min_spare: Option<u32>,
    /// Retire while more children than this are idle [default: 8].
    #[arg(long, value_name = "N")]
    pub max_spare: Option<u32>,
    /// Replace a child after this many connections; 0 = never [default: 0].
    #[arg(long, value_name = "N")]
    pub max_requests_per_child: Option<u64>,
    /// Ping idle children this often [default: 5s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub ping_interval: Option<Duration>,
    /// Kill a child that does not answer a ping (or, with --dispatch order,
    /// an accept order) within this [default: 5s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub ping_timeout: Option<Duration>,
    /// Kill a new child (or --preload template) that has not said Ready
    /// within this; raise it for an app whose start-up is slow [default: 60s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub start_timeout: Option<Duration>,
    /// Kill a child still running this long after it closed its back-channel
    /// (or a template after it was told to quit), counted as exit_timeout;
    /// a large heap takes seconds to tear down [default: 10s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub exit_timeout: Option<Duration>,
    /// On shutdown, give busy children this long [default: 30s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub shutdown_timeout: Option<Duration>,
    /// Kill a child busy on one connection longer than this; 0 = never [default: 0].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub busy_timeout: Option<Duration>,
    /// Surplus idle children must last this long before retiring [default: 1s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub retire_grace: Option<Duration>,
    /// The listen backlog [default: 1024].
    #[arg(long, value_name = "N")]
    pub backlog: Option<u32>,
    /// TCP_DEFER_ACCEPT: hand a connection over only once the client has
    /// sent something (or after this many seconds); only for protocols
    /// where the client speaks first; 0 = off [default: 0].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub defer_accept: Option<Duration>,
    /// Add a random 0..=N to each child's max-requests-per-child, so
    /// children do not all restart together [default: 0].
    #[arg(long, value_name = "N")]
    pub max_requests_jitter: Option<u64>,
    /// Replace a child after its connection once its unshared memory (USS)
    /// is above SIZE, like 512MiB; 0 = no limit [default: 0].
    #[arg(long, value_name = "SIZE", value_parser = forkpool::config::parse_size)]
    pub max_child_memory: Option<u64>,
    /// Replace a child after its connection once it is older than this;
    /// 0 = no limit [default: 0].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub max_child_lifetime: Option<Duration>,
    /// Capture and log a child busy on one connection longer than this
    /// (its stack, where it waits); 0 = off [default: 0].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub slow_threshold: Option<Duration>,
    /// On TERM/INT or a USR2 hand-over, report drain on --agent and 503 on
    /// /ready for this long while still serving, then stop; needs --agent
    /// or --metrics; 0 = off [default: 0].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub drain_delay: Option<Duration>,
    /// /ready answers 503 while every child the pool may have is busy.
    #[arg(long)]
    pub ready_unless_saturated: bool,
    /// Hold the pool while its busy children already wait for the CPUs
    /// and keep finishing connections: connections wait in the backlog for
    /// the next child to finish instead [default: on].
    #[arg(long, overrides_with = "no_hold_when_cpu_bound")]
    pub hold_when_cpu_bound: bool,
    /// Grow the pool whenever it is short of spare children, however much
    /// its busy children wait for the CPUs.
    #[arg(long, overrides_with = "hold_when_cpu_bound")]
    pub no_hold_when_cpu_bound: bool,
    /// On TERM/INT, close the listeners at once instead of first serving
    /// the connections already queued on them.
    #[arg(long)]
    pub no_serve_backlog_on_stop: bool,
    /// Let the kernel merge the children's identical pages (KSM): needs
    /// Linux 6.7+ and /sys/kernel/mm/ksm/run = 1.
    #[arg(long)]
    pub merge_pages: bool,
    /// `forkpool run`: start CMD once as a template and fork every worker
    /// from it, so what it loads before serving is shared copy-on-write.
    #[arg(long)]
    pub preload: bool,
    /// With --preload: once the lowest slot has served N connections, it
    /// becomes the template and the pool rolls onto workers forked from
    /// it; a list like 1000,10000 reforks at each [default: never].
    #[arg(long, value_name = "N[,N...]", value_delimiter = ',')]
    pub refork_after: Vec<u64>,
}

impl PoolArgs {
    /// Applies the options that were given on top of `config`.
    pub fn apply(&self, mut config: PoolConfig) -> PoolConfig {
        macro_rules! set {
            ($($field:ident),*) => {$(
                if let Some(value) = self.$field {
                    config.$field = value;
                }
            )*};
        }
        set!(
            dispatch,
            min_children,
            max_children,
            min_spare,
            max_spare,
            max_requests_per_child,
            ping_interval,
            ping_timeout,
            start_timeout,
            exit_timeout,
            shutdown_timeout,
            busy_timeout,
            retire_grace,
            backlog,
            defer_accept,
            max_requests_jitter,
            max_child_memory,
            max_child_lifetime,
            slow_threshold,
            drain_delay
        );
        if self.ready_unless_saturated {
            config.ready_unless_saturated = true;
        }
        if self.hold_when_cpu_bound {
            config.hold_when_cpu_bound = true;
        }
        if self.no_hold_when_cpu_bound {
            config.hold_when_cpu_bound = false;
        }
        if self.no_serve_backlog_on_stop {
            config.serve_backlog_on_stop = false;
        }
        if self.merge_pages {
            config.merge_pages = true;
        }
        if self.preload {
            config.preload = true;
        }
        if !self.refork_after.is_empty() {
            config.refork_after = self.refork_after.clone();
        }
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        pool: PoolArgs,
    }

    /// The config `args` make of `base`.
    fn applied(args: &[&str], base: PoolConfig) -> PoolConfig {
        let argv = std::iter::once("forkpool").chain(args.iter().copied());
        Cli::try_parse_from(argv).unwrap().pool.apply(base)
    }

    #[test]
    fn deadline_flags_set_their_fields_and_leave_the_others() {
        let c = applied(
            &["--exit-timeout", "250ms", "--start-timeout", "2m"],
            PoolConfig::default(),
        );
        assert_eq!(c.exit_timeout, Duration::from_millis(250));
        assert_eq!(c.start_timeout, Duration::from_secs(120));
        assert_eq!(c.ping_timeout, PoolConfig::default().ping_timeout);
        // Without the flags, a config file's values stand.
        let file = PoolConfig {
            exit_timeout: Duration::from_secs(20),
            start_timeout: Duration::from_secs(90),
            ..PoolConfig::default()
        };
        let c = applied(&[], file.clone());
        assert_eq!(
            (c.exit_timeout, c.start_timeout),
            (file.exit_timeout, file.start_timeout)
        );
    }

    #[test]
    fn the_cpu_hold_is_on_unless_turned_off_and_the_last_flag_wins() {
        let off = PoolConfig {
            hold_when_cpu_bound: false,
            ..PoolConfig::default()
        };
        assert!(applied(&[], PoolConfig::default()).hold_when_cpu_bound);
        // A config file's `false` stands unless a flag says otherwise.
        assert!(!applied(&[], off.clone()).hold_when_cpu_bound);
        assert!(applied(&["--hold-when-cpu-bound"], off.clone()).hold_when_cpu_bound);
        assert!(!applied(&["--no-hold-when-cpu-bound"], PoolConfig::default()).hold_when_cpu_bound);
        assert!(
            applied(
                &["--no-hold-when-cpu-bound", "--hold-when-cpu-bound"],
                off.clone()
            )
            .hold_when_cpu_bound
        );
        assert!(
            !applied(
                &["--hold-when-cpu-bound", "--no-hold-when-cpu-bound"],
                PoolConfig::default()
            )
            .hold_when_cpu_bound
        );
    }
}
