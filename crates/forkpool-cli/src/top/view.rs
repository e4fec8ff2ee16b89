//! What `forkpool top` draws: a pure function of the history and the sort
//! key, so tests render it on ratatui's `TestBackend`; and the same rows
//! as plain text for when stdout is not a terminal.

use std::cmp::Reverse;

use forkpool::status::{SlotStatus, Snapshot};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Paragraph, Row, Sparkline, Table};
use ratatui::Frame;

use super::history::History;

/// How the children's table is ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortKey {
    /// By slot number (the dispatch order).
    Slot,
    /// Busiest CPU first.
    Cpu,
    /// Largest memory (USS, else RSS) first.
    Memory,
    /// Longest busy first.
    Busy,
}

impl SortKey {
    /// The key a keypress selects, if any.
    pub fn from_key(c: char) -> Option<SortKey> {
        match c {
            's' => Some(SortKey::Slot),
            'c' => Some(SortKey::Cpu),
            'm' => Some(SortKey::Memory),
            'b' => Some(SortKey::Busy),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            SortKey::Slot => "slot",
            SortKey::Cpu => "cpu",
            SortKey::Memory => "memory",
            SortKey::Busy => "busy",
        }
    }
}

/// Column titles of the children's table.
pub const COLUMNS: [&str; 9] = [
    "SLOT", "PID", "STATE", "CPU%", "CPU", "RSS", "USS", "BUSY", "PEER",
];

/// `1536` -> `1.5K`: bytes in binary units, short enough for a column.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "K", "M", "G", "T"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n}B")
    } else {
        format!("{value:.1}{}", UNITS[unit])
    }
}

fn or_dash<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map_or_else(|| "-".to_string(), f)
}

/// One child's cells, in [`COLUMNS`] order.
pub fn cells(s: &SlotStatus) -> [String; 9] {
    [
        s.slot.to_string(),
        s.pid.to_string(),
        s.state.clone(),
        or_dash(s.cpu_percent, |p| format!("{p:.1}")),
        or_dash(s.cpu_seconds, |c| format!("{c:.2}s")),
        or_dash(s.rss_bytes, bytes),
        or_dash(s.uss_bytes, bytes),
        or_dash(s.busy_for_ms, |ms| format!("{ms}ms")),
        s.peer.clone().unwrap_or_else(|| "-".to_string()),
    ]
}

/// The children in the order `key` asks for (ties by slot).
pub fn sorted(snapshot: &Snapshot, key: SortKey) -> Vec<&SlotStatus> {
    let mut slots: Vec<&SlotStatus> = snapshot.slots.iter().collect();
    slots.sort_by_key(|s| s.slot);
    match key {
        SortKey::Slot => {}
        SortKey::Cpu => slots.sort_by(|a, b| {
            let cpu = |s: &SlotStatus| s.cpu_percent.unwrap_or(-1.0);
            cpu(b).total_cmp(&cpu(a))
        }),
        SortKey::Memory => slots.sort_by_key(|s| Reverse(s.uss_bytes.or(s.rss_bytes).unwrap_or(0))),
        SortKey::Busy => slots.sort_by_key(|s| Reverse(s.busy_for_ms.unwrap_or(0))),
    }
    slots
}

/// The lines above the table: who, how many, how fast, how queued.
pub fn summary(history: &History, key: SortKey) -> Vec<String> {
    let Some(latest) = history.latest() else {
        return vec!["waiting for the first snapshot...".to_string()];
    };
    let s = &latest.snapshot;
    let [min_c, max_c, _, _] = s.bounds;
    vec![
        format!(
            "forkpool pid {}  generation {}  dispatch {}  up {}s",
            s.pid,
            s.generation,
            s.dispatch,
            s.uptime_ms / 1000
        ),
        format!(
            "children {} ({min_c}..{max_c}): {} idle, {} busy, {} starting, {} leaving  \
             requests/s {}  queued {}",
            s.slots.len(),
            s.idle,
            s.busy,
            s.starting,
            s.leaving,
            or_dash(history.request_rate(), |r| format!("{r:.1}")),
            or_dash(latest.queued, |q| q.to_string()),
        ),
        format!("scoreboard [{}]", s.line),
        format!(
            "sort: {} (keys: s slot, c cpu, m memory, b busy; q quits)",
            key.name()
        ),
    ]
}

/// The whole screen.
pub fn draw(frame: &mut Frame, history: &History, key: SortKey) {
    let [top, table, charts] = Layout::vertical([
        Constraint::Length(4),
        Constraint::Min(3),
        Constraint::Length(4),
    ])
    .areas(frame.area());
    let lines: Vec<Line> = summary(history, key).into_iter().map(Line::from).collect();
    frame.render_widget(Paragraph::new(lines), top);

    let rows: Vec<Row> = history
        .latest()
        .map(|l| sorted(&l.snapshot, key))
        .unwrap_or_default()
        .into_iter()
        .map(|s| Row::new(cells(s)))
        .collect();
    let widths = [4, 8, 9, 6, 9, 8, 8, 9, 22].map(Constraint::Length);
    frame.render_widget(
        Table::new(rows, widths)
            .header(Row::new(COLUMNS).style(Style::new().add_modifier(Modifier::BOLD))),
        table,
    );

    let [queue, size] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(charts);
    chart(frame, queue, "listen queue", &history.queue_series());
    chart(frame, size, "children", &history.pool_size_series());
}

/// A one-minute sparkline titled with its name and its maximum.
fn chart(frame: &mut Frame, area: ratatui::layout::Rect, name: &str, data: &[u64]) {
    let max = data.iter().max().unwrap_or(&0);
    frame.render_widget(
        Sparkline::default()
            .block(Block::bordered().title(format!("{name}, last minute (max {max})")))
            .data(data),
        area,
    );
}

/// The same screen as plain text, for a pipe or a log: the summary lines
/// and the table, columns padded.
pub fn plain(history: &History, key: SortKey) -> String {
    let mut out = summary(history, key)
        .into_iter()
        .filter(|l| !l.starts_with("sort:"))
        .map(|l| format!("{l}\n"))
        .collect::<String>();
    let rows: Vec<[String; 9]> = history
        .latest()
        .map(|l| sorted(&l.snapshot, key).into_iter().map(cells).collect())
        .unwrap_or_default();
    let header = COLUMNS.map(str::to_string);
    let mut widths = [0usize; 9];
    for row in std::iter::once(&header).chain(&rows) {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    for row in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out += line.join(" ").trim_end();
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::history::{tests::snapshot, Sample};
    use super::*;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    fn history() -> History {
        let mut h = History::default();
        let mut first = snapshot(1_000, 3, 0);
        first.slots.truncate(2);
        h.push(Sample {
            snapshot: first,
            queued: Some(7),
        });
        let mut s = snapshot(2_000, 3, 40);
        s.slots[1].state = "busy".to_string();
        s.slots[1].busy_for_ms = Some(900);
        s.slots[1].peer = Some("127.0.0.1:5555".to_string());
        s.slots[1].cpu_percent = Some(87.5);
        s.slots[2].uss_bytes = Some(3 << 20);
        s.slots[2].rss_bytes = Some(10 << 20);
        h.push(Sample {
            snapshot: s,
            queued: Some(2),
        });
        h
    }

    fn screen(key: SortKey) -> Vec<String> {
        let mut terminal = Terminal::new(TestBackend::new(100, 20)).unwrap();
        terminal.draw(|f| draw(f, &history(), key)).unwrap();
        let buffer = terminal.backend().buffer();
        (0..buffer.area.height)
            .map(|y| {
                (0..buffer.area.width)
                    .map(|x| buffer[(x, y)].symbol())
                    .collect::<String>()
            })
            .collect()
    }

    /// The slot numbers of the table rows, top to bottom.
    fn row_slots(lines: &[String]) -> Vec<String> {
        lines
            .iter()
            .skip_while(|l| !l.starts_with("SLOT"))
            .skip(1)
            .take_while(|l| {
                l.split_whitespace()
                    .nth(1)
                    .is_some_and(|p| p.starts_with("10"))
            })
            .map(|l| l.split_whitespace().next().unwrap().to_string())
            .collect()
    }

    #[test]
    fn screen_shows_summary_rows_and_charts() {
        let lines = screen(SortKey::Slot);
        let text = lines.join("\n");
        assert!(text.contains("children 3 (1..8)"), "{text}");
        assert!(text.contains("requests/s 40.0"), "{text}");
        assert!(text.contains("queued 2"), "{text}");
        assert!(text.contains("scoreboard [___]"), "{text}");
        assert!(text.contains("127.0.0.1:5555"), "{text}");
        assert!(text.contains("87.5"), "{text}");
        assert!(text.contains("3.0M"), "{text}");
        assert!(text.contains("listen queue, last minute (max 7)"), "{text}");
        assert!(text.contains("children, last minute (max 3)"), "{text}");
        assert_eq!(row_slots(&lines), ["0", "1", "2"]);
    }

    #[test]
    fn sort_keys_reorder_the_rows() {
        assert_eq!(row_slots(&screen(SortKey::Cpu)), ["1", "0", "2"]);
        assert_eq!(row_slots(&screen(SortKey::Memory)), ["2", "0", "1"]);
        assert_eq!(row_slots(&screen(SortKey::Busy)), ["1", "0", "2"]);
        assert!(screen(SortKey::Busy).join("\n").contains("sort: busy"));
    }

    #[test]
    fn plain_text_has_the_same_rows() {
        let text = plain(&history(), SortKey::Memory);
        let rows: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("SLOT"))
            .collect();
        assert_eq!(rows.len(), 4, "{text}");
        assert!(rows[1].starts_with("2 "), "{text}");
        assert!(rows[2].contains("1000"), "{text}");
        assert!(text.contains("requests/s 40.0"), "{text}");
    }

    #[test]
    fn bytes_use_binary_units() {
        assert_eq!(bytes(512), "512B");
        assert_eq!(bytes(1536), "1.5K");
        assert_eq!(bytes(3 << 30), "3.0G");
    }
}
