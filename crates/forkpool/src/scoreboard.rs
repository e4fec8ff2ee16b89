//! The scoreboard: which child sits in which slot and what it is doing.
//!
//! Plain data, no I/O. A slot is a small stable number (Apache's scoreboard
//! index); "the lowest-numbered idle child" means the idle child in the lowest
//! slot, found through a bitset in a few word operations. States are an enum
//! and every transition is a method that refuses an illegal move, so a child
//! that reports something out of order is caught here and killed by the
//! supervisor.
//!
//! A pool whose children each serve many connections at once
//! ([`Scoreboard::host_sessions`]) also keeps each slot's [`SessionLoad`],
//! and a second bitset of the slots with *room* for one more connection:
//! [`Scoreboard::lowest_with_room`] is where the next connection goes. For
//! children that serve one connection at a time, having room is being idle,
//! so the same lookup serves both kinds of pool.
//!
//! The table is the supervisor's one record of its children: each slot also
//! carries the supervisor's side of its child (`L`, the back-channel and
//! what liveness and recycling track), so that a slot and its link are
//! created and freed together and can never disagree.

use std::fmt;
use std::time::Instant;

pub use crate::slot::{SessionLoad, SlotEvent, SlotState};

/// A move the scoreboard refused: the child reported something that cannot
/// follow what it was doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IllegalTransition {
    /// The slot concerned.
    pub slot: usize,
    /// The state the slot was in.
    pub from: SlotState,
    /// The event that was refused.
    pub event: &'static str,
}

impl fmt::Display for IllegalTransition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "slot {}: '{}' is not allowed while {}",
            self.slot,
            self.event,
            self.from.name()
        )
    }
}

impl std::error::Error for IllegalTransition {}

/// A move the supervisor makes itself (retire, kill, hand a connection,
/// order an accept), which its own record says is legal: a refusal means
/// that record is wrong, a bug in forkpool, never something a child did.
/// A debug build (and so every test) panics on it; a release build logs it
/// loudly and the move's other effects (the child is told, signalled or
/// sent the connection) stand.
pub fn own_move<T>(result: Result<T, IllegalTransition>) -> Option<T> {
    match result {
        Ok(t) => Some(t),
        Err(e) => {
            // The simulator, the unit tests and every debug build (the
            // integration tests' supervisor) run the core: a refused move
            // of its own is a failed run there, not a log line.
            #[cfg(any(test, debug_assertions))]
            panic!("internal error: the supervisor's own move was refused: {e}");
            #[cfg(not(any(test, debug_assertions)))]
            {
                tracing::error!(
                    "internal error, please report it: the supervisor's own move was refused: {e}"
                );
                None
            }
        }
    }
}

/// One occupied slot: the child's process, its state, and `link`, the
/// supervisor's side of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot<L = ()> {
    /// The child's process id.
    pub pid: i32,
    /// What the child is doing.
    pub state: SlotState,
    /// The pool generation the child was started in.
    pub generation: u32,
    /// Connections the child has finished serving.
    pub served: u64,
    /// When the child entered its current state.
    pub since: Instant,
    /// When the child last sent any message.
    pub last_heard: Instant,
    /// How full the child is, if it serves many connections at once.
    pub load: Option<SessionLoad>,
    /// Whether the child holds a connection it has not said it finished:
    /// set as it goes busy, kept when it is told to quit (a `Retiring`
    /// child may be finishing one), cleared by its `Idle`.
    pub serving: bool,
    /// The supervisor's side of the child (its channel and bookkeeping).
    pub link: L,
}

impl<L> Slot<L> {
    /// Whether the child is serving a connection: busy, or told to quit
    /// while it was.
    pub fn holds_connection(&self) -> bool {
        self.state == SlotState::Busy || (self.state == SlotState::Retiring && self.serving)
    }
}

use crate::policy::dispatch;

/// A load report the scoreboard refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// The slot's child serves one connection at a time and has no load to
    /// report.
    NotHosting(usize),
    /// A report in a state that allows none (before `Ready`).
    Illegal(IllegalTransition),
    /// The report counts more connections received than were handed.
    TooManyReceived {
        /// The slot concerned.
        slot: usize,
        /// Connections newly received according to the report.
        arrived: u32,
        /// Connections that were on their way.
        in_flight: u32,
    },
    /// The report holds connections the child was never given.
    TooManyOpen {
        /// The slot concerned.
        slot: usize,
        /// Connections open according to the report.
        open: u32,
        /// The most it could hold: open before plus those on their way.
        possible: u64,
    },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::NotHosting(slot) => write!(
                f,
                "slot {slot}: sent a load report, but this pool's children serve one \
                 connection at a time"
            ),
            LoadError::Illegal(e) => write!(f, "{e}"),
            LoadError::TooManyReceived {
                slot,
                arrived,
                in_flight,
            } => write!(
                f,
                "slot {slot}: load report counts {arrived} connections received, \
                 but only {in_flight} were on their way"
            ),
            LoadError::TooManyOpen {
                slot,
                open,
                possible,
            } => write!(
                f,
                "slot {slot}: load report says {open} connections are open, \
                 but it can hold at most {possible}"
            ),
        }
    }
}

impl std::error::Error for LoadError {}

/// Counts of children by state, the input of the scaling policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateCounts {
    /// Children that have not said `Ready` yet.
    pub starting: u32,
    /// Children waiting for work (a many-connection child: holding none).
    pub idle: u32,
    /// Children serving, or ordered to accept (a many-connection child:
    /// holding any connection, full or not).
    pub busy: u32,
    /// Children on their way out (retiring or killed).
    pub leaving: u32,
}

impl StateCounts {
    /// Children that count against `max_children`: all but those leaving.
    pub fn live(&self) -> u32 {
        self.starting + self.idle + self.busy
    }
}

/// Slot table plus an index of idle slots and one of slots with room.
#[derive(Debug)]
pub struct Scoreboard<L = ()> {
    slots: Vec<Option<Slot<L>>>,
    idle_bits: Vec<u64>,
    /// Slots that can take one more connection now.
    room_bits: Vec<u64>,
    /// Free places of serving many-connection children, summed.
    free_places: u64,
    /// Set when children serve many connections: each one's capacity.
    session_capacity: Option<u32>,
    counts: StateCounts,
    changes: u64,
    /// The dispatch width: how many serving children new connections go
    /// to (`None`: all; `policy::width`).
    width: Option<u32>,
    /// The first slot beyond the width (`usize::MAX`: none), kept in step
    /// whenever a child starts or stops serving.
    bound: usize,
}

impl<L> Default for Scoreboard<L> {
    fn default() -> Self {
        Scoreboard {
            slots: Vec::new(),
            idle_bits: Vec::new(),
            room_bits: Vec::new(),
            free_places: 0,
            session_capacity: None,
            counts: StateCounts::default(),
            changes: 0,
            width: None,
            bound: usize::MAX,
        }
    }
}

#[cfg(test)]
impl Scoreboard {
    /// Puts a freshly forked child into the lowest free slot and returns it
    /// (the supervisor picks the slot first, with [`Scoreboard::lowest_free`],
    /// because it forks in between).
    pub fn occupy_lowest_free(&mut self, pid: i32, generation: u32, now: Instant) -> usize {
        let slot = self.lowest_free();
        self.occupy(slot, pid, generation, now, ());
        slot
    }
}

impl<L> Scoreboard<L> {
    /// An empty scoreboard.
    pub fn new() -> Self {
        Self::default()
    }

    /// The lowest free slot number, without occupying it.
    pub fn lowest_free(&self) -> usize {
        self.slots
            .iter()
            .position(Option::is_none)
            .unwrap_or(self.slots.len())
    }

    /// From now on, children placed in slots serve many connections at
    /// once, each at most `capacity`, and report their load.
    pub fn host_sessions(&mut self, capacity: u32) {
        self.session_capacity = Some(capacity);
    }

    /// The capacity of each many-connection child, if children are such.
    pub fn session_capacity(&self) -> Option<u32> {
        self.session_capacity
    }

    /// Puts a freshly forked child, and the supervisor's `link` to it, into
    /// `slot`, which must be free.
    pub fn occupy(&mut self, slot: usize, pid: i32, generation: u32, now: Instant, link: L) {
        if slot >= self.slots.len() {
            self.slots.resize_with(slot + 1, || None);
            self.idle_bits.resize(self.slots.len().div_ceil(64), 0);
            self.room_bits.resize(self.slots.len().div_ceil(64), 0);
        }
        assert!(self.slots[slot].is_none(), "slot {slot} is occupied");
        self.slots[slot] = Some(Slot {
            pid,
            state: SlotState::Starting,
            generation,
            served: 0,
            since: now,
            last_heard: now,
            load: self.session_capacity.map(SessionLoad::new),
            serving: false,
            link,
        });
        self.counts.starting += 1;
    }

    /// Records the pid of the child in `slot`, for a child that a template
    /// forks (`--preload`): its slot is taken when the fork is ordered,
    /// with pid 0, and its pid arrives with the template's answer.
    pub fn set_pid(&mut self, slot: usize, pid: i32) {
        if let Some(s) = self.slots.get_mut(slot).and_then(Option::as_mut) {
            s.pid = pid;
        }
    }

    /// Frees a slot whose child has been reaped; returns what it held.
    pub fn vacate(&mut self, slot: usize) -> Option<Slot<L>> {
        self.slots.get(slot)?.as_ref()?;
        self.unindex_room(slot);
        let old = self.slots[slot].take()?;
        self.uncount(slot, old.state);
        // Trim trailing free slots so the scoreboard line stays short.
        while matches!(self.slots.last(), Some(None)) {
            self.slots.pop();
        }
        self.idle_bits.truncate(self.slots.len().div_ceil(64));
        self.room_bits.truncate(self.slots.len().div_ceil(64));
        if old.state.serves() {
            self.place_bound();
        }
        Some(old)
    }

    /// Sets the dispatch width: new connections go to the lowest `width`
    /// serving children only (`None`: to any).
    pub fn set_width(&mut self, width: Option<u32>) {
        self.width = width;
        self.place_bound();
    }

    /// The dispatch width (`None`: every serving child).
    pub fn width(&self) -> Option<u32> {
        self.width
    }

    /// The first slot beyond the dispatch width, if the width leaves any
    /// serving child out.
    pub fn dispatch_bound(&self) -> Option<usize> {
        (self.bound != usize::MAX).then_some(self.bound)
    }

    /// Puts the bound just past the width's last serving child.
    fn place_bound(&mut self) {
        self.bound = match self.width {
            None => usize::MAX,
            Some(width) => self
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.as_ref().is_some_and(|s| s.state.serves()))
                .nth(width.max(1) as usize - 1)
                .map_or(usize::MAX, |(slot, _)| slot + 1),
        };
    }

    /// The slot, if occupied.
    pub fn get(&self, slot: usize) -> Option<&Slot<L>> {
        self.slots.get(slot)?.as_ref()
    }

    /// The supervisor's link to the child in `slot`, if occupied.
    pub fn link(&self, slot: usize) -> Option<&L> {
        Some(&self.slots.get(slot)?.as_ref()?.link)
    }

    /// The link to the child in `slot`, to change; the slot's state itself
    /// changes only through the transition methods.
    pub fn link_mut(&mut self, slot: usize) -> Option<&mut L> {
        Some(&mut self.slots.get_mut(slot)?.as_mut()?.link)
    }

    /// One past the highest slot in the table: every occupied slot is below.
    pub fn span(&self) -> usize {
        self.slots.len()
    }

    /// The slot holding `pid`, if any.
    pub fn slot_of_pid(&self, pid: i32) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| s.pid == pid))
    }

    /// Occupied slots in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &Slot<L>)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|s| (i, s)))
    }

    /// A number that changes whenever any slot changes state, so a reader
    /// can tell cheaply whether the scoreboard line needs printing again.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// Counts by state.
    pub fn counts(&self) -> StateCounts {
        self.counts
    }

    /// Number of occupied slots, leaving children included.
    pub fn occupied(&self) -> usize {
        self.iter().count()
    }

    /// The lowest-numbered idle slot within the dispatch width.
    pub fn lowest_idle(&self) -> Option<usize> {
        self.idle_bits
            .iter()
            .enumerate()
            .find(|(_, word)| **word != 0)
            .map(|(i, word)| i * 64 + word.trailing_zeros() as usize)
            .filter(|&slot| slot < self.bound)
    }

    /// The idle slots within the dispatch width, lowest first: a walk over
    /// the set bits, so a pool with no idle child costs one word read per
    /// 64 slots.
    pub fn idle_slots(&self) -> impl Iterator<Item = usize> + '_ {
        let bound = self.bound;
        self.idle_bits
            .iter()
            .enumerate()
            .flat_map(|(i, &word)| {
                let mut rest = word;
                std::iter::from_fn(move || {
                    (rest != 0).then(|| {
                        let bit = rest.trailing_zeros() as usize;
                        rest &= rest - 1;
                        i * 64 + bit
                    })
                })
            })
            .take_while(move |&slot| slot < bound)
    }

    /// The highest-numbered idle slot (the one to retire first). A
    /// many-connection child is idle only while it holds no connection.
    pub fn highest_idle(&self) -> Option<usize> {
        self.idle_bits
            .iter()
            .enumerate()
            .rev()
            .find(|(_, word)| **word != 0)
            .map(|(i, word)| i * 64 + 63 - word.leading_zeros() as usize)
    }

    /// The lowest-numbered slot that can take one more connection, by the
    /// rule in `policy::dispatch::lowest_with_room` (a property test checks
    /// this bitset lookup gives the same answer), within the dispatch
    /// width.
    pub fn lowest_with_room(&self) -> Option<usize> {
        self.lowest_with_room_anywhere()
            .filter(|&slot| slot < self.bound)
    }

    /// The lowest-numbered slot that can take one more connection, the
    /// dispatch width aside.
    fn lowest_with_room_anywhere(&self) -> Option<usize> {
        let slot = self
            .room_bits
            .iter()
            .enumerate()
            .find(|(_, word)| **word != 0)
            .map(|(i, word)| i * 64 + word.trailing_zeros() as usize)?;
        (!dispatch::held_back(self.get(slot)?.load.as_ref())).then_some(slot)
    }

    /// Whether a connection can be handed out now
    /// ([`lowest_with_room`](Scoreboard::lowest_with_room) has a slot).
    pub fn has_room(&self) -> bool {
        self.lowest_with_room().is_some()
    }

    /// Whether any child could take a connection, within the dispatch
    /// width or beyond it: a pool narrowed for the CPUs is not short of
    /// children.
    pub fn has_room_anywhere(&self) -> bool {
        self.lowest_with_room_anywhere().is_some()
    }

    /// Free places (connections that could be handed out now) over every
    /// serving many-connection child; 0 when children serve one at a time.
    pub fn free_places(&self) -> u64 {
        self.free_places
    }

    /// Records that the child said something, for liveness accounting.
    pub fn heard_from(&mut self, slot: usize, now: Instant) {
        if let Some(Some(s)) = self.slots.get_mut(slot) {
            s.last_heard = now;
        }
    }

    /// `Ready`: a starting child is now idle.
    pub fn ready(&mut self, slot: usize, now: Instant) -> Result<(), IllegalTransition> {
        self.transition(slot, SlotEvent::Ready, now)
    }

    /// A child that will never report (`none` dispatch: an unmodified
    /// program accepting on its own) counts as busy from the start: the
    /// supervisor cannot know when it is idle, so it never sends it work,
    /// pings it or retires it as surplus.
    pub fn assume_busy(&mut self, slot: usize, now: Instant) -> Result<(), IllegalTransition> {
        self.transition(slot, SlotEvent::AssumeBusy, now)
    }

    /// The supervisor handed the child a connection (`handoff`). A
    /// many-connection child counts it at once and must have had room.
    pub fn hand_connection(&mut self, slot: usize, now: Instant) -> Result<(), IllegalTransition> {
        if self.get(slot).is_some_and(|s| s.load.is_some()) {
            return self.hand_session(slot, now);
        }
        self.transition(slot, SlotEvent::Connection, now)
    }

    fn hand_session(&mut self, slot: usize, now: Instant) -> Result<(), IllegalTransition> {
        let entry = self.get(slot).expect("checked by caller");
        if !self.room_at(slot) {
            return Err(IllegalTransition {
                slot,
                from: entry.state,
                event: "connection",
            });
        }
        self.change_load(slot, now, |load| {
            load.handed = load.handed.wrapping_add(1);
        });
        Ok(())
    }

    /// `Load`: a many-connection child reports how many connections it
    /// holds (`open`), how many it takes (`capacity`), how many it has
    /// received so far (`received`) and how many it is running a step of
    /// (`running`, counted as at most `open`). The report is checked
    /// against the previous one and the connections handed (see
    /// [`SessionLoad`]); the child's state follows its load.
    pub fn report_load(
        &mut self,
        slot: usize,
        (open, capacity, received, running): (u32, u32, u32, u32),
        now: Instant,
    ) -> Result<(), LoadError> {
        let Some(entry) = self.get(slot) else {
            return Err(LoadError::Illegal(IllegalTransition {
                slot,
                from: SlotState::Killed,
                event: "load",
            }));
        };
        let Some(before) = entry.load else {
            return Err(LoadError::NotHosting(slot));
        };
        if matches!(entry.state, SlotState::Starting | SlotState::Ordered) {
            return Err(LoadError::Illegal(IllegalTransition {
                slot,
                from: entry.state,
                event: "load",
            }));
        }
        let arrived = received.wrapping_sub(before.received);
        let in_flight = before.in_flight();
        if arrived > in_flight {
            return Err(LoadError::TooManyReceived {
                slot,
                arrived,
                in_flight,
            });
        }
        let possible = u64::from(before.open) + u64::from(in_flight);
        if u64::from(open) > possible {
            return Err(LoadError::TooManyOpen {
                slot,
                open,
                possible,
            });
        }
        let limit = self.session_capacity.unwrap_or(capacity);
        self.change_load(slot, now, |load| {
            load.open = open;
            load.capacity = capacity.min(limit);
            load.received = received;
            load.received_total += u64::from(arrived);
            load.running = running.min(open);
        });
        // A connection is served once it has been received and is no
        // longer open. `open` may briefly count one not yet received, so
        // the count only ever moves up.
        let entry = self.slots[slot].as_mut().expect("checked above");
        let load = entry.load.expect("checked above");
        let finished = load.received_total.saturating_sub(u64::from(load.open));
        entry.served = entry.served.max(finished);
        Ok(())
    }

    /// Applies `change` to a many-connection slot's load and moves a
    /// serving child to the state its new load puts it in.
    fn change_load(&mut self, slot: usize, now: Instant, change: impl FnOnce(&mut SessionLoad)) {
        self.unindex_room(slot);
        let entry = self.slots[slot].as_mut().expect("callers check the slot");
        let load = entry.load.as_mut().expect("callers check the load");
        change(load);
        let (from, to) = (entry.state, load.state());
        if matches!(from, SlotState::Idle | SlotState::Partial | SlotState::Busy) && to != from {
            entry.state = to;
            entry.since = now;
            self.uncount(slot, from);
            self.count(slot, to);
        }
        self.index_room(slot);
    }

    /// The supervisor ordered the child to accept (`order`).
    pub fn order_accept(&mut self, slot: usize, now: Instant) -> Result<(), IllegalTransition> {
        self.refuse_for_sessions(slot, "accept order")?;
        self.transition(slot, SlotEvent::OrderAccept, now)
    }

    /// `Busy`: the child accepted a connection itself.
    pub fn busy(&mut self, slot: usize, now: Instant) -> Result<(), IllegalTransition> {
        self.refuse_for_sessions(slot, "busy")?;
        self.transition(slot, SlotEvent::Busy, now)
    }

    /// `Missed`: the child was woken or ordered but found no connection.
    pub fn missed(&mut self, slot: usize, now: Instant) -> Result<(), IllegalTransition> {
        self.refuse_for_sessions(slot, "missed")?;
        self.transition(slot, SlotEvent::Missed, now)
    }

    /// `Idle`: the child finished its connection. Returns whether it had
    /// been serving one (and so the served count went up).
    pub fn idle(&mut self, slot: usize, now: Instant) -> Result<bool, IllegalTransition> {
        self.refuse_for_sessions(slot, "idle")?;
        // A child told to quit while busy finishes that connection and
        // says `Idle` before it exits: it served it all the same.
        let was_busy = self.get(slot).map(Slot::holds_connection);
        self.transition(slot, SlotEvent::Idle, now)?;
        if was_busy == Some(true) {
            if let Some(Some(s)) = self.slots.get_mut(slot) {
                s.served += 1;
            }
        }
        Ok(was_busy == Some(true))
    }

    /// Kernel dispatch: the child finished `count` connections the
    /// supervisor did not see begin or end (read off the scoreboard).
    pub fn add_served(&mut self, slot: usize, count: u64, now: Instant) {
        if let Some(Some(s)) = self.slots.get_mut(slot) {
            s.served += count;
            if s.state == SlotState::Busy {
                s.since = now;
            }
        }
    }

    /// Kernel dispatch: the connection [`Scoreboard::idle`] counted for a
    /// busy child was none (the child's record read busy before it first
    /// said idle, and its counts never moved).
    pub fn uncount_one(&mut self, slot: usize) {
        if let Some(Some(s)) = self.slots.get_mut(slot) {
            s.served = s.served.saturating_sub(1);
        }
    }

    /// `Next`: the child finished its connection and accepted the next one
    /// itself. It stays busy, its busy clock restarts and the served count
    /// goes up.
    pub fn next(&mut self, slot: usize, now: Instant) -> Result<(), IllegalTransition> {
        self.refuse_for_sessions(slot, "next")?;
        let was_busy = self.get(slot).map(|s| s.state) == Some(SlotState::Busy);
        self.transition(slot, SlotEvent::Next, now)?;
        if was_busy {
            // Still busy, on a new connection: its clock starts again.
            let entry = self.slots[slot].as_mut().expect("just moved");
            entry.served += 1;
            entry.since = now;
        }
        Ok(())
    }

    /// The supervisor told the child to quit.
    pub fn retire(&mut self, slot: usize, now: Instant) -> Result<(), IllegalTransition> {
        self.transition(slot, SlotEvent::Retire, now)
    }

    /// The supervisor sent SIGKILL. Always allowed on an occupied slot.
    pub fn kill(&mut self, slot: usize, now: Instant) -> Result<(), IllegalTransition> {
        self.transition(slot, SlotEvent::Kill, now)
    }

    /// Many-connection children report their load instead of `idle`,
    /// `busy` and `missed`, and are never ordered to accept.
    fn refuse_for_sessions(
        &self,
        slot: usize,
        event: &'static str,
    ) -> Result<(), IllegalTransition> {
        match self.get(slot) {
            Some(entry) if entry.load.is_some() => Err(IllegalTransition {
                slot,
                from: entry.state,
                event,
            }),
            _ => Ok(()),
        }
    }

    /// Moves `slot` as the transition table says `event` does
    /// ([`SlotState::after`]), keeping the counts and indexes in step.
    fn transition(
        &mut self,
        slot: usize,
        event: SlotEvent,
        now: Instant,
    ) -> Result<(), IllegalTransition> {
        let Some(Some(entry)) = self.slots.get(slot) else {
            return Err(IllegalTransition {
                slot,
                from: SlotState::Killed,
                event: event.name(),
            });
        };
        let from = entry.state;
        let mut to = from.after(event).ok_or(IllegalTransition {
            slot,
            from,
            event: event.name(),
        })?;
        if let (Some(load), SlotState::Idle) = (entry.load, to) {
            // A many-connection child that becomes ready serves from then
            // on, in whatever state its load puts it.
            to = load.state();
        }
        if let Some(serving) = match event {
            SlotEvent::Connection | SlotEvent::Busy | SlotEvent::AssumeBusy => Some(true),
            SlotEvent::Idle | SlotEvent::Missed => Some(false),
            _ => None,
        } {
            // Only a move the table allowed changes it (checked above).
            self.slots[slot].as_mut().expect("checked above").serving =
                serving && matches!(to, SlotState::Busy | SlotState::Retiring);
        }
        if to != from {
            self.unindex_room(slot);
            self.uncount(slot, from);
            self.count(slot, to);
            let entry = self.slots[slot].as_mut().expect("checked above");
            entry.state = to;
            entry.since = now;
            self.index_room(slot);
            if from.serves() != to.serves() {
                self.place_bound();
            }
        }
        Ok(())
    }

    /// Whether the occupied `slot` can take one more connection, and how
    /// many free places it adds to [`Scoreboard::free_places`].
    fn room(entry: &Slot<L>) -> (bool, u32) {
        let room = dispatch::has_room(entry.state, entry.load.as_ref());
        (room, entry.load.filter(|_| room).map_or(0, |l| l.free()))
    }

    fn room_at(&self, slot: usize) -> bool {
        self.room_bits
            .get(slot / 64)
            .is_some_and(|word| word & (1 << (slot % 64)) != 0)
    }

    /// Takes an occupied slot out of the room index (before it changes).
    fn unindex_room(&mut self, slot: usize) {
        if let Some(Some(entry)) = self.slots.get(slot) {
            let (_, free) = Self::room(entry);
            self.free_places -= u64::from(free);
            self.room_bits[slot / 64] &= !(1 << (slot % 64));
        }
    }

    /// Puts an occupied slot back into the room index (after it changed).
    fn index_room(&mut self, slot: usize) {
        if let Some(Some(entry)) = self.slots.get(slot) {
            let (room, free) = Self::room(entry);
            self.free_places += u64::from(free);
            if room {
                self.room_bits[slot / 64] |= 1 << (slot % 64);
            }
        }
    }

    fn count(&mut self, slot: usize, state: SlotState) {
        self.changes += 1;
        match state {
            SlotState::Starting => self.counts.starting += 1,
            SlotState::Idle => {
                self.counts.idle += 1;
                self.idle_bits[slot / 64] |= 1 << (slot % 64);
            }
            SlotState::Ordered | SlotState::Partial | SlotState::Busy => self.counts.busy += 1,
            SlotState::Retiring | SlotState::Killed => self.counts.leaving += 1,
        }
    }

    fn uncount(&mut self, slot: usize, state: SlotState) {
        self.changes += 1;
        match state {
            SlotState::Starting => self.counts.starting -= 1,
            SlotState::Idle => {
                self.counts.idle -= 1;
                self.idle_bits[slot / 64] &= !(1 << (slot % 64));
            }
            SlotState::Ordered | SlotState::Partial | SlotState::Busy => self.counts.busy -= 1,
            SlotState::Retiring | SlotState::Killed => self.counts.leaving -= 1,
        }
    }

    /// The one-letter-per-slot line, `.` for a free slot: `IIB.S`.
    pub fn line(&self) -> String {
        self.slots
            .iter()
            .map(|s| s.as_ref().map_or('.', |s| s.state.letter()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allowed_own_move_passes_through() {
        assert_eq!(own_move(Ok(3)), Some(3));
    }

    /// In the tests and the simulator a refused move of the supervisor's
    /// own fails the run (in a release build it is logged as an internal
    /// error and the slot is left as it was).
    #[test]
    #[should_panic(expected = "the supervisor's own move was refused")]
    fn a_refused_own_move_fails_the_run() {
        let refused = IllegalTransition {
            slot: 2,
            from: SlotState::Killed,
            event: "retire",
        };
        own_move::<()>(Err(refused));
    }

    fn board_with(n: usize) -> (Scoreboard, Instant) {
        let now = Instant::now();
        let mut board = Scoreboard::new();
        for i in 0..n {
            let slot = board.occupy_lowest_free(1000 + i as i32, 1, now);
            board.ready(slot, now).unwrap();
        }
        (board, now)
    }

    #[test]
    fn a_connection_finished_after_quit_is_served() {
        let (mut board, now) = board_with(2);
        board.hand_connection(0, now).unwrap();
        board.retire(0, now).unwrap();
        board.retire(1, now).unwrap();
        // Slot 0 was busy when told to quit; its `Idle` ends that connection.
        assert!(board.idle(0, now).unwrap());
        assert_eq!(board.get(0).unwrap().served, 1);
        // Slot 1 was idle: an `Idle` after `Quit` counts nothing, once.
        assert!(!board.idle(1, now).unwrap());
        assert!(!board.idle(0, now).unwrap());
        assert_eq!(board.get(0).unwrap().served, 1);
        assert_eq!(board.get(1).unwrap().served, 0);
    }

    #[test]
    fn lowest_idle_prefers_low_slots() {
        let (mut board, now) = board_with(3);
        assert_eq!(board.lowest_idle(), Some(0));
        board.hand_connection(0, now).unwrap();
        assert_eq!(board.lowest_idle(), Some(1));
        assert_eq!(board.highest_idle(), Some(2));
        assert_eq!(board.line(), "BII");
    }

    #[test]
    fn the_width_counts_serving_children_and_moves_with_them() {
        let (mut board, now) = board_with(6);
        board.set_width(Some(3));
        assert_eq!(board.dispatch_bound(), Some(3));
        for slot in 0..3 {
            board.hand_connection(slot, now).unwrap();
        }
        // Slots 3-5 idle, beyond the width: nothing to hand to, but the
        // pool is not short of children.
        assert_eq!(board.lowest_idle(), None);
        assert_eq!(board.lowest_with_room(), None);
        assert_eq!(board.idle_slots().count(), 0);
        assert!(!board.has_room() && board.has_room_anywhere());
        assert_eq!(board.highest_idle(), Some(5), "retire from beyond it");
        // Slot 1 leaves: the third serving child is now in slot 3.
        board.retire(1, now).unwrap();
        assert_eq!(board.dispatch_bound(), Some(4));
        assert_eq!(board.lowest_idle(), Some(3));
        // Gone, and a new child starting in its slot: still 4 until it
        // is ready.
        board.vacate(1);
        board.occupy(1, 77, 1, now, ());
        assert_eq!(board.dispatch_bound(), Some(4));
        board.ready(1, now).unwrap();
        assert_eq!(board.dispatch_bound(), Some(3));
        assert_eq!(board.lowest_idle(), Some(1));
        // Every child: no bound.
        board.set_width(None);
        assert_eq!(board.dispatch_bound(), None);
        board.set_width(Some(9));
        assert_eq!(board.dispatch_bound(), None, "fewer serve than the width");
    }

    #[test]
    fn idle_lookup_crosses_word_boundaries() {
        let (mut board, now) = board_with(130);
        for slot in 0..129 {
            board.hand_connection(slot, now).unwrap();
        }
        assert_eq!(board.lowest_idle(), Some(129));
        assert_eq!(board.highest_idle(), Some(129));
        board.idle(70, now).unwrap();
        assert_eq!(board.lowest_idle(), Some(70));
    }

    #[test]
    fn vacated_slot_is_reused_first() {
        let (mut board, now) = board_with(3);
        board.kill(1, now).unwrap();
        board.vacate(1);
        assert_eq!(board.line(), "I.I");
        assert_eq!(board.occupy_lowest_free(7, 1, now), 1);
        assert_eq!(board.line(), "ISI");
    }

    #[test]
    fn idle_while_idle_is_refused() {
        let (mut board, now) = board_with(1);
        let err = board.idle(0, now).unwrap_err();
        assert_eq!(err.from, SlotState::Idle);
        assert!(err.to_string().contains("'idle' is not allowed while idle"));
    }

    #[test]
    fn ready_twice_is_refused() {
        let (mut board, now) = board_with(1);
        assert!(board.ready(0, now).is_err());
    }

    #[test]
    fn served_counts_only_finished_connections() {
        let (mut board, now) = board_with(1);
        board.hand_connection(0, now).unwrap();
        assert!(board.idle(0, now).unwrap());
        assert_eq!(board.get(0).unwrap().served, 1);
    }

    #[test]
    fn next_keeps_a_busy_child_busy_and_restarts_its_clock() {
        let (mut board, start) = board_with(2);
        board.hand_connection(0, start).unwrap();
        let later = start + std::time::Duration::from_secs(3);
        board.next(0, later).unwrap();
        let entry = board.get(0).unwrap();
        assert_eq!(
            (entry.state, entry.served, entry.since),
            (SlotState::Busy, 1, later)
        );
        assert_eq!(board.lowest_idle(), Some(1));
        assert_eq!(board.counts().busy, 1);
        assert!(board.idle(0, later).unwrap());
        assert_eq!(board.get(0).unwrap().served, 2);
    }

    #[test]
    fn next_from_an_idle_child_is_refused() {
        let (mut board, now) = board_with(1);
        let err = board.next(0, now).unwrap_err();
        assert_eq!(err.from, SlotState::Idle);
        board.retire(0, now).unwrap();
        assert!(
            board.next(0, now).is_ok(),
            "a leaving child may still finish one"
        );
    }

    #[test]
    fn a_child_that_never_reports_is_busy_from_the_start() {
        let now = Instant::now();
        let mut board = Scoreboard::new();
        let slot = board.occupy_lowest_free(42, 1, now);
        board.assume_busy(slot, now).unwrap();
        assert_eq!(board.line(), "B");
        assert_eq!(board.lowest_idle(), None);
        assert_eq!(board.counts().busy, 1);
        assert!(board.assume_busy(slot, now).is_err());
    }

    #[test]
    fn room_means_idle_for_one_connection_children() {
        let (mut board, now) = board_with(3);
        assert_eq!(board.lowest_with_room(), Some(0));
        board.hand_connection(0, now).unwrap();
        board.hand_connection(1, now).unwrap();
        assert_eq!(board.lowest_with_room(), Some(2));
        board.hand_connection(2, now).unwrap();
        assert!(!board.has_room());
        assert_eq!(board.lowest_with_room(), None);
        board.idle(1, now).unwrap();
        assert_eq!(board.lowest_with_room(), Some(1));
        assert_eq!(board.free_places(), 0);
    }

    fn session_board(children: usize, capacity: u32) -> (Scoreboard, Instant) {
        let now = Instant::now();
        let mut board = Scoreboard::new();
        board.host_sessions(capacity);
        for i in 0..children {
            let slot = board.occupy_lowest_free(2000 + i as i32, 1, now);
            board.ready(slot, now).unwrap();
        }
        (board, now)
    }

    fn load_of(board: &Scoreboard, slot: usize) -> SessionLoad {
        board.get(slot).unwrap().load.unwrap()
    }

    #[test]
    fn connections_fill_the_lowest_child_first() {
        let (mut board, now) = session_board(2, 3);
        assert_eq!(board.line(), "II");
        assert_eq!(board.free_places(), 6);
        for _ in 0..3 {
            let slot = board.lowest_with_room().unwrap();
            assert_eq!(slot, 0);
            board.hand_connection(slot, now).unwrap();
        }
        assert_eq!(board.line(), "BI");
        assert_eq!(board.lowest_with_room(), Some(1));
        board.hand_connection(1, now).unwrap();
        assert_eq!(board.line(), "BP");
        assert_eq!(board.free_places(), 2);
        let c = board.counts();
        assert_eq!((c.idle, c.busy), (0, 2));
        // Slot 0 says one of its three ended: it has room again.
        board.report_load(0, (2, 3, 3, 0), now).unwrap();
        assert_eq!(board.line(), "PP");
        assert_eq!(board.lowest_with_room(), Some(0));
        assert_eq!(board.get(0).unwrap().served, 1);
    }

    #[test]
    fn a_full_child_is_refused_a_connection() {
        let (mut board, now) = session_board(1, 1);
        board.hand_connection(0, now).unwrap();
        let err = board.hand_connection(0, now).unwrap_err();
        assert_eq!(err.from, SlotState::Busy);
        assert_eq!(load_of(&board, 0).handed, 1);
    }

    #[test]
    fn a_report_that_crossed_handoffs_counts_them_as_load() {
        let (mut board, now) = session_board(1, 4);
        for _ in 0..3 {
            board.hand_connection(0, now).unwrap();
        }
        // Written after the first connection arrived, before the others:
        // those two are still counted.
        board.report_load(0, (1, 4, 1, 0), now).unwrap();
        let load = load_of(&board, 0);
        assert_eq!((load.in_flight(), load.load(), load.free()), (2, 3, 1));
        assert_eq!(board.line(), "P");
        // The child counts a new connection in `open` before `received`:
        // for a moment it looks fuller than it is, never emptier.
        board.report_load(0, (2, 4, 1, 0), now).unwrap();
        assert_eq!(load_of(&board, 0).load(), 4);
        assert_eq!(board.line(), "B");
        board.report_load(0, (2, 4, 2, 0), now).unwrap();
        assert_eq!(load_of(&board, 0).load(), 3);
        board.report_load(0, (0, 4, 3, 0), now).unwrap();
        assert_eq!(board.line(), "I");
        assert_eq!(board.highest_idle(), Some(0));
        assert_eq!(board.get(0).unwrap().served, 3);
        assert_eq!(board.free_places(), 4);
    }

    #[test]
    fn a_child_far_behind_holds_the_next_connection_back() {
        let (mut board, now) = session_board(2, 1000);
        for _ in 0..dispatch::MAX_IN_FLIGHT {
            assert_eq!(board.lowest_with_room(), Some(0));
            board.hand_connection(0, now).unwrap();
        }
        // Slot 0 has room but has not caught up: nothing goes to slot 1.
        assert_eq!(board.lowest_with_room(), None);
        assert!(!board.has_room());
        board.report_load(0, (1, 1000, 1, 0), now).unwrap();
        assert_eq!(board.lowest_with_room(), Some(0));
    }

    #[test]
    fn impossible_load_reports_are_refused() {
        let (mut board, now) = session_board(1, 4);
        board.hand_connection(0, now).unwrap();
        assert_eq!(
            board.report_load(0, (1, 4, 2, 0), now),
            Err(LoadError::TooManyReceived {
                slot: 0,
                arrived: 2,
                in_flight: 1
            })
        );
        assert_eq!(
            board.report_load(0, (2, 4, 1, 0), now),
            Err(LoadError::TooManyOpen {
                slot: 0,
                open: 2,
                possible: 1
            })
        );
        // `received` going backwards is a huge wrapped step forwards.
        board.report_load(0, (1, 4, 1, 0), now).unwrap();
        assert!(matches!(
            board.report_load(0, (1, 4, 0, 0), now),
            Err(LoadError::TooManyReceived { .. })
        ));
        let (mut plain, now) = board_with(1);
        assert_eq!(
            plain.report_load(0, (0, 1, 0, 0), now),
            Err(LoadError::NotHosting(0))
        );
    }

    #[test]
    fn many_connection_children_report_load_not_idle_or_busy() {
        let now = Instant::now();
        let mut board = Scoreboard::new();
        board.host_sessions(2);
        board.occupy(0, 10, 1, now, ());
        assert!(matches!(
            board.report_load(0, (0, 2, 0, 0), now),
            Err(LoadError::Illegal(_))
        ));
        board.ready(0, now).unwrap();
        board.report_load(0, (0, 2, 0, 0), now).unwrap();
        assert!(board.idle(0, now).is_err());
        assert!(board.busy(0, now).is_err());
        assert!(board.missed(0, now).is_err());
        assert!(board.order_accept(0, now).is_err());
    }

    #[test]
    fn running_is_kept_and_never_counted_above_open() {
        let (mut board, now) = session_board(1, 3);
        board.hand_connection(0, now).unwrap();
        board.hand_connection(0, now).unwrap();
        board.report_load(0, (2, 3, 2, 1), now).unwrap();
        assert_eq!(load_of(&board, 0).running, 1);
        // A child's report of more running than open (its last session's
        // close still running) counts no more than open.
        board.report_load(0, (1, 3, 2, 2), now).unwrap();
        assert_eq!(load_of(&board, 0).running, 1);
    }

    #[test]
    fn reported_capacity_is_capped_and_zero_takes_nothing() {
        let (mut board, now) = session_board(1, 3);
        board.report_load(0, (0, 100, 0, 0), now).unwrap();
        assert_eq!(load_of(&board, 0).capacity, 3);
        board.report_load(0, (0, 0, 0, 0), now).unwrap();
        assert_eq!(board.line(), "I");
        assert!(!board.has_room());
        assert_eq!(board.free_places(), 0);
    }

    #[test]
    fn counts_wrap_without_harm() {
        let (mut board, now) = session_board(1, 8);
        let near_end = u32::MAX - 1;
        board.slots[0].as_mut().unwrap().load = Some(SessionLoad {
            handed: near_end,
            received: near_end,
            ..SessionLoad::new(8)
        });
        for _ in 0..4 {
            board.hand_connection(0, now).unwrap();
        }
        assert_eq!(load_of(&board, 0).handed, 2);
        assert_eq!(load_of(&board, 0).in_flight(), 4);
        board.report_load(0, (4, 8, 2, 0), now).unwrap();
        assert_eq!(load_of(&board, 0).load(), 4);
    }

    #[test]
    fn room_lookup_crosses_word_boundaries_and_leaving_children_have_none() {
        let (mut board, now) = session_board(130, 2);
        for slot in 0..129 {
            board.hand_connection(slot, now).unwrap();
            board.hand_connection(slot, now).unwrap();
        }
        assert_eq!(board.lowest_with_room(), Some(129));
        assert_eq!(board.free_places(), 2);
        board.report_load(70, (1, 2, 2, 0), now).unwrap();
        assert_eq!(board.lowest_with_room(), Some(70));
        assert_eq!(board.free_places(), 3);
        board.retire(70, now).unwrap();
        assert_eq!(board.lowest_with_room(), Some(129));
        assert_eq!(board.free_places(), 2);
        board.kill(129, now).unwrap();
        board.vacate(129);
        assert!(!board.has_room());
        assert_eq!(board.free_places(), 0);
    }

    #[test]
    fn counts_follow_transitions() {
        let (mut board, now) = board_with(4);
        board.hand_connection(0, now).unwrap();
        board.order_accept(1, now).unwrap();
        board.retire(3, now).unwrap();
        let c = board.counts();
        assert_eq!((c.starting, c.idle, c.busy, c.leaving), (0, 1, 2, 1));
        assert_eq!(c.live(), 3);
        board.vacate(3);
        assert_eq!(board.counts().leaving, 0);
    }

    mod agrees_with_the_policy {
        use super::*;
        use crate::policy::dispatch;
        use proptest::prelude::*;

        /// One thing that can happen to a slot.
        #[derive(Debug, Clone)]
        enum Op {
            Occupy,
            Ready,
            Hand,
            Idle,
            Order,
            Busy,
            Load { open: u32, received: u32 },
            Retire,
            Kill,
            Vacate,
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                Just(Op::Occupy),
                Just(Op::Ready),
                Just(Op::Hand),
                Just(Op::Idle),
                Just(Op::Order),
                Just(Op::Busy),
                (0u32..8, 0u32..80).prop_map(|(open, received)| Op::Load { open, received }),
                Just(Op::Retire),
                Just(Op::Kill),
                Just(Op::Vacate),
            ]
        }

        fn apply(board: &mut Scoreboard, slot: usize, op: &Op, now: Instant) {
            // Refused moves are part of the game: the board must stay
            // consistent whatever a child sends.
            match op {
                Op::Occupy if board.get(slot).is_none() => {
                    board.occupy(slot, 100 + slot as i32, 1, now, ())
                }
                Op::Occupy => {}
                Op::Ready => drop(board.ready(slot, now)),
                Op::Hand => drop(board.hand_connection(slot, now)),
                Op::Idle => drop(board.idle(slot, now)),
                Op::Order => drop(board.order_accept(slot, now)),
                Op::Busy => drop(board.busy(slot, now)),
                Op::Load { open, received } => {
                    drop(board.report_load(slot, (*open, 6, *received, 0), now))
                }
                Op::Retire => drop(board.retire(slot, now)),
                Op::Kill => drop(board.kill(slot, now)),
                Op::Vacate => drop(board.vacate(slot)),
            }
        }

        fn policy_answer(board: &Scoreboard) -> Option<usize> {
            dispatch::lowest_with_room(
                board
                    .iter()
                    .map(|(slot, s)| (slot, s.state, s.load.as_ref())),
            )
        }

        proptest! {
            #[test]
            fn the_bitset_lookup_gives_the_policys_slot(
                sessions in any::<bool>(),
                ops in prop::collection::vec((0usize..70, op()), 0..400),
            ) {
                let now = Instant::now();
                let mut board = Scoreboard::new();
                if sessions {
                    board.host_sessions(6);
                }
                for (slot, op) in &ops {
                    apply(&mut board, *slot, op, now);
                    prop_assert_eq!(board.lowest_with_room(), policy_answer(&board));
                    let idle: Vec<usize> = board
                        .iter()
                        .filter(|(_, s)| s.state == SlotState::Idle)
                        .map(|(slot, _)| slot)
                        .collect();
                    prop_assert_eq!(board.idle_slots().collect::<Vec<_>>(), idle);
                }
            }
        }
    }
}
