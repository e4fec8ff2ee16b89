//! The supervisor's view of its children's resources and its listeners'
//! queues: sampled from `/proc` and `sock_diag` on a timer in the loop,
//! plus what only the supervisor knows (the peer of a connection it
//! handed off, how long each connection kept its child busy).
//!
//! One sampling round reads `/proc/PID/stat` and `/proc/PID/smaps_rollup`
//! of each child (reads of kernel text that never wait on the child, a
//! tenth to a quarter of a millisecond each), the few children per turn
//! of the loop the core names (`core/samples.rs`), then does one
//! `sock_diag` dump per listener.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use tracing::debug;

use super::Supervisor;
use crate::observe::procfs::sample_process;
use crate::observe::{listen_queue, ProcessSample};
use crate::status::{QueueStatus, SlotStatus};

/// The last figures of one child, kept in its link (`link.rs`): born
/// with the child, gone with it, so a successor in the slot never shows
/// its predecessor's.
#[derive(Debug, Clone, Default)]
pub(crate) struct ChildFigures {
    sample: Option<ProcessSample>,
    cpu_percent: Option<f64>,
    /// The CPU time at the last sample, for the next one's percentage.
    last_cpu: Option<(Instant, f64)>,
    /// The client of the connection the supervisor handed it last, while
    /// it serves that connection: the address `accept` returned, put into
    /// words only when status or a capture asks.
    pub peer: Option<socket2::SockAddr>,
    /// The last slow-request capture, as logged.
    pub last_capture: Option<String>,
}

impl ChildFigures {
    /// Records a sample of the child taken at `now`.
    fn record(&mut self, sample: ProcessSample, now: Instant) {
        let percent = cpu_percent(self.last_cpu, now, sample.cpu_seconds);
        self.last_cpu = Some((now, sample.cpu_seconds));
        self.sample = Some(sample);
        if percent.is_some() {
            self.cpu_percent = percent;
        }
    }

    /// Its unshared memory (USS) at its last sample.
    pub fn uss(&self) -> Option<u64> {
        self.sample.map(|s| s.memory.uss_bytes)
    }

    /// The client of the connection it serves, when known.
    pub fn peer_name(&self) -> Option<String> {
        self.peer.as_ref().and_then(peer_name)
    }

    /// Adds the figures to the child's status.
    pub fn fill(&self, status: &mut SlotStatus) {
        if let Some(s) = self.sample {
            status.cpu_seconds = Some(s.cpu_seconds);
            status.rss_bytes = Some(s.memory.rss_bytes);
            status.pss_bytes = Some(s.memory.pss_bytes);
            status.uss_bytes = Some(s.memory.uss_bytes);
        }
        status.cpu_percent = self.cpu_percent;
        if status.busy_for_ms.is_some() {
            status.peer = self.peer_name();
        }
        status.last_capture.clone_from(&self.last_capture);
    }
}

/// The CPU% between two samples (100 = one core busy the whole interval):
/// `None` on the first sample, when no time passed, or when the CPU time
/// went backwards.
fn cpu_percent(last: Option<(Instant, f64)>, now: Instant, cpu_seconds: f64) -> Option<f64> {
    let (then, cpu_then) = last?;
    let wall = now.checked_duration_since(then).unwrap_or(Duration::ZERO);
    if wall.is_zero() || cpu_seconds < cpu_then {
        return None;
    }
    Some((cpu_seconds - cpu_then) / wall.as_secs_f64() * 100.0)
}

/// The listeners' sampled queues and the service-time histogram.
#[derive(Debug)]
pub(crate) struct Resources {
    queues: Vec<Option<QueueStatus>>,
    /// Seconds each connection kept its child busy (busy to idle).
    pub service_time: Histogram,
    /// A dispatch pass's connections handed off, with their clients,
    /// written into the children's figures after the pass (its memory
    /// kept for the next).
    pub peers_handed: Vec<(usize, i32, Option<socket2::SockAddr>)>,
}

impl Default for Resources {
    fn default() -> Self {
        Resources {
            queues: Vec::new(),
            service_time: service_time_histogram(),
            peers_handed: Vec::new(),
        }
    }
}

/// Buckets from 1 ms to about 2 minutes.
fn service_time_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 18))
}

impl Resources {
    /// Records a listener's queue at this sample, keeping the maximum.
    fn record_queue(&mut self, i: usize, listener: String, waiting: u32, backlog: u32) {
        if self.queues.len() <= i {
            self.queues.resize(i + 1, None);
        }
        let max_waiting = self.queues[i]
            .as_ref()
            .map_or(waiting, |q| q.max_waiting.max(waiting));
        self.queues[i] = Some(QueueStatus {
            listener,
            waiting,
            max_waiting,
            backlog,
        });
    }

    /// Every listener's queue as last sampled.
    pub fn queues(&self) -> Vec<QueueStatus> {
        self.queues.iter().flatten().cloned().collect()
    }
}

impl Supervisor {
    /// Reads the child in `slot` now and records it in its figures;
    /// returns its USS as read now: `None` when it could not be read (the
    /// process is gone, or `/proc` is hidden), never an older figure.
    pub(super) fn sample_child(&mut self, slot: usize, now: Instant) -> Option<u64> {
        let pid = self.core.board().get(slot)?.pid;
        match sample_process(pid) {
            Ok(sample) => {
                let link = self.core.link_mut(slot)?;
                link.figures.record(sample, now);
                Some(sample.memory.uss_bytes)
            }
            // Gone between the reap and the tick, or /proc hidden: the
            // figures stay as they were and read as missing if never read.
            Err(e) => {
                debug!(slot, pid, "cannot sample child: {e}");
                None
            }
        }
    }

    /// The child `pid` in `slot` was handed a connection from `peer`
    /// (`None`: it finished).
    pub(super) fn handed_peer(&mut self, slot: usize, pid: i32, peer: Option<socket2::SockAddr>) {
        if self.core.board().get(slot).is_some_and(|s| s.pid == pid) {
            if let Some(link) = self.core.link_mut(slot) {
                link.figures.peer = peer;
            }
        }
    }

    /// Samples the children and listeners the core names; called once
    /// per turn of the loop.
    pub(super) fn sample_resources(&mut self, now: Instant) {
        let Some(turn) = self.core.samples_due(now) else {
            return;
        };
        for slot in turn.children {
            self.sample_child(slot, now);
        }
        if !turn.round_done {
            return;
        }
        for (i, l) in self.listeners.iter().enumerate() {
            match listen_queue(l.listener.as_fd()) {
                Ok(q) => {
                    let name = l.listener.local_addr().to_string();
                    self.resources.record_queue(i, name, q.waiting, q.backlog);
                }
                Err(e) => debug!(listener = i, "cannot read the accept queue: {e}"),
            }
        }
        self.check_memory_and_lifetime(now);
    }
}

/// A socket address as people write it: `IP:PORT`, or a Unix path.
fn peer_name(addr: &socket2::SockAddr) -> Option<String> {
    if let Some(ip) = addr.as_socket() {
        return Some(ip.to_string());
    }
    let path = addr.as_pathname()?;
    Some(path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(slot: usize, pid: i32, busy: bool) -> SlotStatus {
        SlotStatus {
            slot,
            pid,
            state: "busy".into(),
            generation: 1,
            busy_for_ms: busy.then_some(5),
            ..SlotStatus::default()
        }
    }

    #[test]
    fn figures_fill_a_status_and_the_peer_only_while_busy() {
        let mut f = ChildFigures::default();
        let me = std::process::id() as i32;
        f.record(sample_process(me).unwrap(), Instant::now());
        let addr: std::net::SocketAddr = "[::1]:80".parse().unwrap();
        f.peer = Some(addr.into());
        let mut busy = status(0, me, true);
        f.fill(&mut busy);
        assert!(busy.rss_bytes.unwrap() > 0);
        assert_eq!(busy.peer.as_deref(), Some("[::1]:80"));
        let mut idle = status(0, me, false);
        f.fill(&mut idle);
        assert_eq!(idle.peer, None);
    }

    #[test]
    fn cpu_percent_needs_two_samples_and_time_going_forward() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(2);
        assert_eq!(cpu_percent(None, t0, 1.0), None);
        assert_eq!(cpu_percent(Some((t0, 1.0)), t0, 2.0), None);
        assert_eq!(cpu_percent(Some((t0, 2.0)), later, 1.0), None);
        assert_eq!(cpu_percent(Some((t0, 1.0)), later, 2.0), Some(50.0));
    }

    #[test]
    fn queue_keeps_its_maximum() {
        let mut r = Resources::default();
        r.record_queue(0, "a".into(), 3, 10);
        r.record_queue(0, "a".into(), 1, 10);
        assert_eq!(
            r.queues(),
            vec![QueueStatus {
                listener: "a".into(),
                waiting: 1,
                max_waiting: 3,
                backlog: 10
            }]
        );
    }
}
