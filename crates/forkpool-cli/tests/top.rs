//! `forkpool top` against a real pool: on a real pseudo-terminal (inside
//! tmux, reading the screen back), and as plain text through a pipe.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{forkpool_bin, DemoPool};

const THREE: [&str; 8] = [
    "--min-children",
    "3",
    "--max-children",
    "3",
    "--min-spare",
    "1",
    "--max-spare",
    "3",
];

/// A pool of exactly three idle children, and their (slot, pid) pairs as
/// `forkpool status --json` reports them.
fn three_idle_children() -> (DemoPool, Vec<(u64, u64)>) {
    let pool = DemoPool::start(&THREE);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = pool.status();
        let slots: Vec<(u64, u64, String)> = status["slots"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["slot"].as_u64().unwrap(),
                    s["pid"].as_u64().unwrap(),
                    s["state"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        if slots.len() == 3 && slots.iter().all(|s| s.2 == "idle") {
            let pairs = slots
                .into_iter()
                .map(|(slot, pid, _)| (slot, pid))
                .collect();
            return (pool, pairs);
        }
        assert!(
            Instant::now() < deadline,
            "pool never reached 3 idle children: {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether `screen` has a table row for every (slot, pid): a line whose
/// first two words are that slot and pid.
fn shows_children(screen: &str, children: &[(u64, u64)]) -> bool {
    let rows: Vec<(String, String)> = screen
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.to_string(), w.next()?.to_string()))
        })
        .collect();
    children
        .iter()
        .all(|(slot, pid)| rows.contains(&(slot.to_string(), pid.to_string())))
}

/// Whether every child's row has its CPU%, CPU time, RSS and USS columns
/// (the 4th to 7th words) filled rather than `-`.
fn resource_columns_filled(screen: &str, children: &[(u64, u64)]) -> bool {
    children.iter().all(|(slot, pid)| {
        screen.lines().any(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.len() >= 7
                && w[0] == slot.to_string()
                && w[1] == pid.to_string()
                && w[3..7].iter().all(|c| *c != "-")
        })
    })
}

/// A tmux server of this test's own (`-L NAME`), killed on drop, also
/// when the test panics.
struct Tmux {
    socket: String,
}

impl Tmux {
    /// `None` when tmux is missing and the test must return without
    /// running (see `common::require`: under CI that is a failure).
    fn start(command: &str) -> Option<Tmux> {
        common::require_program("tmux", "run bash .ci/deps/tmux.sh")?;
        let tmux = Tmux {
            socket: format!("forkpool-top-test-{}", std::process::id()),
        };
        // A fixed size, and the pane kept after its program exits so a
        // failure can still show the last screen.
        tmux.run(&[
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            "120",
            "-y",
            "32",
            command,
            ";",
            "set-option",
            "-t",
            "top",
            "remain-on-exit",
            "on",
        ]);
        Some(tmux)
    }

    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("run tmux");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "top"])
    }

    /// Polls the screen until `cond` holds; the last screen either way.
    fn wait_screen(&self, timeout: Duration, cond: impl Fn(&str) -> bool) -> (bool, String) {
        let deadline = Instant::now() + timeout;
        loop {
            let screen = self.screen();
            if cond(&screen) {
                return (true, screen);
            }
            if Instant::now() >= deadline {
                return (false, screen);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .stderr(Stdio::null())
            .status();
    }
}

/// SIGKILLs a process by pid on drop (also on panic).
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        common::kill9(self.0);
    }
}

#[test]
fn top_shows_the_pool_on_a_terminal_and_quits_on_q() {
    let (pool, children) = three_idle_children();
    // tmux 3.3 sometimes marks a pane dead without recording how its
    // program ended, so the shell around top writes the status to a file.
    let status_file = pool.control.with_file_name("top-exit-status");
    let command = format!(
        "{} top --control {}; echo $? > {}",
        forkpool_bin(),
        pool.control.display(),
        status_file.display()
    );
    let Some(tmux) = Tmux::start(&command) else {
        return;
    };
    let (shown, screen) = tmux.wait_screen(Duration::from_secs(20), |s| {
        s.contains("children 3 (3..3)") && shows_children(s, &children)
    });
    assert!(shown, "top never showed {children:?}:\n{screen}");
    // The supervisor's per-child figures reach the CPU and memory columns.
    let (filled, screen) = tmux.wait_screen(Duration::from_secs(20), |s| {
        resource_columns_filled(s, &children)
    });
    assert!(
        filled,
        "CPU or memory columns empty for {children:?}:\n{screen}"
    );
    let line = pool.status()["line"].as_str().unwrap().to_string();
    assert!(screen.contains(&format!("scoreboard [{line}]")), "{screen}");

    tmux.run(&["send-keys", "-t", "top", "b"]);
    let (sorted, screen) = tmux.wait_screen(Duration::from_secs(10), |s| s.contains("sort: busy"));
    assert!(sorted, "the b key did not sort by busy time:\n{screen}");

    tmux.run(&["send-keys", "-t", "top", "q"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        let recorded = std::fs::read_to_string(&status_file).unwrap_or_default();
        if let Ok(status) = recorded.trim().parse::<i32>() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "top did not exit on q:\n{}",
            tmux.screen()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status, 0, "top exited with {status}:\n{}", tmux.screen());
}

#[test]
fn top_once_prints_plain_text_rows() {
    let (pool, children) = three_idle_children();
    let out = Command::new(forkpool_bin())
        .args(["top", "--once", "--control"])
        .arg(&pool.control)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        shows_children(&text, &children),
        "{children:?} not in:\n{text}"
    );
    // Plain text: no escape sequences for a terminal.
    assert!(!text.contains('\u{1b}'), "{text:?}");
}

#[test]
fn top_through_a_pipe_prints_one_snapshot_per_interval() {
    let (pool, children) = three_idle_children();
    let mut top = Command::new(forkpool_bin())
        .args(["top", "--interval", "200ms", "--control"])
        .arg(&pool.control)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let guard = KillOnDrop(top.id() as i32);
    let mut lines = BufReader::new(top.stdout.take().unwrap()).lines();
    let mut snapshots = Vec::new();
    let mut current = String::new();
    // Reading blocks until top writes, so bound it by count: three
    // snapshots of ~8 lines each, never more than 200 lines.
    for line in lines.by_ref().take(200) {
        let line = line.unwrap();
        if line.is_empty() {
            snapshots.push(std::mem::take(&mut current));
            if snapshots.len() == 3 {
                break;
            }
        } else {
            current += &line;
            current.push('\n');
        }
    }
    drop(guard);
    let _ = top.wait();
    assert_eq!(snapshots.len(), 3, "{snapshots:?}");
    for s in &snapshots {
        assert!(shows_children(s, &children), "{s}");
    }
}

#[test]
fn top_without_a_pool_says_how_to_point_it_at_one() {
    let out = Command::new(forkpool_bin())
        .args(["top", "--once", "--control", "/nonexistent/forkpool.sock"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--control PATH"), "{err}");
}
