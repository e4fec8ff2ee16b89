//! `forkpool status`: reads a running pool's control socket and prints its
//! scoreboard and totals.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use forkpool::status::{KillReason, SlotStatus, Snapshot};

/// Options of `forkpool status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The pool's control socket [default: as `forkpool demo` and `run` use].
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Print the raw JSON snapshot.
    #[arg(long)]
    pub json: bool,
}

/// Prints the status of the pool behind the control socket.
pub fn run(args: StatusArgs) -> Result<(), String> {
    let path = args
        .control
        .unwrap_or_else(crate::settings::default_control_path);
    let text = fetch_text(&path)?;
    if args.json {
        print!("{text}");
        return Ok(());
    }
    print!("{}", render(&parse(&path, &text)?));
    Ok(())
}

/// One snapshot from the control socket at `path`.
pub fn fetch(path: &Path) -> Result<Snapshot, String> {
    parse(path, &fetch_text(path)?)
}

fn fetch_text(path: &Path) -> Result<String, String> {
    let mut stream = UnixStream::connect(path).map_err(|e| {
        format!(
            "cannot reach a pool at {}: {e} (is it running? pass --control PATH)",
            path.display()
        )
    })?;
    forkpool::control_path::check_server(&stream, path).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let mut text = String::new();
    stream
        .read_to_string(&mut text)
        .map_err(|e| format!("reading {}: {e}", path.display()))?;
    Ok(text)
}

fn parse(path: &Path, text: &str) -> Result<Snapshot, String> {
    serde_json::from_str(text).map_err(|e| {
        format!(
            "{} sent something that is not a status: {e}",
            path.display()
        )
    })
}

/// Any of the per-child figures the supervisor sampled from `/proc`.
fn observed(slot: &SlotStatus) -> bool {
    slot.cpu_seconds.is_some()
        || slot.cpu_percent.is_some()
        || slot.rss_bytes.is_some()
        || slot.pss_bytes.is_some()
        || slot.uss_bytes.is_some()
        || slot.peer.is_some()
}

/// CPU%, CPU seconds, RSS, PSS, USS and peer; `-` for what is unknown.
fn observed_cells(slot: &SlotStatus) -> String {
    let dash = || "-".to_string();
    let bytes = |b: Option<u64>| b.map_or_else(dash, crate::top::bytes);
    format!(
        " {:>6} {:>9} {:>8} {:>8} {:>8} {}",
        slot.cpu_percent.map_or_else(dash, |p| format!("{p:.1}")),
        slot.cpu_seconds.map_or_else(dash, |c| format!("{c:.2}s")),
        bytes(slot.rss_bytes),
        bytes(slot.pss_bytes),
        bytes(slot.uss_bytes),
        slot.peer.clone().unwrap_or_else(dash),
    )
}

fn millis(ms: u64) -> String {
    humantime::format_duration(Duration::from_millis(ms)).to_string()
}

/// The human-readable status page.
///
/// One function on purpose: the page is written top to bottom, header,
/// slot table and template rows, in the order it is read.
pub fn render(s: &Snapshot) -> String {
    let [min_c, max_c, min_s, max_s] = s.bounds;
    let mut out = format!(
        "forkpool pid {}, generation {}, dispatch {}, up {}\n\
         children: {} idle, {} busy, {} starting, {} leaving \
         (children {min_c}..{max_c}, spare {min_s}..{max_s})\n\
         child states: {}\n\n",
        s.pid,
        s.generation,
        s.dispatch,
        millis(s.uptime_ms / 1000 * 1000),
        s.idle,
        s.busy,
        s.starting,
        s.leaving,
        s.line
    );
    let sessions = s.slots.iter().any(|slot| slot.sessions.is_some());
    let observed = s.slots.iter().any(observed);
    out += &format!(
        "{:>4} {:>8} {:<9} {:>4} {:>8} {:>10} {:>10}{}{}\n",
        "SLOT",
        "PID",
        "STATE",
        "GEN",
        "SERVED",
        "BUSY FOR",
        "LAST HEARD",
        if sessions { "   SESSIONS RUNNING" } else { "" },
        if observed {
            format!(
                " {:>6} {:>9} {:>8} {:>8} {:>8} PEER",
                "CPU%", "CPU", "RSS", "PSS", "USS"
            )
        } else {
            String::new()
        }
    );
    for slot in &s.slots {
        out += &format!(
            "{:>4} {:>8} {:<9} {:>4} {:>8} {:>10} {:>10}{}{}\n",
            slot.slot,
            slot.pid,
            slot.state,
            slot.generation,
            slot.served,
            slot.busy_for_ms
                .map_or("-".to_string(), |ms| format!("{ms}ms")),
            format!("{}ms ago", slot.last_heard_ms),
            slot.sessions.map_or(String::new(), |(load, cap)| format!(
                " {:>10} {:>7}",
                format!("{load}/{cap}"),
                slot.sessions_running.unwrap_or(0)
            )),
            if observed {
                observed_cells(slot)
            } else {
                String::new()
            },
        );
    }
    out += &template_rows(s);
    let t = &s.totals;
    let kills: Vec<String> = KillReason::ALL
        .iter()
        .filter(|r| t.killed_by.get(**r) > 0)
        .map(|r| format!("{} {}", r.key(), t.killed_by.get(*r)))
        .collect();
    out += &format!(
        "\ntotals: accepted {} ({} taken next by a finishing child), spawned {}, retired {}, killed {}{}, died unexpectedly {}, \
         futile wake-ups {}, at max-children {} ({} times), held with the CPUs taken {} times, reloads {}{}{}\n",
        t.accepted,
        t.taken_next,
        t.spawned,
        t.retired,
        t.killed,
        if kills.is_empty() {
            String::new()
        } else {
            format!(" ({})", kills.join(", "))
        },
        t.died,
        t.futile_wakeups,
        millis(t.saturated_ms),
        t.saturated,
        t.cpu_bound,
        t.reloads,
        if t.reload_failures > 0 {
            format!(
                " ({} failed; generation {} serving)",
                t.reload_failures, s.serving_generation
            )
        } else {
            String::new()
        },
        if t.abandoned > 0 {
            format!(
                ", abandoned {} (connections that never reached their child)",
                t.abandoned
            )
        } else {
            String::new()
        },
    );
    out
}

/// The templates (`--preload`), a row each, after the slots.
fn template_rows(s: &Snapshot) -> String {
    if s.templates.is_empty() {
        return String::new();
    }
    let mib = |b: Option<u64>| {
        b.map_or("-".to_string(), |b| {
            format!("{:.1}MiB", b as f64 / 1048576.0)
        })
    };
    let mut out = format!(
        "\n{:>8} {:<9} {:>4} {:>10} {:>8} {:>6} {:>9} {:>9} {:>9}\n",
        "TEMPLATE", "STATE", "GEN", "UP", "READY IN", "FORKS", "RSS", "PSS", "USS"
    );
    for t in &s.templates {
        out += &format!(
            "{:>8} {:<9} {:>4} {:>10} {:>8} {:>6} {:>9} {:>9} {:>9}\n",
            t.pid,
            t.state,
            t.generation,
            millis(t.uptime_ms),
            t.ready_after_ms.map_or("-".to_string(), millis),
            t.forks,
            mib(t.rss_bytes),
            mib(t.pss_bytes),
            mib(t.uss_bytes),
        );
    }
    if s.totals.template_restarts > 0 {
        out += &format!("template restarts: {}\n", s.totals.template_restarts);
    }
    if s.totals.templates_killed > 0 {
        out += &format!("templates killed: {}\n", s.totals.templates_killed);
    }
    if s.totals.lost > 0 {
        out += &format!("workers lost: {}\n", s.totals.lost);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampled_figures_get_columns_only_when_present() {
        let mut s = crate::top::test_snapshot(1_000, 2, 0);
        assert!(!render(&s).contains("USS"));
        s.slots[1].uss_bytes = Some(3 << 20);
        s.slots[1].cpu_percent = Some(12.5);
        s.slots[1].peer = Some("127.0.0.1:4000".to_string());
        let text = render(&s);
        let row = text
            .lines()
            .find(|l| l.trim_start().starts_with("1 "))
            .unwrap();
        assert!(text.contains("USS"), "{text}");
        assert!(row.contains("3.0M") && row.contains("12.5"), "{text}");
        assert!(row.ends_with("127.0.0.1:4000"), "{text}");
    }

    #[test]
    fn a_slow_exit_shows_under_its_own_kill_reason() {
        let mut s = crate::top::test_snapshot(1_000, 2, 0);
        s.totals.killed = 3;
        s.totals.killed_by.add(KillReason::ExitTimeout);
        s.totals.killed_by.add(KillReason::ExitTimeout);
        s.totals.killed_by.add(KillReason::Misbehaved);
        let text = render(&s);
        assert!(
            text.contains("killed 3 (exit_timeout 2, misbehaved 1)"),
            "{text}"
        );
    }
}
