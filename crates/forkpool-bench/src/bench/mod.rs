//! `forkpool-bench`: measures the pool's dispatch modes side by side, and
//! against other servers, in one invocation.
//!
//! Four benchmarks, each a file:
//! - [`throughput`]: requests per second and latency percentiles, close per
//!   request and keep-alive, at each concurrency, for each dispatch mode and
//!   each `--peer`;
//! - [`wakeups`]: what a request costs the pool in context switches, CPU
//!   time and futile wake-ups (the thundering herd), per dispatch mode;
//! - [`scaleup`]: how fast a resting pool grows to 64 serving children
//!   under a load step, next to the same policy simulated at Apache's
//!   once-a-second cadence ([`simulate`]);
//! - [`memory`]: what an idle child costs (USS/PSS), with and without a
//!   100 MiB table preloaded in the parent and shared copy-on-write;
//! - [`preload`]: a heavy Python app under `forkpool run` with and without
//!   `--preload` (worker start, a burst, memory per worker), and
//!   [`refork`]: a pool's memory before and after `--refork-after`.
//!
//! The tools they share: [`loadgen`] (the HTTP client, with [`target`],
//! [`http`] and [`latency`]), [`procstat`] (reading `/proc`),
//! [`pool_process`] (running `forkpool demo`), [`app_pool`] (running
//! `forkpool run` on a Python app), and [`table`] (the output).
//! `docs/benchmarks.md` tells how to run them; the first sections of
//! `docs/benchmarks/history.md` what each column means.

mod app_pool;
mod http;
mod latency;
mod loadgen;
mod memory;
mod pool_process;
mod preload;
mod procstat;
mod refork;
mod scaleup;
mod simulate;
pub(crate) mod table;
mod target;
#[cfg(test)]
mod test_server;
mod throughput;
mod wakeups;

use std::time::Duration;

use forkpool::config::{parse_duration, DispatchMode};
use serde::Serialize;

use loadgen::{ConnectionMode, LoadSpec};
use target::Target;

/// The options of `forkpool-bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// How long each measurement window lasts.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Load before each window that is not counted.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Concurrent connections to try, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,256")]
    pub concurrency: Vec<usize>,
    /// Dispatch modes of the pool to measure, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "kernel,handoff,order,shared,herd"
    )]
    pub modes: Vec<DispatchMode>,
    /// Another server to measure alongside, e.g. apache=http://127.0.0.1:8081/hello
    /// (repeatable; see bench/peers.sh).
    #[arg(long = "peer", value_name = "NAME=URL", value_parser = Peer::parse)]
    pub peers: Vec<Peer>,
    /// Measure an already running server at this URL instead of starting
    /// `forkpool demo` (only the throughput benchmark can run then).
    #[arg(long, value_name = "URL", value_parser = Target::parse)]
    pub url: Option<Target>,
    /// Print the results as JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Run only these benchmarks, comma-separated (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Benchmark>,
    /// A request unanswered this long counts as a timeout error.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Client threads of the load generator (default: one per core, at
    /// most one per connection).
    #[arg(long)]
    pub client_threads: Option<usize>,
    /// Rounds of the sessions benchmark (each server measured this many
    /// times, taking turns; about 45 s a round).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub session_rounds: u32,
}

/// One of the benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Benchmark {
    /// Requests per second and latency.
    Throughput,
    /// Context switches, CPU and futile wake-ups per request.
    Wakeups,
    /// Growth of a resting pool under a load step.
    Scaleup,
    /// Memory per idle child.
    Memory,
    /// Many mostly idle sessions: `forkpool demo --sessions` against a
    /// session pool and a thread per session (see `bench_sessions`).
    Sessions,
    /// A heavy Python app with and without `forkpool run --preload`, and
    /// refork (needs `python3` and `target/release/forkpool`).
    Preload,
}

/// A server to compare with, named for the tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Its name in the tables (`apache`).
    pub name: String,
    /// Where to send the load.
    pub target: Target,
}

impl Peer {
    fn parse(text: &str) -> Result<Peer, String> {
        let (name, url) = text.split_once('=').ok_or_else(|| {
            format!("'{text}' is not NAME=URL (e.g. apache=http://127.0.0.1:8081/hello)")
        })?;
        if name.is_empty() {
            return Err(format!("'{text}' has no name before '='"));
        }
        Ok(Peer {
            name: name.to_string(),
            target: Target::parse(url)?,
        })
    }
}

impl BenchArgs {
    fn wants(&self, benchmark: Benchmark) -> bool {
        self.only.is_empty() || self.only.contains(&benchmark)
    }

    /// A load run with these options' timing, timeout and client threads.
    fn load(&self, target: Target, connection: ConnectionMode, concurrency: usize) -> LoadSpec {
        let mut spec = LoadSpec::new(target, connection, concurrency, self.warmup, self.duration);
        spec.timeout = self.timeout;
        if let Some(threads) = self.client_threads {
            spec.threads = threads;
        }
        spec
    }
}

/// Everything one invocation measured; printed as tables or JSON.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// See [`throughput`].
    pub throughput: Vec<throughput::ThroughputRow>,
    /// See [`wakeups`].
    pub wakeups: Vec<wakeups::WakeupRow>,
    /// See [`scaleup`].
    pub scaleup: Option<scaleup::ScaleupReport>,
    /// See [`memory`].
    pub memory: Vec<memory::MemoryRow>,
    /// See `bench_sessions`.
    pub sessions: Vec<crate::bench_sessions::SessionBenchRow>,
    /// See [`preload`].
    pub preload: Option<preload::PreloadReport>,
    /// What could not be measured, and why.
    pub notes: Vec<String>,
}

impl Report {
    fn is_empty(&self) -> bool {
        self.throughput.is_empty()
            && self.wakeups.is_empty()
            && self.scaleup.is_none()
            && self.memory.is_empty()
            && self.sessions.is_empty()
            && self.preload.as_ref().is_none_or(|p| p.runs.is_empty())
    }

    /// Keeps a benchmark's rows, or notes why there are none.
    fn keep<T>(&mut self, what: &str, result: Result<T, String>) -> Option<T> {
        match result {
            Ok(rows) => Some(rows),
            Err(why) => {
                progress(&format!("{what}: {why}"));
                self.notes.push(format!("{what}: {why}"));
                None
            }
        }
    }
}

/// Runs the benchmarks `args` asks for and prints the results.
pub fn run(args: &BenchArgs) -> Result<(), String> {
    if args.concurrency.contains(&0) {
        return Err("--concurrency values must be at least 1".to_string());
    }
    let mut report = Report::default();
    if args.wants(Benchmark::Throughput) {
        run_throughput(args, &mut report);
    }
    let pool_only = [
        Benchmark::Wakeups,
        Benchmark::Scaleup,
        Benchmark::Memory,
        Benchmark::Sessions,
        Benchmark::Preload,
    ];
    if args.url.is_some() {
        if pool_only.iter().any(|b| args.wants(*b)) {
            report.notes.push(
                "wakeups, scaleup, memory, sessions and preload start their own servers: \
                 they do not run with --url"
                    .to_string(),
            );
        }
    } else {
        if args.wants(Benchmark::Wakeups) {
            run_wakeups(args, &mut report);
        }
        if args.wants(Benchmark::Scaleup) {
            report.scaleup = Some(scaleup::run(args, &mut report.notes));
        }
        if args.wants(Benchmark::Memory) {
            run_memory(&mut report);
        }
        if args.wants(Benchmark::Sessions) {
            run_sessions(args.session_rounds, &mut report);
        }
        if args.wants(Benchmark::Preload) {
            report.preload = Some(preload::run(&mut report.notes));
        }
    }
    if args.json {
        let json =
            serde_json::to_string_pretty(&report).map_err(|e| format!("cannot write JSON: {e}"))?;
        println!("{json}");
    } else {
        print!("{}", table::render(&report));
    }
    if report.is_empty() {
        return Err(format!("nothing was measured: {}", report.notes.join("; ")));
    }
    Ok(())
}

fn run_throughput(args: &BenchArgs, report: &mut Report) {
    if let Some(url) = &args.url {
        let rows = throughput::measure("url", url, args);
        if let Some(rows) = report.keep(&format!("throughput of {url}"), rows) {
            report.throughput.extend(rows);
        }
    } else {
        for &mode in &args.modes {
            let rows = throughput::measure_pool(mode, args);
            if let Some(rows) = report.keep(&format!("throughput of forkpool/{mode}"), rows) {
                report.throughput.extend(rows);
            }
        }
    }
    for peer in &args.peers {
        let rows = throughput::measure(&peer.name, &peer.target, args);
        if let Some(rows) = report.keep(&format!("throughput of {}", peer.name), rows) {
            report.throughput.extend(rows);
        }
    }
}

fn run_wakeups(args: &BenchArgs, report: &mut Report) {
    for &mode in &args.modes {
        for &concurrency in &args.concurrency {
            let row = wakeups::measure(mode, concurrency, args);
            if let Some(row) =
                report.keep(&format!("wakeups of forkpool/{mode} c={concurrency}"), row)
            {
                report.wakeups.push(row);
            }
        }
    }
}

/// The session benchmark with its own defaults (2,000 sessions, 8 busy,
/// 4 workers) and `rounds`; `forkpool-bench bench-sessions` exposes all of its
/// options.
fn run_sessions(rounds: u32, report: &mut Report) {
    #[derive(clap::Parser)]
    struct Defaults {
        #[command(flatten)]
        args: crate::bench_sessions::SessionBenchArgs,
    }
    let defaults = <Defaults as clap::Parser>::try_parse_from(["sessions"])
        .map(|d| d.args)
        .map_err(|e| e.to_string());
    let rows = defaults.and_then(|args| {
        let args = crate::bench_sessions::SessionBenchArgs { rounds, ..args };
        let bench = crate::bench_sessions::SessionBench::from(&args);
        crate::bench_sessions::run(&bench, |step| progress(&format!("sessions: {step}")))
    });
    if let Some(rows) = report.keep("sessions", rows) {
        report.sessions = rows;
    }
}

fn run_memory(report: &mut Report) {
    for preload_mib in memory::PRELOADS_MIB {
        let row = memory::measure(preload_mib);
        if let Some(row) = report.keep(&format!("memory with --preload-mib {preload_mib}"), row) {
            report.memory.push(row);
        }
    }
}

/// The demo's arguments for `mode` plus `extra`. Every pool defers
/// accepts until the request has arrived (`TCP_DEFER_ACCEPT`), as Apache
/// httpd does for HTTP on Linux by default (`AcceptFilter http data`).
fn pool_args(mode: DispatchMode, extra: &[&str]) -> Vec<String> {
    let mut args = vec![
        "--dispatch".to_string(),
        mode.name().to_string(),
        "--defer-accept".to_string(),
        DEFER_ACCEPT.to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// `--defer-accept` for the HTTP pools measured.
pub const DEFER_ACCEPT: &str = "5s";

/// How long the demo gets to start listening, and to exit after SIGTERM.
const POOL_START: Duration = Duration::from_secs(10);
const POOL_STOP: Duration = Duration::from_secs(10);

/// A line on stderr saying what is being measured, so a long run shows life.
fn progress(line: &str) {
    eprintln!("bench: {line}");
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::test_server::TestServer;
    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).map(|c| c.bench)
    }

    #[test]
    fn defaults() {
        let args = parse(&[]).unwrap();
        assert_eq!(args.duration, Duration::from_secs(5));
        assert_eq!(args.concurrency, [1, 16, 64, 256]);
        assert_eq!(args.modes.len(), 5);
        assert_eq!(args.modes[0], DispatchMode::Kernel);
        assert!(args.only.is_empty() && args.peers.is_empty() && args.url.is_none());
        assert!(args.wants(Benchmark::Memory));
    }

    #[test]
    fn options() {
        let args = parse(&[
            "--duration=2s",
            "--concurrency",
            "4,8",
            "--modes",
            "handoff,herd",
            "--peer",
            "apache=http://127.0.0.1:8081/hello",
            "--peer",
            "nginx=http://[::1]:8082/",
            "--only",
            "throughput,memory",
            "--json",
        ])
        .unwrap();
        assert_eq!(args.duration, Duration::from_secs(2));
        assert_eq!(args.concurrency, [4, 8]);
        assert_eq!(args.modes, [DispatchMode::Handoff, DispatchMode::Herd]);
        assert_eq!(args.peers[0].name, "apache");
        assert_eq!(args.peers[1].target.addr, "[::1]:8082".parse().unwrap());
        assert!(args.wants(Benchmark::Memory) && !args.wants(Benchmark::Scaleup));
        assert!(args.json);
    }

    #[test]
    fn bad_options_are_refused_with_the_fix() {
        let err = parse(&["--peer", "http://127.0.0.1:1/"])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("NAME=URL"), "{err}");
        let err = parse(&["--url", "http://10.1.1.1/"])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("refusing non-loopback host"), "{err}");
        assert!(parse(&["--modes", "fast"]).is_err());
        assert!(parse(&["--duration", "soon"]).is_err());
    }

    #[test]
    fn measures_a_running_server_by_url() {
        let server = TestServer::start();
        let url = format!("http://{}/", server.addr());
        let args = parse(&[
            "--url",
            &url,
            "--duration",
            "200ms",
            "--warmup",
            "50ms",
            "--concurrency",
            "2",
            "--only",
            "throughput",
        ])
        .unwrap();
        run(&args).unwrap();
    }

    #[test]
    fn nothing_measured_is_an_error() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let url = format!("http://{closed}/");
        let args = parse(&["--url", &url, "--only", "wakeups"]).unwrap();
        let err = run(&args).unwrap_err();
        assert!(err.contains("start their own servers"), "{err}");
    }
}
