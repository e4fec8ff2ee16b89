//! `forkpool top`: a live view of a running pool over its control socket.
//!
//! The loop here only fetches and waits for keys; what is drawn is a pure
//! function of the snapshot history and the sort key ([`view::draw`]), and
//! the figures over time come from [`history::History`].

mod history;
mod view;

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use forkpool::observe::listen_queues_of_process;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};

use history::{History, Sample};
use view::SortKey;

pub use view::bytes;

#[cfg(test)]
pub(crate) use history::tests::snapshot as test_snapshot;

/// Options of `forkpool top`.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// The pool's control socket [default: as `forkpool demo` and `run` use].
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Time between refreshes.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// Print one plain-text snapshot and exit.
    #[arg(long)]
    pub once: bool,
}

/// Runs the live view, or plain text when stdout is not a terminal.
pub fn run(args: TopArgs) -> Result<(), String> {
    if args.interval.is_zero() {
        return Err("--interval must be more than 0 (for example --interval 1s)".to_string());
    }
    let control = args
        .control
        .clone()
        .unwrap_or_else(crate::settings::default_control_path);
    let mut history = History::default();
    // The first fetch fails fast and clearly, whatever the mode.
    history.push(sample(&control)?);
    if args.once || !std::io::stdout().is_terminal() {
        return plain_loop(&control, &args, history);
    }
    let mut terminal =
        ratatui::try_init().map_err(|e| format!("cannot set up the terminal: {e}"))?;
    let result = live_loop(&mut terminal, &control, args.interval, history);
    ratatui::restore();
    result
}

/// One snapshot, with the pool's accept queues read from its listeners
/// (its control socket left out).
fn sample(control: &Path) -> Result<Sample, String> {
    let snapshot = crate::status::fetch(control)?;
    let queued = listen_queues_of_process(snapshot.pid as i32)
        .ok()
        .map(|listeners| {
            listeners
                .iter()
                .filter(|l| Path::new(&l.address) != control)
                .map(|l| l.queue.waiting)
                .sum()
        });
    Ok(Sample { snapshot, queued })
}

fn plain_loop(control: &Path, args: &TopArgs, mut history: History) -> Result<(), String> {
    let mut out = std::io::stdout();
    loop {
        let text = view::plain(&history, SortKey::Slot);
        // A closed pipe (`forkpool top | head`) ends the loop quietly.
        if writeln!(out, "{text}").and_then(|_| out.flush()).is_err() || args.once {
            return Ok(());
        }
        std::thread::sleep(args.interval);
        history.push(sample(control)?);
    }
}

fn live_loop(
    terminal: &mut ratatui::DefaultTerminal,
    control: &Path,
    interval: Duration,
    mut history: History,
) -> Result<(), String> {
    let mut key = SortKey::Slot;
    let mut error: Option<String> = None;
    let mut next = Instant::now() + interval;
    loop {
        terminal
            .draw(|frame| {
                view::draw(frame, &history, key);
                if let Some(e) = &error {
                    let area = frame.area();
                    let line = ratatui::layout::Rect { height: 1, ..area };
                    frame.render_widget(ratatui::widgets::Paragraph::new(e.as_str()), line);
                }
            })
            .map_err(|e| format!("drawing: {e}"))?;
        let wait = next.saturating_duration_since(Instant::now());
        if event::poll(wait).map_err(|e| format!("reading keys: {e}"))? {
            if let Event::Key(k) = event::read().map_err(|e| format!("reading keys: {e}"))? {
                if k.kind != KeyEventKind::Press {
                    continue;
                }
                match k.code {
                    KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                    KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => {
                        return Ok(())
                    }
                    KeyCode::Char(c) => key = SortKey::from_key(c).unwrap_or(key),
                    _ => {}
                }
            }
            continue;
        }
        next = Instant::now() + interval;
        // A pool that went away (or restarts) is shown as such; top waits
        // for it rather than exiting, and q still quits.
        match sample(control) {
            Ok(s) => {
                history.push(s);
                error = None;
            }
            Err(e) => error = Some(e),
        }
    }
}
