//! What the child in one slot is doing, and how full a many-connection
//! child is: the data of a slot, which the scoreboard keeps for every
//! child and the rules in `policy/` read. Apart from the table itself,
//! so that the rules need not import the table that applies them.

/// What the child in a slot is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    /// Forked, has not yet said `Ready`.
    Starting,
    /// Waiting for work.
    Idle,
    /// Ordered to accept (`order` dispatch); has not yet said `Busy` or `Missed`.
    Ordered,
    /// A many-connection child holding some connections, with room for more.
    /// (Such a child is `Idle` while it holds none and `Busy` when full.)
    Partial,
    /// Serving a connection.
    Busy,
    /// Told to quit; finishing its connection, if any, then exiting.
    Retiring,
    /// Sent SIGKILL; waiting to be reaped.
    Killed,
}

impl SlotState {
    /// One letter for the scoreboard line (`SIIBB`), spamd and Apache style.
    pub fn letter(self) -> char {
        match self {
            SlotState::Starting => 'S',
            SlotState::Idle => 'I',
            SlotState::Ordered => 'O',
            SlotState::Partial => 'P',
            SlotState::Busy => 'B',
            SlotState::Retiring => 'R',
            SlotState::Killed => 'K',
        }
    }

    /// The lowercase name used in logs and status output.
    pub fn name(self) -> &'static str {
        match self {
            SlotState::Starting => "starting",
            SlotState::Idle => "idle",
            SlotState::Ordered => "ordered",
            SlotState::Partial => "partly busy",
            SlotState::Busy => "busy",
            SlotState::Retiring => "retiring",
            SlotState::Killed => "killed",
        }
    }
}

/// How full a many-connection child is, as the supervisor counts it.
///
/// The child's reports (`open`, `received`) can cross connections still on
/// their way to it, so its load is what its last report counted plus what
/// was handed to it since: `open + (handed - received)`. Both counts wrap
/// at 2^32; see `docs/protocol.md` for why this never undercounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLoad {
    /// The most connections the child takes: the lower of what it reported
    /// and what the pool was configured with.
    pub capacity: u32,
    /// Connections open at its last report.
    pub open: u32,
    /// Connections handed to it so far (wrapping).
    pub handed: u32,
    /// Connections it had received at its last report (wrapping).
    pub received: u32,
    /// Every connection it has received, counted without wrapping.
    pub received_total: u64,
}

impl SessionLoad {
    /// A child that has been handed nothing yet.
    pub fn new(capacity: u32) -> Self {
        SessionLoad {
            capacity,
            open: 0,
            handed: 0,
            received: 0,
            received_total: 0,
        }
    }

    /// Connections handed to the child that its last report did not count.
    pub fn in_flight(&self) -> u32 {
        self.handed.wrapping_sub(self.received)
    }

    /// Connections the child holds or is about to hold.
    pub fn load(&self) -> u32 {
        self.open.saturating_add(self.in_flight())
    }

    /// How many more connections it can be handed.
    pub fn free(&self) -> u32 {
        self.capacity.saturating_sub(self.load())
    }

    /// The state its load puts a serving child in.
    pub(crate) fn state(&self) -> SlotState {
        if self.load() == 0 {
            SlotState::Idle
        } else if self.free() == 0 {
            SlotState::Busy
        } else {
            SlotState::Partial
        }
    }
}
