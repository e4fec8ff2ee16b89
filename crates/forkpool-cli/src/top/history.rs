//! The last minute of snapshots `forkpool top` has taken, and the figures
//! derived from consecutive ones (request rate, queue and pool size over
//! time).

use std::collections::VecDeque;

use forkpool::status::Snapshot;

/// How far back the charts reach, in the supervisor's uptime milliseconds.
pub const WINDOW_MS: u64 = 60_000;

/// One refresh: the supervisor's snapshot and the connections waiting in
/// its listeners' accept queues (`None` when they could not be read).
#[derive(Debug, Clone)]
pub struct Sample {
    /// What the control socket said.
    pub snapshot: Snapshot,
    /// Connections waiting to be accepted, all listeners together.
    pub queued: Option<u32>,
}

/// Samples of one supervisor over the last [`WINDOW_MS`], oldest first.
#[derive(Debug, Default)]
pub struct History {
    samples: VecDeque<Sample>,
}

impl History {
    /// Adds a sample and drops those older than the window. A different
    /// supervisor (pid) or one that restarted (uptime went back) starts a
    /// new history: its figures do not continue the old ones.
    pub fn push(&mut self, sample: Sample) {
        if let Some(last) = self.samples.back() {
            if last.snapshot.pid != sample.snapshot.pid
                || last.snapshot.uptime_ms > sample.snapshot.uptime_ms
            {
                self.samples.clear();
            }
        }
        let now = sample.snapshot.uptime_ms;
        self.samples.push_back(sample);
        while self
            .samples
            .front()
            .is_some_and(|s| s.snapshot.uptime_ms + WINDOW_MS < now)
        {
            self.samples.pop_front();
        }
    }

    /// The newest sample.
    pub fn latest(&self) -> Option<&Sample> {
        self.samples.back()
    }

    /// Connections accepted per second between the last two samples.
    pub fn request_rate(&self) -> Option<f64> {
        let n = self.samples.len();
        if n < 2 {
            return None;
        }
        let (a, b) = (&self.samples[n - 2].snapshot, &self.samples[n - 1].snapshot);
        let ms = b.uptime_ms.checked_sub(a.uptime_ms).filter(|ms| *ms > 0)?;
        let accepted = b.totals.accepted.saturating_sub(a.totals.accepted);
        Some(accepted as f64 * 1000.0 / ms as f64)
    }

    /// Queue length per sample, oldest first (unknown counts as 0).
    pub fn queue_series(&self) -> Vec<u64> {
        self.samples
            .iter()
            .map(|s| u64::from(s.queued.unwrap_or(0)))
            .collect()
    }

    /// Children per sample, oldest first.
    pub fn pool_size_series(&self) -> Vec<u64> {
        self.samples
            .iter()
            .map(|s| s.snapshot.slots.len() as u64)
            .collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A snapshot of a pool with `children` idle children, `uptime_ms`
    /// old, having accepted `accepted` connections.
    pub(crate) fn snapshot(uptime_ms: u64, children: usize, accepted: u64) -> Snapshot {
        // From JSON, as the control socket sends it: the sampled per-child
        // fields are absent until a test sets them.
        let slots: Vec<_> = (0..children)
            .map(|slot| {
                serde_json::json!({
                    "slot": slot, "pid": 1000 + slot, "state": "idle", "generation": 1,
                    "served": 0, "busy_for_ms": null, "last_heard_ms": 5,
                })
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "pid": 100, "generation": 1, "dispatch": "handoff", "uptime_ms": uptime_ms,
            "line": "_".repeat(children), "starting": 0, "idle": children, "busy": 0,
            "leaving": 0, "bounds": [1, 8, 1, 4], "slots": slots,
            "totals": { "accepted": accepted },
        }))
        .unwrap()
    }

    fn sample(uptime_ms: u64, children: usize, accepted: u64, queued: u32) -> Sample {
        Sample {
            snapshot: snapshot(uptime_ms, children, accepted),
            queued: Some(queued),
        }
    }

    #[test]
    fn rate_comes_from_the_last_two_totals() {
        let mut h = History::default();
        h.push(sample(1_000, 2, 10, 0));
        assert_eq!(h.request_rate(), None);
        h.push(sample(3_000, 2, 110, 0));
        assert_eq!(h.request_rate(), Some(50.0));
    }

    #[test]
    fn window_keeps_one_minute() {
        let mut h = History::default();
        for i in 0..100u64 {
            h.push(sample(i * 1_000, (i % 5) as usize, 0, i as u32));
        }
        let queue = h.queue_series();
        assert_eq!(queue.len(), 61);
        assert_eq!(queue[0], 39);
        assert_eq!(*queue.last().unwrap(), 99);
        assert_eq!(h.pool_size_series().last(), Some(&4));
    }

    #[test]
    fn a_restarted_supervisor_starts_a_new_history() {
        let mut h = History::default();
        h.push(sample(50_000, 2, 1000, 0));
        h.push(sample(1_000, 2, 3, 0));
        assert_eq!(h.queue_series().len(), 1);
        assert_eq!(h.request_rate(), None);
    }
}
