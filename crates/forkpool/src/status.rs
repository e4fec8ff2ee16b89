//! What the supervisor knows about itself: totals counted over its life,
//! and the snapshot it serves on its control socket.

use serde::{Deserialize, Serialize};

/// Why the supervisor killed a child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReason {
    /// An idle child did not answer a ping within `ping_timeout`.
    PingTimeout,
    /// A new child did not report ready in time.
    StartTimeout,
    /// A child told to quit did not exit within `shutdown_timeout`, and had
    /// not closed its back-channel either.
    StopTimeout,
    /// A child closed its back-channel (it was leaving, asked or not) but
    /// was still running `exit_timeout` later: slow to exit, most often
    /// tearing down a large heap, not misbehaving.
    ExitTimeout,
    /// A child stayed busy on one connection longer than `busy_timeout`.
    BusyTimeout,
    /// A child sent a malformed or out-of-order message.
    Misbehaved,
    /// The back-channel to the child failed: a read or send on it failed,
    /// or the child sent an empty datagram and kept its channel open.
    ChannelFailed,
    /// An immediate stop (SIGQUIT, or a second SIGINT).
    ImmediateStop,
}

impl KillReason {
    /// The name used in status output and metric labels.
    pub fn key(self) -> &'static str {
        match self {
            KillReason::PingTimeout => "ping_timeout",
            KillReason::StartTimeout => "start_timeout",
            KillReason::StopTimeout => "stop_timeout",
            KillReason::ExitTimeout => "exit_timeout",
            KillReason::BusyTimeout => "busy_timeout",
            KillReason::Misbehaved => "misbehaved",
            KillReason::ChannelFailed => "channel_failed",
            KillReason::ImmediateStop => "immediate_stop",
        }
    }

    /// Every reason, in a fixed order.
    pub const ALL: [KillReason; 8] = [
        KillReason::PingTimeout,
        KillReason::StartTimeout,
        KillReason::StopTimeout,
        KillReason::ExitTimeout,
        KillReason::BusyTimeout,
        KillReason::Misbehaved,
        KillReason::ChannelFailed,
        KillReason::ImmediateStop,
    ];
}

/// Kills counted by reason. Missing fields read as 0 (a supervisor from
/// before a reason was added).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct KilledBy {
    /// See [`KillReason::PingTimeout`].
    pub ping_timeout: u64,
    /// See [`KillReason::StartTimeout`].
    pub start_timeout: u64,
    /// See [`KillReason::StopTimeout`].
    pub stop_timeout: u64,
    /// See [`KillReason::ExitTimeout`].
    pub exit_timeout: u64,
    /// See [`KillReason::BusyTimeout`].
    pub busy_timeout: u64,
    /// See [`KillReason::Misbehaved`].
    pub misbehaved: u64,
    /// See [`KillReason::ChannelFailed`].
    pub channel_failed: u64,
    /// See [`KillReason::ImmediateStop`].
    pub immediate_stop: u64,
}

impl KilledBy {
    /// Counts one kill.
    pub fn add(&mut self, reason: KillReason) {
        *self.slot(reason) += 1;
    }

    /// The count for one reason.
    pub fn get(&self, reason: KillReason) -> u64 {
        let mut copy = *self;
        *copy.slot(reason)
    }

    fn slot(&mut self, reason: KillReason) -> &mut u64 {
        match reason {
            KillReason::PingTimeout => &mut self.ping_timeout,
            KillReason::StartTimeout => &mut self.start_timeout,
            KillReason::StopTimeout => &mut self.stop_timeout,
            KillReason::ExitTimeout => &mut self.exit_timeout,
            KillReason::BusyTimeout => &mut self.busy_timeout,
            KillReason::Misbehaved => &mut self.misbehaved,
            KillReason::ChannelFailed => &mut self.channel_failed,
            KillReason::ImmediateStop => &mut self.immediate_stop,
        }
    }
}

/// Running totals since the supervisor started. Missing fields read as 0,
/// so a reader of an older or newer supervisor's totals line still works.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Totals {
    /// Connections dispatched to children (accepted by the supervisor in
    /// `handoff`, accepted by a child in `order`, `shared` and `herd`).
    pub accepted: u64,
    /// Of `accepted`, the connections a child took from the backlog itself
    /// as it finished the one before (`handoff`, the `Next` report).
    pub taken_next: u64,
    /// Children started.
    pub spawned: u64,
    /// Children told to quit: surplus idle, recycled, or shutdown.
    pub retired: u64,
    /// Children the supervisor killed (hung, misbehaving, too slow to stop).
    pub killed: u64,
    /// The same kills, by reason.
    pub killed_by: KilledBy,
    /// Children that exited without being asked (crash, signal, panic).
    pub died: u64,
    /// Times a child was woken or ordered to accept and found nothing.
    pub futile_wakeups: u64,
    /// Times the pool wanted to grow but was at `max_children`.
    pub saturated: u64,
    /// Milliseconds spent at `max_children` with no idle child.
    pub saturated_ms: u64,
    /// Times the pool was short of spare children but held, because its
    /// busy children already waited for the CPUs, or were being measured
    /// (`hold_when_cpu_bound`). Waiting for the workers already starting
    /// (no more at once than CPUs) is not counted.
    pub cpu_bound: u64,
    /// `kernel` dispatch: times the dispatch width narrowed (the busy
    /// children waited for the CPUs) and widened (connections waited and
    /// the CPUs had room, or the pool was quiet for a second).
    #[serde(default)]
    pub width_narrowed: u64,
    /// See `width_narrowed`.
    #[serde(default)]
    pub width_widened: u64,
    /// Reloads (SIGHUP) applied.
    pub reloads: u64,
    /// Children recycled because their unshared memory (USS) went over
    /// `max_child_memory`.
    pub recycled_memory: u64,
    /// Children recycled because they reached `max_child_lifetime`.
    pub recycled_lifetime: u64,
    /// Slow-request captures taken (`slow_threshold`, and before a
    /// `busy_timeout` kill).
    pub slow_captures: u64,
    /// Slow-request captures skipped by the rate limit.
    pub slow_captures_suppressed: u64,
    /// Reloads abandoned because the new generation failed at start-up
    /// (the generation before kept serving).
    pub reload_failures: u64,
    /// Reloads (SIGHUP) refused before anything changed: the configuration
    /// could not be read or did not validate, or changed what a reload
    /// cannot change.
    pub reloads_refused: u64,
    /// Binary upgrades (SIGUSR2) that failed: the new supervisor could
    /// not start, stopped or was not ready in time, and this one kept
    /// serving.
    pub upgrade_failures: u64,
    /// Times a reaped worker had left processes running in its process
    /// group, which were then killed.
    pub strays_killed: u64,
    /// Stderr lines of workers over their budget, counted and not logged.
    pub stderr_lines_dropped: u64,
    /// Templates (`--preload`) started again after one ended unasked or
    /// failed to start.
    #[serde(default)]
    pub template_restarts: u64,
    /// Reforks started (`--refork-after`): times the lowest slot's worker
    /// was made the template.
    #[serde(default)]
    pub reforks: u64,
    /// Kernel dispatch: connections that never reached the child the
    /// kernel picked for them (reset before accept, a handshake never
    /// finished, silent under `TCP_DEFER_ACCEPT`): reservations taken over
    /// by a later connection after their hold, or given back idle after
    /// `defer_accept` + 1 s.
    #[serde(default)]
    pub abandoned: u64,
    /// Workers a template said it forked that vanished without the
    /// supervisor ever reaping them (reaped behind its back, or never
    /// its child): their slots were freed after a deadline.
    #[serde(default)]
    pub lost: u64,
    /// Templates killed (with their process group) for breaking the
    /// protocol, lying about a worker, missing a deadline or flooding
    /// stderr.
    #[serde(default)]
    pub templates_killed: u64,
}

/// One slot as the control socket reports it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SlotStatus {
    /// The slot number.
    pub slot: usize,
    /// The child's process id.
    pub pid: i32,
    /// `starting`, `idle`, `ordered`, `busy`, `retiring` or `killed`.
    pub state: String,
    /// The generation the child was started in.
    pub generation: u32,
    /// Connections it has finished serving.
    pub served: u64,
    /// How long it has been busy on its current connection, if busy.
    pub busy_for_ms: Option<u64>,
    /// How long since it last sent anything.
    pub last_heard_ms: u64,
    /// A many-connection child's load: connections held (including those
    /// on their way to it) and its capacity.
    #[serde(default)]
    pub sessions: Option<(u32, u32)>,
    /// A many-connection child: how many of its connections a worker
    /// thread was running a step of at its last report (within 100 ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions_running: Option<u32>,
    /// CPU time (user + system) the child has used, in seconds, from
    /// `/proc/PID/stat`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<f64>,
    /// CPU use over the last sampling interval, in percent of one core.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_percent: Option<f64>,
    /// Resident set size in bytes (counts pages shared with the
    /// supervisor and siblings in full).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// Proportional set size in bytes (shared pages split among users).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pss_bytes: Option<u64>,
    /// Unique set size in bytes (pages only this child has).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uss_bytes: Option<u64>,
    /// The address of the client it is serving, if busy and known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// The last slow-request capture of this child, as logged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_capture: Option<String>,
    /// How long the child took from its fork (with `--preload`, from the
    /// fork order) to saying `Ready`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_after_ms: Option<u64>,
    /// `kernel` dispatch: how connections reach it, as its first message
    /// chose: `board` (it said `K`: it keeps its record on the scoreboard
    /// and the kernel queues connections on its own socket) or `handoff`
    /// (it said `R`: the supervisor hands it each connection). Absent in
    /// other modes and before it said either.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// One listener's accept queue, sampled by the supervisor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueStatus {
    /// The listener's address (`IP:PORT` or a Unix socket path).
    pub listener: String,
    /// Connections waiting to be accepted at the last sample.
    pub waiting: u32,
    /// The most seen waiting since the supervisor started.
    pub max_waiting: u32,
    /// The accept queue's capacity (the `listen(2)` backlog).
    pub backlog: u32,
}

/// Everything `forkpool status` shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The supervisor's process id.
    pub pid: u32,
    /// The current generation (1, plus one per reload): while a reload
    /// rolls, the one rolling in.
    pub generation: u32,
    /// The generation known to serve: the one before while a reload rolls,
    /// and still that one after the reload failed.
    #[serde(default)]
    pub serving_generation: u32,
    /// Whether the pool has been ready: `min_children` (at least one) were
    /// up at once, as logged by `pool ready` and told to systemd
    /// (`READY=1`). Once true it stays true.
    #[serde(default)]
    pub ready: bool,
    /// While the pool has not been ready: why, in words (absent once it
    /// has been).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_ready_because: Option<String>,
    /// The dispatch mode in force.
    pub dispatch: String,
    /// Why `kernel` dispatch was asked for and `handoff` runs instead
    /// (no privilege, an old kernel, a Unix listener, exec'd workers, ...);
    /// absent when nothing fell back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatch_fallback: Option<String>,
    /// `kernel` dispatch: how many of the serving children new
    /// connections go to while the busy ones wait for the CPUs (the
    /// lowest ones; the others stay idle, kept for a load that sleeps);
    /// absent while every child takes connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatch_width: Option<u32>,
    /// How long the supervisor has run.
    pub uptime_ms: u64,
    /// The scoreboard line, one letter per slot.
    pub line: String,
    /// Children starting, idle, busy and leaving.
    pub starting: u32,
    /// See `starting`.
    pub idle: u32,
    /// See `starting`.
    pub busy: u32,
    /// See `starting`.
    pub leaving: u32,
    /// `min_children`, `max_children`, `min_spare`, `max_spare` in force.
    pub bounds: [u32; 4],
    /// Every occupied slot.
    pub slots: Vec<SlotStatus>,
    /// Totals since start.
    pub totals: Totals,
    /// Each listener's accept queue, once sampled.
    #[serde(default)]
    pub queues: Vec<QueueStatus>,
    /// The templates workers are forked from (`--preload`): one, or two
    /// while a reload rolls; empty without `--preload`.
    #[serde(default)]
    pub templates: Vec<TemplateStatus>,
}

/// One template (`--preload`) as the control socket reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TemplateStatus {
    /// Its process id.
    pub pid: i32,
    /// The generation whose workers it forks.
    pub generation: u32,
    /// `starting` (loading), `ready`, `quitting` (told to), `exiting`
    /// (closed its channel unasked) or `killed`.
    pub state: String,
    /// How long ago it was started.
    pub uptime_ms: u64,
    /// How long it took from start to `Ready`, once ready.
    pub ready_after_ms: Option<u64>,
    /// Workers it has forked.
    pub forks: u64,
    /// Fork orders it has not answered yet.
    pub pending_forks: u32,
    /// Its resident memory, when `/proc` can be read.
    pub rss_bytes: Option<u64>,
    /// Its proportional share of memory (shared pages split among the
    /// processes that map them, so the workers forked from it share
    /// most of it).
    pub pss_bytes: Option<u64>,
    /// Its unshared memory.
    pub uss_bytes: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_its_own_key_and_counter() {
        let mut by = KilledBy::default();
        for (i, reason) in KillReason::ALL.into_iter().enumerate() {
            for _ in 0..=i {
                by.add(reason);
            }
        }
        for (i, reason) in KillReason::ALL.into_iter().enumerate() {
            assert_eq!(by.get(reason), i as u64 + 1, "{}", reason.key());
        }
        let json = serde_json::to_value(by).unwrap();
        for reason in KillReason::ALL {
            assert_eq!(json[reason.key()], by.get(reason), "{}", reason.key());
        }
        assert_eq!(json["exit_timeout"], by.get(KillReason::ExitTimeout));
    }

    #[test]
    fn kills_from_a_supervisor_without_exit_timeout_still_read() {
        let old = r#"{"ping_timeout":1,"start_timeout":0,"stop_timeout":2,"busy_timeout":0,
                      "misbehaved":0,"channel_failed":3,"immediate_stop":0}"#;
        let by: KilledBy = serde_json::from_str(old).unwrap();
        assert_eq!(by.exit_timeout, 0);
        assert_eq!(by.channel_failed, 3);
    }
}
