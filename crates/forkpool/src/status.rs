//! What the supervisor counts over its life.

use serde::Serialize;

/// Why the supervisor killed a child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReason {
    /// An idle child did not answer a ping within `ping_timeout`.
    PingTimeout,
    /// A new child did not report ready in time.
    StartTimeout,
    /// A child told to quit did not exit within `shutdown_timeout`.
    StopTimeout,
    /// A child stayed busy on one connection longer than `busy_timeout`.
    BusyTimeout,
    /// A child sent a malformed or out-of-order message.
    Misbehaved,
    /// The back-channel to the child failed.
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
            KillReason::BusyTimeout => "busy_timeout",
            KillReason::Misbehaved => "misbehaved",
            KillReason::ChannelFailed => "channel_failed",
            KillReason::ImmediateStop => "immediate_stop",
        }
    }

    /// Every reason, in a fixed order.
    pub const ALL: [KillReason; 7] = [
        KillReason::PingTimeout,
        KillReason::StartTimeout,
        KillReason::StopTimeout,
        KillReason::BusyTimeout,
        KillReason::Misbehaved,
        KillReason::ChannelFailed,
        KillReason::ImmediateStop,
    ];
}

/// Kills counted by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct KilledBy {
    /// See [`KillReason::PingTimeout`].
    pub ping_timeout: u64,
    /// See [`KillReason::StartTimeout`].
    pub start_timeout: u64,
    /// See [`KillReason::StopTimeout`].
    pub stop_timeout: u64,
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
            KillReason::BusyTimeout => &mut self.busy_timeout,
            KillReason::Misbehaved => &mut self.misbehaved,
            KillReason::ChannelFailed => &mut self.channel_failed,
            KillReason::ImmediateStop => &mut self.immediate_stop,
        }
    }
}

/// Running totals since the supervisor started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    /// Connections dispatched to children (accepted by the supervisor in
    /// `handoff`, accepted by a child in `order`, `shared` and `herd`).
    pub accepted: u64,
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
    /// Reloads (SIGHUP) applied.
    pub reloads: u64,
}
