//! What the supervisor counts over its life.

use serde::Serialize;

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
    /// Children that exited without being asked (crash, signal, panic).
    pub died: u64,
    /// Times a child was woken or ordered to accept and found nothing.
    pub futile_wakeups: u64,
    /// Times the pool wanted to grow but was at `max_children`.
    pub saturated: u64,
}
