//! The report as text tables, one per benchmark.

use std::fmt::Write;

use super::loadgen::ErrorCounts;
use super::preload::{self, PreloadReport};
use super::procstat::Memory;
use super::scaleup::ScaleupReport;
use super::simulate::{self, Point};
use super::Report;

/// A titled table: the first column left-aligned, the rest right-aligned.
pub struct Table {
    title: String,
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table.
    pub fn new(title: &str, headers: &[&str]) -> Table {
        Table {
            title: title.to_string(),
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (as many cells as headers).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as text, ending with a blank line.
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.len()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let parts: Vec<String> = cells
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(i, (cell, &w))| match i {
                    0 => format!("{cell:<w$}"),
                    _ => format!("{cell:>w$}"),
                })
                .collect();
            parts.join("  ").trim_end().to_string()
        };
        let mut out = format!("{}\n{}\n", self.title, line(&self.headers));
        let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
        out += &(rule.join("  ") + "\n");
        for row in &self.rows {
            out += &(line(row) + "\n");
        }
        out + "\n"
    }
}

/// Every section of `report` that has something in it.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    if !report.throughput.is_empty() {
        let mut t = Table::new(
            "Throughput and latency",
            &[
                "server", "conn", "c", "req/s", "p50 ms", "p99 ms", "p99.9 ms", "errors",
            ],
        );
        for r in &report.throughput {
            t.row(vec![
                r.server.clone(),
                r.connection.name().to_string(),
                r.concurrency.to_string(),
                format!("{:.0}", r.rps),
                ms(r.latency.p50_ms),
                ms(r.latency.p99_ms),
                ms(r.latency.p999_ms),
                errors(&r.errors),
            ]);
        }
        out += &t.render();
    }
    if !report.wakeups.is_empty() {
        let mut t = Table::new(
            "Wake-ups (close per request, 16 children)",
            &[
                "dispatch",
                "c",
                "req/s",
                "ctx sw/req",
                "CPU s/10k req",
                "futile/req",
                "errors",
            ],
        );
        for r in &report.wakeups {
            t.row(vec![
                r.dispatch.to_string(),
                r.concurrency.to_string(),
                format!("{:.0}", r.rps),
                format!("{:.2}", r.ctxt_switches_per_request),
                format!("{:.3}", r.cpu_seconds_per_10k),
                format!("{:.3}", r.futile_wakeups_per_request),
                r.errors.to_string(),
            ]);
        }
        out += &t.render();
    }
    if let Some(scaleup) = &report.scaleup {
        out += &render_scaleup(scaleup);
    }
    if !report.memory.is_empty() {
        let mut t = Table::new(
            "Memory per idle child (MiB)",
            &[
                "preload",
                "children",
                "child USS",
                "child PSS",
                "child RSS",
                "parent USS",
                "parent PSS",
                "parent RSS",
            ],
        );
        for r in &report.memory {
            let m = |m: &Memory| [mib(m.uss_kib), mib(m.pss_kib), mib(m.rss_kib)];
            let mut cells = vec![format!("{} MiB", r.preload_mib), r.children.to_string()];
            cells.extend(m(&r.child_mean));
            cells.extend(m(&r.parent));
            t.row(cells);
        }
        out += &t.render();
    }
    if let Some(preload) = &report.preload {
        out += &render_preload(preload);
    }
    if !report.sessions.is_empty() {
        out += &crate::bench_sessions::render(&report.sessions);
        out += "\n";
    }
    for note in &report.notes {
        writeln!(out, "note: {note}").expect("writing to a String");
    }
    out
}

fn render_scaleup(report: &ScaleupReport) -> String {
    let mut out = String::new();
    let title = format!(
        "Scale-up: 2 resting children, {} clients step in with {} ms requests",
        report.clients, report.work_ms
    );
    if !report.runs.is_empty() {
        let mut t = Table::new(
            &title,
            &[
                "dispatch",
                "64 forked ms",
                "64 serving ms",
                "slots seen",
                "1st s req",
                "1st s p50 ms",
                "1st s p99 ms",
                "errors",
            ],
        );
        for r in &report.runs {
            let maybe = |v: Option<u64>| v.map_or("never".to_string(), |v| v.to_string());
            t.row(vec![
                r.dispatch.to_string(),
                maybe(r.forked_all_ms),
                maybe(r.serving_all_ms),
                r.slots_seen.to_string(),
                r.first_second_requests.to_string(),
                ms(r.first_second.p50_ms),
                ms(r.first_second.p99_ms),
                errors(&r.errors),
            ]);
        }
        out += &t.render();
    }
    let sim = &report.simulated;
    let mut curves: Vec<(String, &[Point])> = vec![
        ("sim every event".to_string(), &sim.every_event),
        ("sim once a second".to_string(), &sim.every_second),
    ];
    curves.extend(
        report
            .runs
            .iter()
            .map(|r| (r.dispatch.to_string(), &r.children[..])),
    );
    let mut headers = vec!["t ms"];
    headers.extend(curves.iter().map(|(name, _)| name.as_str()));
    let mut t = Table::new(
        &format!(
            "Children over time (simulated: scaling::decide, spawn-to-ready {} ms; others measured from /proc)",
            sim.spawn_delay_ms
        ),
        &headers,
    );
    for at in [
        0, 10, 20, 50, 100, 200, 500, 1000, 2000, 3000, 4000, 5000, 6000,
    ] {
        let mut cells = vec![at.to_string()];
        cells.extend(
            curves
                .iter()
                .map(|(_, curve)| simulate::children_at(curve, at).to_string()),
        );
        t.row(cells);
    }
    let mut reach = vec!["to 64".to_string()];
    reach.extend(curves.iter().map(|(_, curve)| {
        simulate::time_to(curve, report.clients)
            .map_or("never".to_string(), |ms| format!("{ms} ms"))
    }));
    t.row(reach);
    out + &t.render()
}

fn ms(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
}

fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

/// `0`, or the total with its kinds: `12 (timeout 10, reset 2)`.
fn errors(e: &ErrorCounts) -> String {
    let kinds = [
        ("refused", e.refused),
        ("reset", e.reset),
        ("timeout", e.timeout),
        ("stalled", e.stalled),
        ("status", e.bad_status),
        ("malformed", e.malformed),
        ("other", e.other),
    ];
    let parts: Vec<String> = kinds
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(kind, n)| format!("{kind} {n}"))
        .collect();
    match parts.is_empty() {
        true => "0".to_string(),
        false => format!("{} ({})", e.total(), parts.join(", ")),
    }
}

fn render_preload(report: &PreloadReport) -> String {
    let mut out = String::new();
    if !report.runs.is_empty() {
        let mut t = Table::new(
            &format!(
                "Preload: heavy Python app (100 MiB table, 0.5 s import); one start at a time, \
                 then {} x {} ms requests at once on 2 resting workers; memory at the burst's size (MiB)",
                preload::BURST,
                preload::BURST_WORK_MS
            ),
            &[
                "forkpool",
                "start p50 ms",
                "start p99 ms",
                "burst start p50",
                "burst start p99",
                "burst done ms",
                "errors",
                "workers",
                "worker USS",
                "worker PSS",
                "template PSS",
                "pool PSS",
            ],
        );
        for r in &report.runs {
            let m = &r.memory;
            t.row(vec![
                if r.preload { "run --preload" } else { "run" }.to_string(),
                ms(r.start_one.p50_ms),
                ms(r.start_one.p99_ms),
                ms(r.start_in_burst.p50_ms),
                ms(r.start_in_burst.p99_ms),
                r.burst_ms.to_string(),
                r.burst_errors.to_string(),
                m.workers.to_string(),
                mib(m.worker_mean.uss_kib),
                mib(m.worker_mean.pss_kib),
                m.template.map_or("-".to_string(), |t| mib(t.pss_kib)),
                mib(m.total_pss_kib),
            ]);
        }
        out += &t.render();
    }
    if let Some(ms) = report.rust_demo_burst_ms {
        writeln!(
            out,
            "The Rust demo (forked from its parent), same burst: {ms} ms\n"
        )
        .expect("writing to a String");
    }
    if let Some(r) = &report.refork {
        let mut t = Table::new(
            &format!(
                "Refork: {} workers of an app that caches 50 MiB over its first requests, \
                 --refork-after {} ({} requests, {} failed; MiB)",
                r.workers, r.refork_after, r.requests, r.errors
            ),
            &[
                "pool",
                "template pid",
                "worker USS",
                "worker PSS",
                "template PSS",
                "pool PSS",
            ],
        );
        for (name, pid, m) in [
            ("warm, before", r.template_pids.0, &r.before),
            ("after refork", r.template_pids.1, &r.after),
        ] {
            t.row(vec![
                name.to_string(),
                pid.to_string(),
                mib(m.worker_mean.uss_kib),
                mib(m.worker_mean.pss_kib),
                m.template.map_or("-".to_string(), |t| mib(t.pss_kib)),
                mib(m.total_pss_kib),
            ]);
        }
        out += &t.render();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up() {
        let mut t = Table::new("T", &["name", "n"]);
        t.row(vec!["a".to_string(), "1000".to_string()]);
        t.row(vec!["longer".to_string(), "2".to_string()]);
        assert_eq!(
            t.render(),
            "T\nname       n\n------  ----\na       1000\nlonger     2\n\n"
        );
    }

    #[test]
    fn error_cells() {
        assert_eq!(errors(&ErrorCounts::default()), "0");
        let e = ErrorCounts {
            timeout: 10,
            reset: 2,
            ..ErrorCounts::default()
        };
        assert_eq!(errors(&e), "12 (reset 2, timeout 10)");
    }
}
