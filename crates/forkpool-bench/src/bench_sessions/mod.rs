//! The many-sessions benchmark: thousands of long, mostly idle sessions
//! (each sends a command about once a second) plus a few busy ones,
//! against three servers of the same line protocol:
//! - `threads`, the baseline: one thread per session, built here;
//! - `pool`: one process, a session pool with a few worker threads;
//! - `forkpool`: `forkpool demo --sessions`, preforked children that each
//!   hold many sessions, connections handed to the lowest child with room.
//!
//! For each it reports the threads and memory of the server's process tree
//! with every session open, the latency of a command (p50, p99, max) under
//! the load, and the CPU the server used while every session sat idle.
//! The numbers come from `/proc`; all traffic is on loopback.
//!
//! A shared machine's noise comes in bursts that can spoil one server's
//! 10 seconds and spare the next one's, so the servers can be measured in
//! several rounds (`--rounds`), taking turns, each round starting with the
//! next server; a row gives the median over its rounds (idle CPU: the most
//! any round saw) and lists every round's p99.
//!
//! [`run`] is the benchmark as a function (rows out), for `forkpool-bench`
//! to call; [`command`] is the hidden `forkpool-bench bench-sessions` that runs
//! it on its own, and also runs the `threads` and `pool` servers for it.
//! The benchmark process holds one socket per session, so it raises its
//! `RLIMIT_NOFILE` soft limit (up to the hard limit) before it connects;
//! the servers inherit the raised limit.

pub mod client;
pub(crate) mod procfs;
pub mod servers;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use forkpool::config::parse_duration;
use nix::sys::resource::{getrlimit, setrlimit, Resource};
use serde::Serialize;

use client::{Clients, LoadSpec};
use servers::{ServerKind, ServerProcess, ServerSetup};

/// Options of `forkpool-bench bench-sessions`.
#[derive(Debug, Clone, clap::Args)]
pub struct SessionBenchArgs {
    /// Sessions to open against each server.
    #[arg(long, default_value_t = 2000)]
    pub sessions: usize,
    /// Of those, how many are busy.
    #[arg(long, default_value_t = 8)]
    pub busy: usize,
    /// An idle session sends a command about this often.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub interval: Duration,
    /// A busy session sends its next command this long after an answer.
    #[arg(long, default_value = "10ms", value_parser = parse_duration)]
    pub busy_interval: Duration,
    /// How long the load is measured.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// How long every session sits idle while the server's CPU is measured.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub idle: Duration,
    /// Measure every server this many times, taking turns; rows give the
    /// median of the rounds.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,
    /// Worker threads of the session pools (per child for forkpool).
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Sessions per forkpool child.
    #[arg(long, default_value_t = 1024)]
    pub sessions_per_child: usize,
    /// Servers to measure, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "threads,pool,forkpool"
    )]
    pub servers: Vec<ServerKind>,
    /// Print the rows as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Be one of the servers instead (the benchmark starts them this way).
    #[arg(long, value_enum, value_name = "KIND")]
    pub serve: Option<ServerKind>,
    /// Where a server started with --serve listens.
    #[arg(long, default_value = "127.0.0.1:0", requires = "serve")]
    pub listen: SocketAddr,
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct SessionBench {
    /// Sessions per server.
    pub sessions: usize,
    /// What the sessions do under load.
    pub load: LoadSpec,
    /// How long the load lasts.
    pub duration: Duration,
    /// How long the idle CPU window lasts.
    pub idle: Duration,
    /// A command or connection unanswered this long is an error.
    pub timeout: Duration,
    /// Workers and sessions per child.
    pub setup: ServerSetup,
    /// The servers, in order.
    pub servers: Vec<ServerKind>,
    /// How many times each server is measured.
    pub rounds: usize,
}

impl From<&SessionBenchArgs> for SessionBench {
    fn from(args: &SessionBenchArgs) -> Self {
        SessionBench {
            sessions: args.sessions,
            load: LoadSpec {
                busy: args.busy.min(args.sessions),
                interval: args.interval,
                busy_interval: args.busy_interval,
            },
            duration: args.duration,
            idle: args.idle,
            timeout: Duration::from_secs(10),
            setup: ServerSetup {
                workers: args.workers,
                per_child: args.sessions_per_child,
            },
            servers: args.servers.clone(),
            rounds: args.rounds as usize,
        }
    }
}

/// One server's results.
#[derive(Debug, Clone, Serialize)]
pub struct SessionBenchRow {
    /// Which server.
    pub server: ServerKind,
    /// Sessions open, of which `busy` were busy.
    pub sessions: usize,
    /// Busy sessions.
    pub busy: usize,
    /// Processes in the server's tree.
    pub processes: usize,
    /// Threads in the server's tree.
    pub threads: u64,
    /// Resident memory of the tree, MiB (shared pages once per process).
    pub rss_mib: f64,
    /// Proportional memory of the tree, MiB (shared pages divided).
    pub pss_mib: f64,
    /// What the sessions added to `pss_mib`: the tree's PSS with every
    /// session open minus its PSS before the first, MiB.
    pub sessions_pss_mib: f64,
    /// Median command latency, ms.
    pub p50_ms: f64,
    /// 99th percentile command latency, ms.
    pub p99_ms: f64,
    /// Slowest command, ms.
    pub max_ms: f64,
    /// Commands answered.
    pub commands: u64,
    /// Commands per second answered to the busy sessions.
    pub busy_per_s: f64,
    /// Failed or unanswered commands and sessions lost.
    pub errors: u64,
    /// CPU time the tree used while every session was idle, ms.
    pub idle_cpu_ms: f64,
    /// Length of that idle window, s.
    pub idle_s: f64,
    /// Time to open every session, s.
    pub connect_s: f64,
    /// Rounds this row is the median of.
    pub rounds: usize,
    /// Each round's p99, ms, in the order they ran.
    pub p99_rounds_ms: Vec<f64>,
}

/// Runs the benchmark against every server in `bench.servers`, telling
/// `progress` what it is doing. A server that cannot be measured is an
/// error naming it.
pub fn run(
    bench: &SessionBench,
    mut progress: impl FnMut(&str),
) -> Result<Vec<SessionBenchRow>, String> {
    let limit = raise_fd_limit(bench.sessions as u64 + 256)?;
    progress(&format!("open files limit {limit}"));
    let count = bench.servers.len();
    let rounds = bench.rounds.max(1);
    let mut measured: Vec<Vec<SessionBenchRow>> = vec![Vec::new(); count];
    for round in 0..rounds {
        // Each round starts with the next server, so none is always the
        // one measured right after a teardown.
        for turn in 0..count {
            let index = (round + turn) % count;
            let server = bench.servers[index];
            progress(&format!(
                "round {}/{rounds}: {}: {} sessions",
                round + 1,
                server.label(),
                bench.sessions
            ));
            let row = measure(server, bench, &mut progress)
                .map_err(|e| format!("{}: {e}", server.label()))?;
            measured[index].push(row);
        }
    }
    Ok(measured.into_iter().map(median_row).collect())
}

/// One row for one server's rounds: medians, except idle CPU (the most
/// any round used: the claim is zero in every one), errors and commands
/// (summed), and threads and processes (the most).
fn median_row(rounds: Vec<SessionBenchRow>) -> SessionBenchRow {
    let median = |field: fn(&SessionBenchRow) -> f64| {
        let mut values: Vec<f64> = rounds.iter().map(field).collect();
        values.sort_by(f64::total_cmp);
        let mid = values.len() / 2;
        if values.len() % 2 == 1 {
            values[mid]
        } else {
            (values[mid - 1] + values[mid]) / 2.0
        }
    };
    let first = &rounds[0];
    SessionBenchRow {
        server: first.server,
        sessions: first.sessions,
        busy: first.busy,
        processes: rounds.iter().map(|r| r.processes).max().unwrap_or(0),
        threads: rounds.iter().map(|r| r.threads).max().unwrap_or(0),
        rss_mib: median(|r| r.rss_mib),
        pss_mib: median(|r| r.pss_mib),
        sessions_pss_mib: median(|r| r.sessions_pss_mib),
        p50_ms: median(|r| r.p50_ms),
        p99_ms: median(|r| r.p99_ms),
        max_ms: median(|r| r.max_ms),
        commands: rounds.iter().map(|r| r.commands).sum(),
        busy_per_s: median(|r| r.busy_per_s),
        errors: rounds.iter().map(|r| r.errors).sum(),
        idle_cpu_ms: rounds.iter().map(|r| r.idle_cpu_ms).fold(0.0, f64::max),
        idle_s: first.idle_s,
        connect_s: median(|r| r.connect_s),
        rounds: rounds.len(),
        p99_rounds_ms: rounds.iter().map(|r| r.p99_ms).collect(),
    }
}

fn measure(
    kind: ServerKind,
    bench: &SessionBench,
    progress: &mut impl FnMut(&str),
) -> Result<SessionBenchRow, String> {
    let server = ServerProcess::start(kind, &bench.setup)?;
    let pid = server.pid();
    let cost = |what: &str| {
        procfs::tree_cost(pid).map_err(|e| format!("cannot read {what} of pid {pid}: {e}"))
    };

    // What the server costs before any session, once it has settled.
    std::thread::sleep(Duration::from_millis(500));
    let empty = cost("the empty server's cost")?;

    let connecting = Instant::now();
    let mut clients = Clients::connect(server.addr, bench.sessions, bench.timeout)?;
    let connect_s = connecting.elapsed().as_secs_f64();
    progress(&format!(
        "  {} sessions open in {connect_s:.1} s",
        clients.len()
    ));

    // Let the server settle (a pool may still be starting a spare child),
    // then measure it doing nothing.
    std::thread::sleep(Duration::from_secs(1));
    let before = cost("the idle cost")?;
    std::thread::sleep(bench.idle);
    let after = cost("the idle cost")?;
    let ticks = after.cpu_ticks.saturating_sub(before.cpu_ticks);
    let idle_cpu_ms = ticks as f64 * 1000.0 / crate::sys::clock_ticks_per_second() as f64;
    progress(&format!(
        "  idle for {:?}: {idle_cpu_ms:.0} ms of CPU",
        bench.idle
    ));

    let loaded = clients.run(&bench.load, bench.duration, bench.timeout);
    let open = cost("the memory")?;
    let all_open = clients.all_open();
    drop(clients);
    let stderr = server.stop(Duration::from_secs(5));
    if !all_open && loaded.errors > 0 && !stderr.is_empty() {
        progress(&format!("  server said: {}", stderr.trim()));
    }

    let ms = |q: f64| loaded.latency_us.value_at_quantile(q) as f64 / 1000.0;
    let row = SessionBenchRow {
        server: kind,
        sessions: bench.sessions,
        busy: bench.load.busy,
        processes: open.processes,
        threads: open.threads,
        rss_mib: open.rss_kib as f64 / 1024.0,
        pss_mib: open.pss_kib as f64 / 1024.0,
        sessions_pss_mib: open.pss_kib.saturating_sub(empty.pss_kib) as f64 / 1024.0,
        p50_ms: ms(0.5),
        p99_ms: ms(0.99),
        max_ms: loaded.latency_us.max() as f64 / 1000.0,
        commands: loaded.latency_us.len(),
        busy_per_s: loaded.busy_answered as f64 / bench.duration.as_secs_f64(),
        errors: loaded.errors,
        idle_cpu_ms,
        idle_s: bench.idle.as_secs_f64(),
        connect_s,
        rounds: 1,
        p99_rounds_ms: vec![ms(0.99)],
    };
    progress(&format!(
        "  {} threads, {:.1} MiB RSS, p99 {:.2} ms, {} errors",
        row.threads, row.rss_mib, row.p99_ms, row.errors
    ));
    Ok(row)
}

/// Raises the soft `RLIMIT_NOFILE` to at least `needed` (up to the hard
/// limit); returns the limit now in force.
pub fn raise_fd_limit(needed: u64) -> Result<u64, String> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)
        .map_err(|e| format!("cannot read the open files limit: {e}"))?;
    if soft >= needed {
        return Ok(soft);
    }
    if hard < needed {
        return Err(format!(
            "{needed} open files are needed but the hard limit is {hard}; \
             raise it (ulimit -Hn, LimitNOFILE) or open fewer sessions"
        ));
    }
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
        .map_err(|e| format!("cannot raise the open files limit to {hard}: {e}"))?;
    Ok(hard)
}

/// The rows as a text table, with a note on what the columns mean.
pub fn render(rows: &[SessionBenchRow]) -> String {
    let headers = [
        "server",
        "sessions",
        "procs",
        "threads",
        "RSS MiB",
        "PSS MiB",
        "+sessions MiB",
        "p50 ms",
        "p99 ms",
        "max ms",
        "busy cmd/s",
        "errors",
        "idle CPU ms",
    ];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.server.label().to_string(),
                format!("{} ({} busy)", r.sessions, r.busy),
                r.processes.to_string(),
                r.threads.to_string(),
                format!("{:.1}", r.rss_mib),
                format!("{:.1}", r.pss_mib),
                format!("{:.1}", r.sessions_pss_mib),
                format!("{:.2}", r.p50_ms),
                format!("{:.2}", r.p99_ms),
                format!("{:.1}", r.max_ms),
                format!("{:.0}", r.busy_per_s),
                r.errors.to_string(),
                format!("{:.0}", r.idle_cpu_ms),
            ]
        })
        .collect();
    let mut table =
        crate::bench::table::Table::new("Many sessions: mostly idle, a few busy", &headers);
    for row in cells {
        table.row(row);
    }
    let mut out = table.render();
    if let Some(r) = rows.first() {
        let _ = writeln!(
            out,
            "\nMemory and threads: the server's process tree with every session open, \
             after the load; +sessions is its PSS minus its PSS before the first \
             session. Idle CPU: over {:.0} s with every session open and silent.",
            r.idle_s
        );
        if r.rounds > 1 {
            let _ = writeln!(
                out,
                "Medians of {} rounds (idle CPU: the most of any round); p99 ms per round:",
                r.rounds
            );
            for row in rows {
                let p99s: Vec<String> = row
                    .p99_rounds_ms
                    .iter()
                    .map(|v| format!("{v:.2}"))
                    .collect();
                let _ = writeln!(out, "  {:<20} {}", row.server.label(), p99s.join("  "));
            }
        }
    }
    out
}

/// `forkpool-bench bench-sessions`: runs the benchmark and prints the table (or
/// JSON), or, with `--serve`, is one of its servers.
pub fn command(args: SessionBenchArgs) -> Result<(), String> {
    if let Some(kind) = args.serve {
        return servers::serve(kind, args.listen, args.workers);
    }
    let bench = SessionBench::from(&args);
    let rows = run(&bench, |step| eprintln!("bench-sessions: {step}"))?;
    if args.json {
        let json = serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?;
        println!("{json}");
    } else {
        print!("{}", render(&rows));
    }
    Ok(())
}
