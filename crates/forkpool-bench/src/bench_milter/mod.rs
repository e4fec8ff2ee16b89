//! The milter benchmark: C conversations held open at once against a mail
//! filter, each spread over an SMTP session's length as Postfix would
//! send it (see [`conversations`]), for each C asked.
//!
//! The filter is any command that listens on the port it is given
//! (`--filter 'bench/milter/add_header -p {port} -w 2000'` for the
//! libmilter one; `forkpool milter --listen 127.0.0.1:{port} -- RULES`
//! once that exists), started afresh for each C and stopped after. For
//! each C it reports, for the filter's whole process tree: the most
//! threads seen, USS and PSS at the end (USS: pages no other process
//! shares), p50/p99/max latency of a command (write to final reply) and
//! p50/p99 of end of message alone (a filter that negotiates steps away
//! answers fewer, cheaper commands, so only this one compares), CPU
//! per message, and what was lost (conversations the filter closed,
//! connections refused). The numbers come from `/proc`; all traffic is on
//! loopback.
//!
//! `forkpool-bench bench-milter` runs it (`bench/milter.sh` builds the C
//! filter and calls it).

mod conversations;
mod wire;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use forkpool::config::parse_duration;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::Serialize;

use crate::bench_sessions::{procfs, raise_fd_limit};
use conversations::LoadSpec;

/// Options of `forkpool-bench bench-milter`.
#[derive(Debug, Clone, clap::Args)]
pub struct MilterBenchArgs {
    /// The filter's command line, `{port}` standing for its port on
    /// 127.0.0.1 (split on spaces).
    #[arg(long)]
    pub filter: String,
    /// Conversations to hold at once, one measurement each.
    #[arg(long, value_delimiter = ',', default_value = "100,1000")]
    pub conversations: Vec<usize>,
    /// How long a conversation lasts (the talk's SMTP sessions: 11.7 s).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub session: Duration,
    /// How long the load runs before it is measured.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// How long it is measured.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Send SIGHUP to the filter's process (a forkpool supervisor reloads)
    /// this long into the measured window.
    #[arg(long, value_parser = parse_duration)]
    pub reload_at: Option<Duration>,
    /// Print the rows as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One measurement.
#[derive(Debug, Clone, Serialize)]
pub struct MilterRow {
    /// Conversations held at once.
    pub conversations: usize,
    /// Processes in the filter's tree at the end.
    pub processes: usize,
    /// The most threads seen in the tree.
    pub threads: u64,
    /// Unique memory of the tree at the end, MiB.
    pub uss_mib: f64,
    /// Proportional memory of the tree at the end, MiB.
    pub pss_mib: f64,
    /// Median command latency, ms.
    pub p50_ms: f64,
    /// 99th percentile command latency, ms.
    pub p99_ms: f64,
    /// Slowest command, ms.
    pub max_ms: f64,
    /// Median end-of-message latency, ms.
    pub eom_p50_ms: f64,
    /// 99th percentile end-of-message latency, ms.
    pub eom_p99_ms: f64,
    /// Messages filtered (header added) while measured.
    pub messages: u64,
    /// The tree's CPU time per message, ms.
    pub cpu_per_message_ms: f64,
    /// Conversations the filter closed before QUIT.
    pub lost: u64,
    /// Connections refused.
    pub refused: u64,
    /// Commands unanswered in time, wrong replies, failed writes.
    pub errors: u64,
}

/// `forkpool-bench bench-milter`: measures each C and prints the rows.
pub fn command(args: MilterBenchArgs) -> Result<(), String> {
    let most = args.conversations.iter().copied().max().unwrap_or(0);
    raise_fd_limit(most as u64 + 256)?;
    let mut rows = Vec::new();
    for &c in &args.conversations {
        eprintln!("bench-milter: {c} conversations against {}", args.filter);
        rows.push(measure(&args, c)?);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows).unwrap());
    } else {
        print!("{}", table(&rows));
    }
    Ok(())
}

fn measure(args: &MilterBenchArgs, conversations: usize) -> Result<MilterRow, String> {
    let filter = Filter::start(&args.filter)?;
    let spec = LoadSpec {
        conversations,
        session: args.session,
        timeout: Duration::from_secs(10),
    };
    let mut threads = 0;
    let mut cpu_at_start = None;
    let mut window_start = None;
    let mut reload_at = args.reload_at;
    let result = conversations::run(filter.addr, &spec, args.warmup, args.duration, || {
        let started = *window_start.get_or_insert_with(Instant::now);
        if reload_at.is_some_and(|at| started.elapsed() >= at) {
            reload_at = None;
            eprintln!("bench-milter: SIGHUP to {}", filter.pid);
            let _ = kill(Pid::from_raw(filter.pid), Signal::SIGHUP);
        }
        if let Ok(cost) = procfs::tree_cost(filter.pid) {
            threads = threads.max(cost.threads);
            cpu_at_start.get_or_insert(cost.cpu_ticks);
        }
    })?;
    let end = procfs::tree_cost(filter.pid).unwrap_or_default();
    let (uss_kib, pss_kib) = memory_kib(filter.pid);
    let ticks = end
        .cpu_ticks
        .saturating_sub(cpu_at_start.unwrap_or(end.cpu_ticks));
    let tick_ms = 1000.0
        / nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .unwrap_or(100) as f64;
    let ms = |us: u64| us as f64 / 1000.0;
    let latency = &result.latency_us;
    Ok(MilterRow {
        conversations,
        processes: end.processes,
        threads: threads.max(end.threads),
        uss_mib: uss_kib as f64 / 1024.0,
        pss_mib: pss_kib as f64 / 1024.0,
        p50_ms: ms(latency.value_at_quantile(0.5)),
        p99_ms: ms(latency.value_at_quantile(0.99)),
        max_ms: ms(latency.max()),
        eom_p50_ms: ms(result.eom_latency_us.value_at_quantile(0.5)),
        eom_p99_ms: ms(result.eom_latency_us.value_at_quantile(0.99)),
        messages: result.messages,
        cpu_per_message_ms: ticks as f64 * tick_ms / result.messages.max(1) as f64,
        lost: result.lost,
        refused: result.refused,
        errors: result.errors,
    })
}

/// USS and PSS of `root`'s tree, KiB, from each process's `smaps_rollup`.
fn memory_kib(root: i32) -> (u64, u64) {
    let mut uss = 0;
    let mut pss = 0;
    for pid in procfs::tree(root).unwrap_or_default() {
        let Ok(rollup) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) else {
            continue;
        };
        let field = |name: &str| {
            rollup
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0)
        };
        uss += field("Private_Clean:") + field("Private_Dirty:");
        pss += field("Pss:");
    }
    (uss, pss)
}

fn table(rows: &[MilterRow]) -> String {
    let mut out = String::from(
        "    C  procs threads  USS MiB  PSS MiB  p50 ms  p99 ms  max ms  EOM p50  EOM p99  messages  CPU/msg ms  lost refused errors\n",
    );
    for r in rows {
        out.push_str(&format!(
            "{:>5} {:>6} {:>7} {:>8.1} {:>8.1} {:>7.2} {:>7.2} {:>7.1} {:>8.2} {:>8.2} {:>9} {:>11.2} {:>5} {:>7} {:>6}\n",
            r.conversations,
            r.processes,
            r.threads,
            r.uss_mib,
            r.pss_mib,
            r.p50_ms,
            r.p99_ms,
            r.max_ms,
            r.eom_p50_ms,
            r.eom_p99_ms,
            r.messages,
            r.cpu_per_message_ms,
            r.lost,
            r.refused,
            r.errors
        ));
    }
    out
}

/// The filter under measurement, its process group killed on Drop.
struct Filter {
    child: Child,
    pid: i32,
    addr: SocketAddr,
}

impl Filter {
    /// Runs `template` with `{port}` replaced by a free port; returns once
    /// a connection to it succeeds.
    fn start(template: &str) -> Result<Filter, String> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let words: Vec<String> = template
            .split_whitespace()
            .map(|w| w.replace("{port}", &port.to_string()))
            .collect();
        let (program, args) = words.split_first().ok_or("an empty --filter")?;
        let child = std::os::unix::process::CommandExt::process_group(
            // Its stdout would mix with the table; its stderr is its log.
            Command::new(program)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null()),
            0,
        )
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
        let filter = Filter {
            pid: child.id() as i32,
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(filter.addr).is_err() {
            if Instant::now() >= deadline {
                return Err(format!("{template} did not listen on {}", filter.addr));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(filter)
    }
}

impl Drop for Filter {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(-self.pid), Signal::SIGKILL);
        let _ = self.child.wait();
    }
}
