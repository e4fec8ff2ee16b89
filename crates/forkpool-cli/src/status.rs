//! `forkpool status`: reads a running pool's control socket and prints its
//! scoreboard and totals.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use forkpool::status::{KillReason, Snapshot};

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
    let mut stream = UnixStream::connect(&path).map_err(|e| {
        format!(
            "cannot reach a pool at {}: {e} (is it running? pass --control PATH)",
            path.display()
        )
    })?;
    forkpool::control_path::check_server(&stream, &path).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let mut text = String::new();
    stream
        .read_to_string(&mut text)
        .map_err(|e| format!("reading {}: {e}", path.display()))?;
    if args.json {
        print!("{text}");
        return Ok(());
    }
    let snapshot: Snapshot = serde_json::from_str(&text).map_err(|e| {
        format!(
            "{} sent something that is not a status: {e}",
            path.display()
        )
    })?;
    print!("{}", render(&snapshot));
    Ok(())
}

fn millis(ms: u64) -> String {
    humantime::format_duration(Duration::from_millis(ms)).to_string()
}

/// The human-readable status page.
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
    out += &format!(
        "{:>4} {:>8} {:<9} {:>4} {:>8} {:>10} {:>10}{}\n",
        "SLOT",
        "PID",
        "STATE",
        "GEN",
        "SERVED",
        "BUSY FOR",
        "LAST HEARD",
        if sessions { "   SESSIONS" } else { "" }
    );
    for slot in &s.slots {
        out += &format!(
            "{:>4} {:>8} {:<9} {:>4} {:>8} {:>10} {:>10}{}\n",
            slot.slot,
            slot.pid,
            slot.state,
            slot.generation,
            slot.served,
            slot.busy_for_ms
                .map_or("-".to_string(), |ms| format!("{ms}ms")),
            format!("{}ms ago", slot.last_heard_ms),
            slot.sessions.map_or(String::new(), |(load, cap)| format!(
                " {:>10}",
                format!("{load}/{cap}")
            )),
        );
    }
    let t = &s.totals;
    let kills: Vec<String> = KillReason::ALL
        .iter()
        .filter(|r| t.killed_by.get(**r) > 0)
        .map(|r| format!("{} {}", r.key(), t.killed_by.get(*r)))
        .collect();
    out += &format!(
        "\ntotals: accepted {} ({} taken next by a finishing child), spawned {}, retired {}, killed {}{}, died unexpectedly {}, \
         futile wake-ups {}, at max-children {} ({} times), reloads {}\n",
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
        t.reloads,
    );
    out
}
