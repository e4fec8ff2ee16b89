//! The scoreboard: which child sits in which slot and what it is doing.
//!
//! Plain data, no I/O. A slot is a small stable number (Apache's scoreboard
//! index); "the lowest-numbered idle child" means the idle child in the lowest
//! slot, found through a bitset in a few word operations. States are an enum
//! and every transition is a method that refuses an illegal move, so a child
//! that reports something out of order is caught here and killed by the
//! supervisor.

use std::fmt;
use std::time::Instant;

/// What the child in a slot is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    /// Forked, has not yet said `Ready`.
    Starting,
    /// Waiting for work.
    Idle,
    /// Ordered to accept (`order` dispatch); has not yet said `Busy` or `Missed`.
    Ordered,
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
            SlotState::Busy => "busy",
            SlotState::Retiring => "retiring",
            SlotState::Killed => "killed",
        }
    }
}

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

/// One occupied slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
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
}

/// Counts of children by state, the input of the scaling policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateCounts {
    /// Children that have not said `Ready` yet.
    pub starting: u32,
    /// Children waiting for work.
    pub idle: u32,
    /// Children serving, or ordered to accept.
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

/// Slot table plus an index of idle slots.
#[derive(Debug, Default)]
pub struct Scoreboard {
    slots: Vec<Option<Slot>>,
    idle_bits: Vec<u64>,
    counts: StateCounts,
    changes: u64,
}

impl Scoreboard {
    /// An empty scoreboard.
    pub fn new() -> Self {
        Self::default()
    }

    /// Puts a freshly forked child into the lowest free slot and returns it.
    pub fn occupy_lowest_free(&mut self, pid: i32, generation: u32, now: Instant) -> usize {
        let slot = self
            .slots
            .iter()
            .position(Option::is_none)
            .unwrap_or(self.slots.len());
        self.occupy(slot, pid, generation, now);
        slot
    }

    /// The lowest free slot number, without occupying it.
    pub fn lowest_free(&self) -> usize {
        self.slots
            .iter()
            .position(Option::is_none)
            .unwrap_or(self.slots.len())
    }

    /// Puts a freshly forked child into `slot`, which must be free.
    pub fn occupy(&mut self, slot: usize, pid: i32, generation: u32, now: Instant) {
        if slot >= self.slots.len() {
            self.slots.resize(slot + 1, None);
            self.idle_bits.resize(self.slots.len().div_ceil(64), 0);
        }
        assert!(self.slots[slot].is_none(), "slot {slot} is occupied");
        self.slots[slot] = Some(Slot {
            pid,
            state: SlotState::Starting,
            generation,
            served: 0,
            since: now,
            last_heard: now,
        });
        self.counts.starting += 1;
    }

    /// Frees a slot whose child has been reaped; returns what it held.
    pub fn vacate(&mut self, slot: usize) -> Option<Slot> {
        let old = self.slots.get_mut(slot)?.take()?;
        self.uncount(slot, old.state);
        // Trim trailing free slots so the scoreboard line stays short.
        while matches!(self.slots.last(), Some(None)) {
            self.slots.pop();
        }
        self.idle_bits.truncate(self.slots.len().div_ceil(64));
        Some(old)
    }

    /// The slot, if occupied.
    pub fn get(&self, slot: usize) -> Option<&Slot> {
        self.slots.get(slot)?.as_ref()
    }

    /// The slot holding `pid`, if any.
    pub fn slot_of_pid(&self, pid: i32) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| s.pid == pid))
    }

    /// Occupied slots in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &Slot)> {
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

    /// The lowest-numbered idle slot.
    pub fn lowest_idle(&self) -> Option<usize> {
        self.idle_bits
            .iter()
            .enumerate()
            .find(|(_, word)| **word != 0)
            .map(|(i, word)| i * 64 + word.trailing_zeros() as usize)
    }

    /// The highest-numbered idle slot (the one to retire first).
    pub fn highest_idle(&self) -> Option<usize> {
        self.idle_bits
            .iter()
            .enumerate()
            .rev()
            .find(|(_, word)| **word != 0)
            .map(|(i, word)| i * 64 + 63 - word.leading_zeros() as usize)
    }

    /// Records that the child said something, for liveness accounting.
    pub fn heard_from(&mut self, slot: usize, now: Instant) {
        if let Some(Some(s)) = self.slots.get_mut(slot) {
            s.last_heard = now;
        }
    }

    /// `Ready`: a starting child is now idle.
    pub fn ready(&mut self, slot: usize, now: Instant) -> Result<(), IllegalTransition> {
        self.transition(slot, "ready", now, |from| match from {
            SlotState::Starting => Some(SlotState::Idle),
            SlotState::Retiring | SlotState::Killed => Some(from),
            _ => None,
        })
    }

    /// A child that will never report (`none` dispatch: an unmodified
    /// program accepting on its own) counts as busy from the start: the
    /// supervisor cannot know when it is idle, so it never sends it work,
    /// pings it or retires it as surplus.
    pub fn assume_busy(&mut self, slot: usize, now: Instant) -> Result<(), IllegalTransition> {
        self.transition(slot, "assume busy", now, |from| match from {
            SlotState::Starting => Some(SlotState::Busy),
            _ => None,
        })
    }

    /// The supervisor handed the child a connection (`handoff`).
    pub fn hand_connection(&mut self, slot: usize, now: Instant) -> Result<(), IllegalTransition> {
        self.transition(slot, "connection", now, |from| match from {
            SlotState::Idle => Some(SlotState::Busy),
            _ => None,
        })
    }

    /// The supervisor ordered the child to accept (`order`).
    pub fn order_accept(&mut self, slot: usize, now: Instant) -> Result<(), IllegalTransition> {
        self.transition(slot, "accept order", now, |from| match from {
            SlotState::Idle => Some(SlotState::Ordered),
            _ => None,
        })
    }

    /// `Busy`: the child accepted a connection itself.
    pub fn busy(&mut self, slot: usize, now: Instant) -> Result<(), IllegalTransition> {
        self.transition(slot, "busy", now, |from| match from {
            SlotState::Ordered | SlotState::Idle => Some(SlotState::Busy),
            SlotState::Retiring | SlotState::Killed => Some(from),
            _ => None,
        })
    }

    /// `Missed`: the child was woken or ordered but found no connection.
    pub fn missed(&mut self, slot: usize, now: Instant) -> Result<(), IllegalTransition> {
        self.transition(slot, "missed", now, |from| match from {
            SlotState::Ordered | SlotState::Idle => Some(SlotState::Idle),
            SlotState::Retiring | SlotState::Killed => Some(from),
            _ => None,
        })
    }

    /// `Idle`: the child finished its connection. Returns whether it had
    /// been serving one (and so the served count went up).
    pub fn idle(&mut self, slot: usize, now: Instant) -> Result<bool, IllegalTransition> {
        let was_busy = self.get(slot).map(|s| s.state == SlotState::Busy);
        self.transition(slot, "idle", now, |from| match from {
            SlotState::Busy => Some(SlotState::Idle),
            SlotState::Retiring | SlotState::Killed => Some(from),
            _ => None,
        })?;
        if was_busy == Some(true) {
            if let Some(Some(s)) = self.slots.get_mut(slot) {
                s.served += 1;
            }
        }
        Ok(was_busy == Some(true))
    }

    /// The supervisor told the child to quit.
    pub fn retire(&mut self, slot: usize, now: Instant) -> Result<(), IllegalTransition> {
        self.transition(slot, "retire", now, |from| match from {
            SlotState::Killed => None,
            _ => Some(SlotState::Retiring),
        })
    }

    /// The supervisor sent SIGKILL. Always allowed on an occupied slot.
    pub fn kill(&mut self, slot: usize, now: Instant) -> Result<(), IllegalTransition> {
        self.transition(slot, "kill", now, |_| Some(SlotState::Killed))
    }

    fn transition(
        &mut self,
        slot: usize,
        event: &'static str,
        now: Instant,
        next: impl FnOnce(SlotState) -> Option<SlotState>,
    ) -> Result<(), IllegalTransition> {
        let Some(Some(entry)) = self.slots.get(slot) else {
            return Err(IllegalTransition {
                slot,
                from: SlotState::Killed,
                event,
            });
        };
        let from = entry.state;
        let to = next(from).ok_or(IllegalTransition { slot, from, event })?;
        if to != from {
            self.uncount(slot, from);
            self.count(slot, to);
            let entry = self.slots[slot].as_mut().expect("checked above");
            entry.state = to;
            entry.since = now;
        }
        Ok(())
    }

    fn count(&mut self, slot: usize, state: SlotState) {
        self.changes += 1;
        match state {
            SlotState::Starting => self.counts.starting += 1,
            SlotState::Idle => {
                self.counts.idle += 1;
                self.idle_bits[slot / 64] |= 1 << (slot % 64);
            }
            SlotState::Ordered | SlotState::Busy => self.counts.busy += 1,
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
            SlotState::Ordered | SlotState::Busy => self.counts.busy -= 1,
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
    fn lowest_idle_prefers_low_slots() {
        let (mut board, now) = board_with(3);
        assert_eq!(board.lowest_idle(), Some(0));
        board.hand_connection(0, now).unwrap();
        assert_eq!(board.lowest_idle(), Some(1));
        assert_eq!(board.highest_idle(), Some(2));
        assert_eq!(board.line(), "BII");
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
}
