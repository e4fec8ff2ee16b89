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

    /// Whether a child in this state serves: ready and not leaving (the
    /// children the dispatch width counts).
    pub fn serves(self) -> bool {
        matches!(
            self,
            SlotState::Idle | SlotState::Ordered | SlotState::Partial | SlotState::Busy
        )
    }
}

/// What can happen to the child in a slot: its reports, and what the
/// supervisor does to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotEvent {
    /// It said `Ready`.
    Ready,
    /// It never reports (`none` dispatch): counted busy from its start.
    AssumeBusy,
    /// The supervisor handed it a connection.
    Connection,
    /// The supervisor ordered it to accept.
    OrderAccept,
    /// It said `Busy`: it accepted a connection itself.
    Busy,
    /// It said `Missed`: woken or ordered, it found no connection.
    Missed,
    /// It said `Idle`: its connection is over.
    Idle,
    /// It said `Next`: its connection is over and it took the next itself.
    Next,
    /// The supervisor told it to quit.
    Retire,
    /// The supervisor sent SIGKILL.
    Kill,
}

impl SlotEvent {
    /// Every event, in a fixed order.
    #[cfg(test)]
    pub const ALL: [SlotEvent; 10] = [
        SlotEvent::Ready,
        SlotEvent::AssumeBusy,
        SlotEvent::Connection,
        SlotEvent::OrderAccept,
        SlotEvent::Busy,
        SlotEvent::Missed,
        SlotEvent::Idle,
        SlotEvent::Next,
        SlotEvent::Retire,
        SlotEvent::Kill,
    ];

    /// The name used in a refused move's message.
    pub fn name(self) -> &'static str {
        match self {
            SlotEvent::Ready => "ready",
            SlotEvent::AssumeBusy => "assume busy",
            SlotEvent::Connection => "connection",
            SlotEvent::OrderAccept => "accept order",
            SlotEvent::Busy => "busy",
            SlotEvent::Missed => "missed",
            SlotEvent::Idle => "idle",
            SlotEvent::Next => "next",
            SlotEvent::Retire => "retire",
            SlotEvent::Kill => "kill",
        }
    }
}

impl SlotState {
    /// Every state, in a fixed order.
    #[cfg(test)]
    pub const ALL: [SlotState; 7] = [
        SlotState::Starting,
        SlotState::Idle,
        SlotState::Ordered,
        SlotState::Partial,
        SlotState::Busy,
        SlotState::Retiring,
        SlotState::Killed,
    ];

    /// The whole transition table, in one place (s6-supervise's
    /// `state x event` table): the state `event` moves a child in `self`
    /// to, or `None` when the move is illegal. Reports that cross a
    /// supervisor's decision (a `Busy` after a `Quit` was sent) leave a
    /// leaving child as it is. A many-connection child's serving states
    /// follow its load, not this table (`Scoreboard::report_load`).
    pub fn after(self, event: SlotEvent) -> Option<SlotState> {
        use SlotState::*;
        let leaving = matches!(self, Retiring | Killed);
        match event {
            SlotEvent::Ready => match self {
                Starting => Some(Idle),
                _ if leaving => Some(self),
                _ => None,
            },
            SlotEvent::AssumeBusy => (self == Starting).then_some(Busy),
            SlotEvent::Connection => (self == Idle).then_some(Busy),
            SlotEvent::OrderAccept => (self == Idle).then_some(Ordered),
            SlotEvent::Busy => match self {
                Ordered | Idle => Some(Busy),
                _ if leaving => Some(self),
                _ => None,
            },
            SlotEvent::Missed => match self {
                Ordered | Idle => Some(Idle),
                _ if leaving => Some(self),
                _ => None,
            },
            SlotEvent::Idle => match self {
                Busy => Some(Idle),
                _ if leaving => Some(self),
                _ => None,
            },
            SlotEvent::Next => (self == Busy || leaving).then_some(self),
            SlotEvent::Retire => (self != Killed).then_some(Retiring),
            SlotEvent::Kill => Some(Killed),
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
    /// Connections a worker thread was running a step of at its last
    /// report (at most `open`).
    pub running: u32,
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
            running: 0,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The table written out whole, row by state, column by event in
    /// `SlotEvent::ALL` order (`-`: refused). A change to a rule shows
    /// here as a changed letter.
    const TABLE: [(SlotState, &str); 7] = [
        //                   R A C O B M I N Q K
        (SlotState::Starting, "I B - - - - - - R K"),
        (SlotState::Idle, "- - B O B I - - R K"),
        (SlotState::Ordered, "- - - - B I - - R K"),
        (SlotState::Partial, "- - - - - - - - R K"),
        (SlotState::Busy, "- - - - - - I B R K"),
        (SlotState::Retiring, "R - - - R R R R R K"),
        (SlotState::Killed, "K - - - K K K K - K"),
    ];

    #[test]
    fn the_transition_table_is_exactly_as_written() {
        for (state, row) in TABLE {
            let cells: Vec<&str> = row.split(' ').collect();
            for (event, cell) in SlotEvent::ALL.iter().zip(cells) {
                let got = state.after(*event).map_or('-', SlotState::letter);
                assert_eq!(
                    got.to_string(),
                    cell,
                    "{} on {}",
                    event.name(),
                    state.name()
                );
            }
        }
    }

    #[test]
    fn the_table_keeps_its_promises() {
        for state in SlotState::ALL {
            // SIGKILL is always possible and final.
            assert_eq!(state.after(SlotEvent::Kill), Some(SlotState::Killed));
            for event in SlotEvent::ALL {
                let Some(to) = state.after(event) else {
                    continue;
                };
                // A leaving child never comes back to work.
                if matches!(state, SlotState::Retiring | SlotState::Killed) {
                    assert!(
                        matches!(to, SlotState::Retiring | SlotState::Killed),
                        "{} on {}",
                        event.name(),
                        state.name()
                    );
                }
                // Nothing a child reports makes it start again.
                assert_ne!(to, SlotState::Starting);
            }
        }
    }
}
