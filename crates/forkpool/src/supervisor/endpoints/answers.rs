//! What the endpoints answer, made from what the loop published at the
//! end of its last turn ([`Published`]) and the sampled `/proc` figures
//! beside it: the status snapshot, the metrics exposition, the agent
//! check's line and the `/live` and `/ready` answers. Reading a child's
//! memory or a busy child's client is done here, when someone asks, never
//! on a connection's path.

use std::time::Instant;

use prometheus_client::metrics::histogram::Histogram;

use super::super::published::Published;
use super::super::resources::Resources;
use crate::fleet::agent::AgentReply;
use crate::fleet::health::{self, ReadyPolicy};
use crate::fleet::request::{self, Method};
use crate::scoreboard::SlotState;
use crate::status::{SlotStatus, Snapshot, TemplateStatus};

/// What an answer is made from.
pub(crate) struct Sources<'a> {
    /// The pool as of the end of the last turn.
    pub view: &'a Published,
    /// The children's and listeners' sampled figures.
    pub resources: &'a Resources,
    /// How long dispatch took, readiness to send.
    pub latency: &'a Histogram,
}

/// The snapshot `forkpool status` shows, as of `now`.
pub(crate) fn snapshot(src: &Sources<'_>, now: Instant) -> Snapshot {
    let view = &src.view.core;
    // Kernel dispatch: a child's client is asked of the kernel, once per
    // snapshot (the supervisor never held the connection).
    let established =
        (src.view.kernel && view.counts.busy > 0).then(crate::observe::peers::established_by_inode);
    let slots = view
        .slots
        .iter()
        .map(|(slot, s)| {
            let mut status = SlotStatus {
                slot: *slot,
                pid: s.pid,
                state: s.state.name().to_string(),
                generation: s.generation,
                served: s.served,
                busy_for_ms: matches!(s.state, SlotState::Busy | SlotState::Ordered)
                    .then(|| now.saturating_duration_since(s.since).as_millis() as u64),
                last_heard_ms: now.saturating_duration_since(s.last_heard).as_millis() as u64,
                sessions: s.load.map(|l| (l.load(), l.capacity)),
                sessions_running: s.load.map(|l| l.running),
                ready_after_ms: s.link.ready_after.map(|d| d.as_millis() as u64),
                path: s.link.path.map(|p| p.name().to_string()),
                ..SlotStatus::default()
            };
            if let Some(Some(figures)) = src.view.figures.get(*slot) {
                figures.fill(&mut status);
            }
            if let (None, Some(_), Some(established)) =
                (&status.peer, status.busy_for_ms, &established)
            {
                status.peer = crate::observe::peers::peers_of(s.pid, established)
                    .first()
                    .map(|a| a.to_string());
            }
            status
        })
        .collect();
    let mut totals = view.totals;
    if let Some(since) = view.saturated_since {
        totals.saturated_ms += now.saturating_duration_since(since).as_millis() as u64;
    }
    Snapshot {
        pid: src.view.pid,
        generation: view.generation,
        serving_generation: view.serving_generation,
        ready: src.view.ready,
        not_ready_because: (!src.view.ready).then(|| not_ready_because(view)),
        dispatch: view.dispatch.to_string(),
        dispatch_fallback: src.view.dispatch_fallback.clone(),
        dispatch_width: view.dispatch_width,
        uptime_ms: now.saturating_duration_since(src.view.started).as_millis() as u64,
        line: view.line(),
        starting: view.counts.starting,
        idle: view.counts.idle,
        busy: view.counts.busy,
        leaving: view.counts.leaving,
        bounds: view.bounds,
        slots,
        totals,
        queues: src.resources.queues(),
        templates: template_statuses(src, now),
    }
}

/// Why a pool that has not been ready is not, for status.
fn not_ready_because(view: &crate::core::CoreView) -> String {
    let wanted = view.bounds[0].max(1);
    match view.templates_unready {
        Some(0) => "waiting for the --preload template to say it is ready".into(),
        Some(ended) => format!(
            "the --preload template has not said it is ready: {ended} ended before it did; \
             the pool stops after {} (a program that cannot be a template: run it without \
             --preload)",
            crate::policy::backoff::TEMPLATE_TRIES
        ),
        None => format!(
            "{} of the {wanted} workers min_children asks for have said they are ready",
            view.counts.idle + view.counts.busy
        ),
    }
}

/// Each template as `forkpool status` shows it, with its memory read now.
fn template_statuses(src: &Sources<'_>, now: Instant) -> Vec<TemplateStatus> {
    src.view
        .core
        .templates
        .iter()
        .map(|t| {
            let memory = crate::observe::procfs::sample_process(t.pid)
                .ok()
                .map(|s| s.memory);
            TemplateStatus {
                pid: t.pid,
                generation: t.generation,
                state: t.state.to_string(),
                uptime_ms: now.saturating_duration_since(t.born).as_millis() as u64,
                ready_after_ms: t.ready_after.map(|d| d.as_millis() as u64),
                forks: t.forks,
                pending_forks: t.pending,
                rss_bytes: memory.map(|m| m.rss_bytes),
                pss_bytes: memory.map(|m| m.pss_bytes),
                uss_bytes: memory.map(|m| m.uss_bytes),
            }
        })
        .collect()
}

/// The control socket's answer: the snapshot as one line of JSON.
pub(crate) fn status_json(src: &Sources<'_>, now: Instant) -> Vec<u8> {
    let mut json = serde_json::to_vec(&snapshot(src, now)).unwrap_or_default();
    json.push(b'\n');
    json
}

/// The metrics endpoint's answer: the text exposition, as HTTP.
pub(crate) fn metrics_response(src: &Sources<'_>, now: Instant) -> Vec<u8> {
    let body = crate::metrics::render(
        &snapshot(src, now),
        src.latency,
        &src.resources.service_time,
    );
    let mut out = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

/// The agent check's line for a connection accepted now.
pub(crate) fn agent_line(src: &Sources<'_>) -> Vec<u8> {
    AgentReply::for_capacity(&src.view.capacity)
        .line()
        .into_bytes()
}

/// The answer to a request on the metrics address when it is for `/live`
/// or `/ready` (or is not an HTTP request at all); `None` for any other
/// path, and for a head cut short, which the metrics serve as before.
pub(crate) fn health_response(src: &Sources<'_>, head: &[u8]) -> Option<Vec<u8>> {
    let parsed = request::parse_head(head).transpose()?;
    let method = parsed.as_ref().map_or(Method::Get, |h| h.method);
    let policy = ReadyPolicy {
        unready_when_saturated: src.view.core.ready_unless_saturated,
    };
    let answer = health::answer(&parsed, &src.view.capacity, policy)?;
    Some(answer.to_http(method))
}
