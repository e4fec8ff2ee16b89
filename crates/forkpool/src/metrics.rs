//! The Prometheus text exposition of a [`Snapshot`], rendered on each scrape.
//!
//! Counters are the supervisor's totals, so rendering from a snapshot gives
//! the same numbers `forkpool status` shows. Only the dispatch-latency
//! histogram lives between scrapes (it is fed on the dispatch path).

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::status::{KillReason, Snapshot};

type Labels = Vec<(&'static str, &'static str)>;

/// A histogram of dispatch latency in seconds: from the supervisor waking
/// for a connection to the connection (or the order to accept it) reaching
/// a child. Buckets from 1 µs to about 1 s.
pub fn dispatch_latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-6, 4.0, 11))
}

fn counter(registry: &mut Registry, name: &str, help: &str, value: u64) {
    let c = Counter::<u64>::default();
    c.inc_by(value);
    registry.register(name, help, c);
}

/// Renders every metric. `service_time` is the histogram of how long each
/// connection kept its child busy.
///
/// One function on purpose: it is a flat list of metrics, each registered
/// once with its help text, and the list is easier to check read whole.
pub fn render(
    snapshot: &Snapshot,
    dispatch_latency: &Histogram,
    service_time: &Histogram,
) -> String {
    let mut registry = Registry::with_prefix("forkpool");
    let t = &snapshot.totals;

    let children = Family::<Labels, Gauge>::default();
    for (state, n) in [
        ("starting", snapshot.starting),
        ("idle", snapshot.idle),
        ("busy", snapshot.busy),
        ("leaving", snapshot.leaving),
    ] {
        children
            .get_or_create(&vec![("state", state)])
            .set(i64::from(n));
    }
    registry.register("children", "Children by state", children);

    let dispatch = Family::<Vec<(&'static str, String)>, Gauge>::default();
    dispatch
        .get_or_create(&vec![
            ("mode", snapshot.dispatch.clone()),
            (
                "fallback",
                snapshot.dispatch_fallback.clone().unwrap_or_default(),
            ),
        ])
        .set(1);
    registry.register(
        "dispatch",
        "The dispatch mode running (always 1); fallback says why kernel dispatch could not run, if it could not",
        dispatch,
    );
    if let Some(width) = snapshot.dispatch_width {
        let gauge = Gauge::<i64>::default();
        gauge.set(i64::from(width));
        registry.register(
            "dispatch_width",
            "Kernel dispatch: how many children new connections go to while the busy ones wait for the CPUs (absent: all of them)",
            gauge,
        );
    }
    counter(
        &mut registry,
        "width_narrowed",
        "Kernel dispatch: times the dispatch width narrowed because the busy children waited for the CPUs",
        t.width_narrowed,
    );
    counter(
        &mut registry,
        "width_widened",
        "Kernel dispatch: times the dispatch width widened for waiting connections, or opened after a quiet second",
        t.width_widened,
    );
    counter(
        &mut registry,
        "abandoned",
        "Kernel dispatch: connections that never reached the child picked for them (reset before accept, handshake never finished, silent under TCP_DEFER_ACCEPT)",
        t.abandoned,
    );

    let kills = Family::<Labels, Counter>::default();
    for reason in KillReason::ALL {
        kills
            .get_or_create(&vec![("reason", reason.key())])
            .inc_by(t.killed_by.get(reason));
    }
    registry.register(
        "kills",
        "Children killed by the supervisor, by reason",
        kills,
    );

    counter(
        &mut registry,
        "connections_accepted",
        "Connections dispatched to children",
        t.accepted,
    );
    counter(
        &mut registry,
        "connections_taken_next",
        "Connections a finishing child took from the backlog itself",
        t.taken_next,
    );
    counter(&mut registry, "spawns", "Children started", t.spawned);
    counter(
        &mut registry,
        "retirements",
        "Children told to quit",
        t.retired,
    );
    counter(
        &mut registry,
        "deaths",
        "Children that exited without being asked",
        t.died,
    );
    counter(
        &mut registry,
        "futile_wakeups",
        "Children woken or ordered to accept that found no connection",
        t.futile_wakeups,
    );
    counter(
        &mut registry,
        "backlog_full_events",
        "Times the pool was short of idle children at max_children",
        t.saturated,
    );
    counter(
        &mut registry,
        "cpu_bound_holds",
        "Times the pool held instead of growing because its busy children already waited for the CPUs",
        t.cpu_bound,
    );
    counter(&mut registry, "reloads", "Reloads applied", t.reloads);
    counter(
        &mut registry,
        "template_restarts",
        "Templates (--preload) started again after one ended unasked or failed to start",
        t.template_restarts,
    );
    counter(
        &mut registry,
        "workers_lost",
        "Workers a template said it forked that vanished without being reaped by the supervisor",
        t.lost,
    );
    counter(
        &mut registry,
        "templates_killed",
        "Templates killed for breaking the protocol, lying about a worker, missing a deadline or flooding stderr",
        t.templates_killed,
    );
    counter(
        &mut registry,
        "reforks",
        "Times the lowest slot's worker was made the template (--refork-after)",
        t.reforks,
    );
    counter(
        &mut registry,
        "reload_failures",
        "Reloads abandoned because the new generation failed at start-up",
        t.reload_failures,
    );
    counter(
        &mut registry,
        "reloads_refused",
        "Reloads refused before anything changed (unreadable or invalid configuration)",
        t.reloads_refused,
    );
    counter(
        &mut registry,
        "upgrade_failures",
        "Binary upgrades (USR2) that failed; the old supervisor kept serving",
        t.upgrade_failures,
    );
    let saturated = Counter::<f64, std::sync::atomic::AtomicU64>::default();
    saturated.inc_by(t.saturated_ms as f64 / 1000.0);
    registry.register(
        "saturated_seconds",
        "Time spent at max_children with no idle child",
        saturated,
    );
    let generation = Gauge::<i64>::default();
    generation.set(i64::from(snapshot.generation));
    registry.register("generation", "Current pool generation", generation);
    let serving = Gauge::<i64>::default();
    serving.set(i64::from(snapshot.serving_generation));
    registry.register(
        "serving_generation",
        "The generation known to serve (the one before while a reload rolls or after it failed)",
        serving,
    );
    registry.register(
        "dispatch_latency_seconds",
        "From the supervisor waking for a connection to a child getting it",
        dispatch_latency.clone(),
    );

    registry.register(
        "service_time_seconds",
        "How long each connection kept its child busy (busy to idle)",
        service_time.clone(),
    );
    counter(
        &mut registry,
        "recycled_memory",
        "Children recycled for unshared memory above max_child_memory",
        t.recycled_memory,
    );
    counter(
        &mut registry,
        "recycled_lifetime",
        "Children recycled for being older than max_child_lifetime",
        t.recycled_lifetime,
    );
    counter(
        &mut registry,
        "slow_captures",
        "Slow-request captures taken",
        t.slow_captures,
    );
    counter(
        &mut registry,
        "slow_captures_suppressed",
        "Slow-request captures skipped by the rate limit",
        t.slow_captures_suppressed,
    );
    register_pool_figures(&mut registry, snapshot);

    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut text, &registry);
    text
}

/// Pool-wide memory and CPU from the children's sampled figures, and each
/// listener's accept queue.
fn register_pool_figures(registry: &mut Registry, snapshot: &Snapshot) {
    let slots = &snapshot.slots;
    let pss: u64 = slots.iter().filter_map(|s| s.pss_bytes).sum();
    let largest_uss = slots.iter().filter_map(|s| s.uss_bytes).max().unwrap_or(0);
    let cpu: f64 = slots.iter().filter_map(|s| s.cpu_seconds).sum();
    for (name, help, value) in [
        (
            "children_pss_bytes",
            "Sum of the children's PSS: the pool's real memory footprint",
            pss,
        ),
        (
            "child_uss_bytes_max",
            "The largest unshared memory (USS) of one child",
            largest_uss,
        ),
    ] {
        let g = Gauge::<i64>::default();
        g.set(i64::try_from(value).unwrap_or(i64::MAX));
        registry.register(name, help, g);
    }
    let g = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
    g.set(cpu);
    registry.register(
        "children_cpu_seconds",
        "CPU time (user + system) used by the live children",
        g,
    );
    type QueueLabels = Vec<(&'static str, String)>;
    let waiting = Family::<QueueLabels, Gauge>::default();
    let max_waiting = Family::<QueueLabels, Gauge>::default();
    let backlog = Family::<QueueLabels, Gauge>::default();
    for q in &snapshot.queues {
        let labels = vec![("listener", q.listener.clone())];
        waiting.get_or_create(&labels).set(i64::from(q.waiting));
        max_waiting
            .get_or_create(&labels)
            .set(i64::from(q.max_waiting));
        backlog.get_or_create(&labels).set(i64::from(q.backlog));
    }
    registry.register(
        "listen_queue",
        "Connections waiting in a listener's accept queue",
        waiting,
    );
    registry.register(
        "listen_queue_max",
        "The most connections seen waiting in a listener's accept queue",
        max_waiting,
    );
    registry.register(
        "listen_backlog",
        "A listener's accept queue capacity",
        backlog,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::Totals;

    #[test]
    fn renders_totals_and_states() {
        let mut totals = Totals {
            accepted: 42,
            taken_next: 17,
            spawned: 5,
            ..Totals::default()
        };
        totals.killed_by.add(KillReason::PingTimeout);
        totals.killed_by.add(KillReason::ExitTimeout);
        totals.killed_by.add(KillReason::ExitTimeout);
        let snapshot = Snapshot {
            pid: 1,
            generation: 3,
            serving_generation: 2,
            ready: true,
            not_ready_because: None,
            dispatch: "handoff".into(),
            dispatch_fallback: None,
            dispatch_width: None,
            uptime_ms: 10,
            line: "IB".into(),
            starting: 0,
            idle: 1,
            busy: 1,
            leaving: 0,
            bounds: [1, 4, 1, 2],
            slots: vec![],
            totals,
            queues: vec![],
            templates: vec![],
        };
        let h = dispatch_latency_histogram();
        h.observe(0.00002);
        let text = render(&snapshot, &h, &dispatch_latency_histogram());
        assert!(
            text.contains("forkpool_connections_accepted_total 42"),
            "{text}"
        );
        assert!(text.contains("forkpool_connections_taken_next_total 17"));
        assert!(text.contains("forkpool_spawns_total 5"));
        assert!(text.contains("forkpool_children{state=\"idle\"} 1"));
        assert!(text.contains("forkpool_kills_total{reason=\"ping_timeout\"} 1"));
        // A slow exit has its own label, apart from misbehaviour.
        assert!(text.contains("forkpool_kills_total{reason=\"exit_timeout\"} 2"));
        assert!(text.contains("forkpool_kills_total{reason=\"channel_failed\"} 0"));
        assert!(text.contains("forkpool_kills_total{reason=\"misbehaved\"} 0"));
        assert!(text.contains("forkpool_generation 3"));
        assert!(text.contains("forkpool_serving_generation 2"));
        assert!(text.contains("forkpool_dispatch_latency_seconds_count 1"));
        assert!(
            text.contains("forkpool_dispatch{mode=\"handoff\",fallback=\"\"} 1"),
            "{text}"
        );
        let fell_back = Snapshot {
            dispatch_fallback: Some("no CAP_BPF".into()),
            dispatch_width: None,
            ..snapshot
        };
        let text = render(&fell_back, &h, &dispatch_latency_histogram());
        assert!(
            text.contains("forkpool_dispatch{mode=\"handoff\",fallback=\"no CAP_BPF\"} 1"),
            "{text}"
        );
    }
}
