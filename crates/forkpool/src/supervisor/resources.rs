//! The supervisor's view of its children's resources and its listeners'
//! queues: sampled from `/proc` and `sock_diag` on a timer in the loop,
//! plus what only the supervisor knows (the peer of a connection it
//! handed off, how long each connection kept its child busy).
//!
//! One sampling round reads `/proc/PID/stat` and `/proc/PID/smaps_rollup`
//! of each child (reads of kernel text that never wait on the child, a
//! tenth to a quarter of a millisecond each), a few children per turn of
//! the loop, then does one `sock_diag` dump per listener.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use tracing::debug;

use super::Supervisor;
use crate::observe::{listen_queue, CpuSampler, ProcessSample};
use crate::scoreboard::SlotState;
use crate::status::{QueueStatus, SlotStatus};

/// How often children and listeners are sampled.
pub(crate) const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// Children sampled in one turn of the loop: one sample costs about a
/// tenth to a quarter of a millisecond (more for a child with a large
/// address space), so a large pool is sampled a few children at a time.
const CHILDREN_PER_TURN: usize = 8;
/// The pause between two groups of children in one sampling round.
const BETWEEN_CHUNKS: Duration = Duration::from_millis(10);

/// The last figures of one child.
#[derive(Debug, Clone, Default)]
pub(crate) struct ChildFigures {
    pid: i32,
    sample: Option<ProcessSample>,
    cpu_percent: Option<f64>,
    /// The client of the connection the supervisor handed it last, while
    /// it serves that connection: the address `accept` returned, put into
    /// words only when status or a capture asks.
    peer: Option<socket2::SockAddr>,
    /// The last slow-request capture, as logged.
    pub last_capture: Option<String>,
}

/// Sampled figures and the service-time histogram.
#[derive(Debug)]
pub(crate) struct Resources {
    cpu: CpuSampler,
    children: Vec<ChildFigures>,
    queues: Vec<Option<QueueStatus>>,
    next_sample: Option<Instant>,
    /// The next slot to sample in the current round (0: a new round).
    cursor: usize,
    /// When the current round began.
    round_started: Instant,
    /// Seconds each connection kept its child busy (busy to idle).
    pub service_time: Histogram,
}

impl Default for Resources {
    fn default() -> Self {
        Resources {
            cpu: CpuSampler::default(),
            children: Vec::new(),
            queues: Vec::new(),
            next_sample: None,
            cursor: 0,
            round_started: Instant::now(),
            service_time: service_time_histogram(),
        }
    }
}

/// Buckets from 1 ms to about 2 minutes.
fn service_time_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 18))
}

impl Resources {
    /// The figures of the child in `slot`, if it is (still) `pid`.
    pub fn of(&self, slot: usize, pid: i32) -> Option<&ChildFigures> {
        self.children.get(slot).filter(|f| f.pid == pid)
    }

    fn entry(&mut self, slot: usize, pid: i32) -> &mut ChildFigures {
        if self.children.len() <= slot {
            self.children.resize_with(slot + 1, ChildFigures::default);
        }
        let f = &mut self.children[slot];
        if f.pid != pid {
            *f = ChildFigures {
                pid,
                ..ChildFigures::default()
            };
        }
        f
    }

    /// The child's unshared memory (USS) at its last sample.
    pub fn uss(&self, slot: usize, pid: i32) -> Option<u64> {
        self.of(slot, pid)?.sample.map(|s| s.memory.uss_bytes)
    }

    /// When the next sampling tick is due.
    pub fn due(&self) -> Option<Instant> {
        self.next_sample
    }

    /// Reads `pid` now and records it for `slot`.
    pub fn sample_child(&mut self, slot: usize, pid: i32, now: Instant) {
        self.sample_uss(slot, pid, now);
    }

    /// Reads `pid` now, records it for `slot` and returns its USS as read
    /// now: `None` when it could not be read (the process is gone, or
    /// `/proc` is hidden), never an older figure.
    pub fn sample_uss(&mut self, slot: usize, pid: i32, now: Instant) -> Option<u64> {
        match self.cpu.sample(pid, now) {
            Ok((sample, percent)) => {
                let f = self.entry(slot, pid);
                f.sample = Some(sample);
                if percent.is_some() {
                    f.cpu_percent = percent;
                }
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

    /// The client of the connection `slot` serves, when known.
    pub fn peer(&self, slot: usize, pid: i32) -> Option<String> {
        self.of(slot, pid)?.peer.as_ref().and_then(peer_name)
    }

    /// Records the peer of a connection handed to `slot` (`None`: it
    /// finished).
    pub fn handed(&mut self, slot: usize, pid: i32, peer: Option<&socket2::SockAddr>) {
        self.entry(slot, pid).peer = peer.cloned();
    }

    /// Records the last capture of `slot`.
    pub fn captured(&mut self, slot: usize, pid: i32, record: String) {
        self.entry(slot, pid).last_capture = Some(record);
    }

    /// Adds the sampled figures to a slot's status.
    pub fn fill(&self, status: &mut SlotStatus) {
        let Some(f) = self.of(status.slot, status.pid) else {
            return;
        };
        if let Some(s) = f.sample {
            status.cpu_seconds = Some(s.cpu_seconds);
            status.rss_bytes = Some(s.memory.rss_bytes);
            status.pss_bytes = Some(s.memory.pss_bytes);
            status.uss_bytes = Some(s.memory.uss_bytes);
        }
        status.cpu_percent = f.cpu_percent;
        if status.busy_for_ms.is_some() {
            status.peer = f.peer.as_ref().and_then(peer_name);
        }
        status.last_capture = f.last_capture.clone();
    }

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
    /// Samples every child and listener once per [`SAMPLE_INTERVAL`];
    /// called once per turn of the loop.
    pub(super) fn sample_resources(&mut self, now: Instant) {
        if self.resources.due().is_some_and(|t| now < t) {
            return;
        }
        let r = &mut self.resources;
        if r.cursor == 0 {
            r.round_started = now;
        }
        let children: Vec<(usize, i32)> = self
            .core
            .board()
            .iter()
            // A slot whose template has not said the pid yet has pid 0.
            .filter(|(_, s)| s.state != SlotState::Killed && s.pid > 0)
            .map(|(slot, s)| (slot, s.pid))
            .collect();
        let from = self.resources.cursor;
        let chunk: Vec<(usize, i32)> = children
            .iter()
            .copied()
            .filter(|&(slot, _)| slot >= from)
            .take(CHILDREN_PER_TURN)
            .collect();
        for &(slot, pid) in &chunk {
            self.resources.sample_child(slot, pid, now);
        }
        let rest = children
            .iter()
            .any(|&(slot, _)| chunk.last().is_some_and(|&(last, _)| slot > last));
        if rest {
            // The next few children in a moment, so the loop is never held
            // for more than a handful of reads.
            self.resources.cursor = chunk.last().map_or(0, |&(last, _)| last + 1);
            self.resources.next_sample = Some(now + BETWEEN_CHUNKS);
            return;
        }
        self.resources.cursor = 0;
        self.resources.next_sample = Some(self.resources.round_started + SAMPLE_INTERVAL);
        let alive: Vec<i32> = children.iter().map(|c| c.1).collect();
        self.resources.cpu.retain(&alive);
        for i in 0..self.listeners.len() {
            let l = &self.listeners[i].listener;
            match listen_queue(l.as_fd()) {
                Ok(q) => {
                    let name = l.local_addr().to_string();
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
    fn figures_of_a_replaced_child_are_not_shown_for_its_successor() {
        let mut r = Resources::default();
        let me = std::process::id() as i32;
        r.sample_child(0, me, Instant::now());
        let addr: std::net::SocketAddr = "127.0.0.1:5".parse().unwrap();
        r.handed(0, me, Some(&addr.into()));
        let mut s = status(0, me, true);
        r.fill(&mut s);
        assert!(s.rss_bytes.unwrap() > 0);
        assert_eq!(s.peer.as_deref(), Some("127.0.0.1:5"));
        let mut other = status(0, me + 1, true);
        r.fill(&mut other);
        assert_eq!(other.rss_bytes, None);
        assert_eq!(other.peer, None);
    }

    #[test]
    fn peer_is_shown_only_while_busy() {
        let mut r = Resources::default();
        let addr: std::net::SocketAddr = "[::1]:80".parse().unwrap();
        r.handed(1, 7, Some(&addr.into()));
        let mut idle = status(1, 7, false);
        r.fill(&mut idle);
        assert_eq!(idle.peer, None);
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
