//! The shared scoreboard: a record of four 64-bit words per slot in
//! memory that the kernel's program, the supervisor and every child map.
//!
//! It is the one value of an mmapable eBPF array map. Layout, in 64-bit
//! little-endian words (docs/protocol.md, "Kernel dispatch"):
//!
//! | word | what | written by |
//! |---|---|---|
//! | 0 | [`MAGIC`]: the layout's name and version | the supervisor, once |
//! | 1 | the number of slots | the supervisor, once |
//! | 2 | nonzero: the supervisor holds connections no idle child took, and wants an `I` from a child that goes idle | the supervisor |
//! | 3 | connections the program sent to an overflow socket | the program (an atomic add) |
//! | 4 | connections taken from an overflow socket | whoever accepts one there (an atomic add) |
//! | 5 | the dispatch bound: 0, or the first slot beyond the dispatch width; the program picks no slot from it on, and children there take nothing from the overflow | the supervisor |
//! | 6 | dead reservations taken over, by the program for a new connection or by the supervisor for an overflow one | the program, the supervisor (atomic adds) |
//! | 7 | the **spread**: its low 16 bits 0, or *n*: with no slot idle or dead, the program queues the connection on the socket of slot *k* mod *n* (*k* its count of such picks, in the bits above) rather than on the overflow | the supervisor (*n*), the program (an atomic add to *k*) |
//! | 8 + 4 *slot* | the slot's state | the child, the program, the supervisor |
//! | 9 + 4 *slot* | connections the child accepted from its own socket | the child |
//! | 10 + 4 *slot* | connections the child finished (its own and handed ones) | the child |
//! | 11 + 4 *slot* | of those it accepted, the ones it took from the overflow as it finished one | the child |
//!
//! A slot's state is [`BUSY`] (0: busy, or no child), [`IDLE`] (1), or a
//! reservation: the kernel's monotonic clock in ns (with bit 1 set, so it
//! is never 0 or 1) at which the program picked the slot for a new
//! connection. Moves, each one atomic:
//! - child: `BUSY → IDLE` when it has finished and waits (a store: no one
//!   else moves a busy slot), and `→ BUSY` when it accepts (a store);
//! - program: `IDLE → reserved` (compare-and-swap, so two connections
//!   arriving on two CPUs never pick the same idle child), and, when no
//!   slot is idle, a reservation older than
//!   [`RESERVATION_HOLD`](crate::policy::reservations::RESERVATION_HOLD)
//!   `→ reserved` anew (compare-and-swap with the stamp it read): its
//!   connection never came (a reset, a handshake never finished, a
//!   client silent under `TCP_DEFER_ACCEPT`), and a dead reservation must
//!   not keep a child from the connections after it;
//! - supervisor: `IDLE →  BUSY`, or failing that a reservation `→ BUSY`,
//!   to hand an overflow connection to that child (compare-and-swap); and
//!   a reservation older than
//!   [`GIVE_BACK_AFTER`](crate::policy::reservations::GIVE_BACK_AFTER)
//!   `→ IDLE` (compare-and-swap
//!   with the value it saw) when it reads the board, so the slot is the
//!   first again for the next connection.
//!
//! The child reports nothing per connection: the supervisor reads the
//! records (each turn of its loop, and every
//! [`READ_INTERVAL`](crate::policy::reservations::READ_INTERVAL)). Only
//! while word 2 is set does a child that goes idle say `I` on its
//! channel, so the supervisor wakes to hand it a waiting connection. The
//! child stores its state before it reads word 2, and the supervisor sets
//! word 2 before it reads the states, both sequentially consistent: one of
//! the two always sees the other, and no idle child is missed.
//!
//! Word 5 narrows where connections go while the busy children wait for
//! the CPUs (`policy::width`): the children below the bound serve, and
//! take the overflow's connections as they finish, while those above it
//! wait, kept for a load that sleeps rather than computes. A child that
//! does not read word 5 still works; it takes from the overflow as
//! before, only without the gain.
//!
//! Words 3 and 4 let a child that finishes a connection skip looking on
//! the overflow (a system call) when nothing can be waiting there: word 3
//! not above word 4. They only ever over-count what waits (a connection
//! sent that never completes its handshake stays counted), and then the
//! child looks as it would without them; one they miss is handed on by
//! the supervisor, which watches the overflow.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::core::sampled::Sample;
use crate::policy::reservations;
use crate::sys::bpf::{self, SharedWords};

/// Word 0: "fkpbrd01", the layout's name and version, little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"fkpbrd01");
/// The words before the first slot's record.
pub const HEADER_WORDS: usize = 8;
/// Words in a slot's record.
pub const RECORD_WORDS: usize = 4;
/// The word holding the slot count.
const SLOTS_WORD: usize = 1;
/// The word saying the supervisor wants to hear of a child going idle.
const WAITING_WORD: usize = 2;
/// The word counting connections the program sent to the overflow.
pub const OVERFLOW_SENT_WORD: usize = 3;
/// The word counting connections taken from the overflow.
const OVERFLOW_TAKEN_WORD: usize = 4;
/// The word holding the dispatch bound (0: none).
pub const BOUND_WORD: usize = 5;
/// The word counting dead reservations the program took over.
pub const TAKEN_OVER_WORD: usize = 6;
/// The word holding the spread: how many slots from 0 the program spreads
/// connections over when none is idle (low 16 bits), and its count of
/// such picks (the bits above).
pub const SPREAD_WORD: usize = 7;
/// The spread's count steps by this (its bits start above the width's).
pub const SPREAD_STEP: u64 = 1 << 16;
/// Within a record: the state.
const STATE: usize = 0;
/// Within a record: connections accepted from the child's own socket.
const TAKEN: usize = 1;
/// Within a record: connections finished.
const SERVED: usize = 2;
/// Within a record: connections taken from the overflow by a finishing child.
const NEXT: usize = 3;
/// Busy, or no child in the slot.
pub const BUSY: u64 = 0;
/// Idle: waiting on its own socket.
pub const IDLE: u64 = 1;
/// Set in every reservation, so one never reads as busy or idle.
pub const RESERVED_BIT: u64 = 2;

/// What a slot's word says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotWord {
    /// Busy, or empty.
    Busy,
    /// Idle.
    Idle,
    /// Picked by the program at `at_ns` (the kernel's `CLOCK_MONOTONIC`);
    /// its connection has not been accepted yet.
    Reserved {
        /// When.
        at_ns: u64,
    },
}

impl SlotWord {
    /// Whether this is a reservation that no longer holds its child at
    /// `now_ns` (`policy::reservations`): one the program would take over.
    pub fn dead_at(self, now_ns: u64) -> bool {
        matches!(self, SlotWord::Reserved { at_ns } if !reservations::young(at_ns, now_ns))
    }

    /// Reads a raw word.
    pub fn from_raw(word: u64) -> SlotWord {
        match word {
            BUSY => SlotWord::Busy,
            IDLE => SlotWord::Idle,
            at_ns => SlotWord::Reserved { at_ns },
        }
    }
}

/// The kernel's `CLOCK_MONOTONIC` now, in ns: the clock the program
/// stamps reservations with (`bpf_ktime_get_ns`).
pub fn kernel_clock_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        (t.tv_sec() as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(t.tv_nsec() as u64)
    })
}

/// The scoreboard, mapped.
pub struct Board {
    words: SharedWords,
    slots: usize,
}

impl std::fmt::Debug for Board {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Board")
            .field("slots", &self.slots)
            .finish_non_exhaustive()
    }
}

impl Board {
    /// The map's value size for `slots` slots.
    pub fn bytes(slots: usize) -> usize {
        8 * (HEADER_WORDS + RECORD_WORDS * slots)
    }

    /// A new scoreboard map for `slots` slots, every slot busy (empty);
    /// the map's descriptor is what children and the program are given.
    pub fn create(slots: usize) -> io::Result<(OwnedFd, Board)> {
        let bytes = u32::try_from(Board::bytes(slots))
            .map_err(|_| io::Error::other(format!("{slots} slots do not fit a scoreboard map")))?;
        let fd = bpf::create_shared_array(bytes, "forkpool_board")?;
        let board = Board::open(std::os::fd::AsFd::as_fd(&fd), slots)?;
        let words = board.words.words();
        words[SLOTS_WORD].store(slots as u64, Ordering::Relaxed);
        words[0].store(MAGIC, Ordering::Release);
        Ok((fd, board))
    }

    /// Maps an existing scoreboard (a child's side).
    pub fn open(map: BorrowedFd<'_>, slots: usize) -> io::Result<Board> {
        let words = SharedWords::map(map, HEADER_WORDS + RECORD_WORDS * slots)?;
        Ok(Board { words, slots })
    }

    /// Maps an existing scoreboard whose size is read from its header (an
    /// exec'd worker's side): refuses a map that is not a scoreboard.
    pub fn open_announced(map: BorrowedFd<'_>) -> io::Result<Board> {
        let header = SharedWords::map(map, HEADER_WORDS)?;
        let words = header.words();
        if words[0].load(Ordering::Acquire) != MAGIC {
            return Err(io::Error::other(
                "not a forkpool scoreboard (its first word is not `fkpbrd01`)",
            ));
        }
        let slots = words[SLOTS_WORD].load(Ordering::Relaxed);
        let slots = usize::try_from(slots)
            .ok()
            .filter(|&n| (1..=crate::dispatch::kernel::program::MAX_SLOTS).contains(&n))
            .ok_or_else(|| io::Error::other(format!("the scoreboard says {slots} slots")))?;
        drop(header);
        Board::open(map, slots)
    }

    /// The number of slots.
    pub fn slots(&self) -> usize {
        self.slots
    }

    fn word(&self, slot: usize, field: usize) -> &AtomicU64 {
        &self.words.words()[HEADER_WORDS + RECORD_WORDS * slot + field]
    }

    fn slot(&self, slot: usize) -> &AtomicU64 {
        self.word(slot, STATE)
    }

    /// What `slot`'s word says now.
    pub fn state(&self, slot: usize) -> SlotWord {
        SlotWord::from_raw(self.slot(slot).load(Ordering::Acquire))
    }

    /// The raw word (to compare later with [`Board::release_stale`]).
    pub fn raw(&self, slot: usize) -> u64 {
        self.slot(slot).load(Ordering::Acquire)
    }

    /// The child in `slot` waits for a connection. Returns whether the
    /// supervisor wants to hear of it (word 2, read after the store).
    pub fn set_idle(&self, slot: usize) -> bool {
        self.slot(slot).store(IDLE, Ordering::SeqCst);
        self.words.words()[WAITING_WORD].load(Ordering::SeqCst) != 0
    }

    /// The child in `slot` is busy (or gone).
    pub fn set_busy(&self, slot: usize) {
        self.slot(slot).store(BUSY, Ordering::SeqCst);
    }

    /// The child in `slot` accepted a connection from its own socket.
    pub fn count_taken(&self, slot: usize) {
        self.word(slot, TAKEN).fetch_add(1, Ordering::Relaxed);
    }

    /// The child in `slot`, finishing a connection, took the next one
    /// waiting on the overflow itself (counted in taken too).
    pub fn count_next(&self, slot: usize) {
        self.word(slot, NEXT).fetch_add(1, Ordering::Relaxed);
    }

    /// Whether a connection may wait on an overflow socket: the program
    /// sent more there than were taken. False means none can.
    pub fn overflow_may_wait(&self) -> bool {
        let words = self.words.words();
        // Taken first: read after it, sent is at least as new.
        let taken = words[OVERFLOW_TAKEN_WORD].load(Ordering::SeqCst);
        words[OVERFLOW_SENT_WORD].load(Ordering::SeqCst) > taken
    }

    /// Whether the child in `slot`, finishing a connection, should look on
    /// the overflow: something may wait there ([`Board::overflow_may_wait`])
    /// and the slot is within the dispatch width (word 5).
    pub fn may_take_next(&self, slot: usize) -> bool {
        let bound = self.words.words()[BOUND_WORD].load(Ordering::SeqCst);
        (bound == 0 || (slot as u64) < bound) && self.overflow_may_wait()
    }

    /// Sets the dispatch bound: from `bound` on (`None`: nowhere) no slot
    /// is given a new connection or takes one from the overflow.
    pub fn set_bound(&self, bound: Option<usize>) {
        let word = bound.map_or(0, |b| b.clamp(1, self.slots) as u64);
        let word = if word == self.slots as u64 { 0 } else { word };
        let at = &self.words.words()[BOUND_WORD];
        if at.load(Ordering::Relaxed) != word {
            at.store(word, Ordering::SeqCst);
        }
    }

    /// Sets the spread (`SPREAD_WORD`): with no slot idle, the program
    /// queues each new connection on one of the first `over` slots' own
    /// sockets in turn (0: on the overflow, as without it). Capped at the
    /// slots and at what the word's 16 bits hold.
    pub fn set_spread(&self, over: usize) {
        let over = over.min(self.slots).min(0xffff) as u64;
        let at = &self.words.words()[SPREAD_WORD];
        if at.load(Ordering::Relaxed) & 0xffff != over {
            at.store(over, Ordering::SeqCst);
        }
    }

    /// The spread as set: how many slots (0: none).
    #[cfg(test)]
    pub fn spread(&self) -> usize {
        (self.words.words()[SPREAD_WORD].load(Ordering::SeqCst) & 0xffff) as usize
    }

    /// The dispatch bound as set (`None`: every slot).
    pub fn bound(&self) -> Option<usize> {
        match self.words.words()[BOUND_WORD].load(Ordering::SeqCst) {
            0 => None,
            b => Some(b as usize),
        }
    }

    /// `n` connections were taken from an overflow socket.
    pub fn count_overflow_taken(&self, n: u64) {
        if n > 0 {
            self.words.words()[OVERFLOW_TAKEN_WORD].fetch_add(n, Ordering::SeqCst);
        }
    }

    /// The supervisor took `n` connections from an overflow socket, and
    /// mends the count while at it. A connection can reach the overflow
    /// without the program counting it: one that came before the program
    /// was attached (a burst at start-up, a reload or upgrade), or one the
    /// kernel's hash placed when a selection failed. Each such connection,
    /// once taken, leaves word 4 one above what was sent, for good; from
    /// then on the finishing children skip looking while fewer than that
    /// many wait, and the supervisor hands every one of them on (a bench
    /// started under load ran at 0.75× its speed, 64 behind). The
    /// supervisor is the taker of last resort, so it sees the skew first:
    /// when word 3 is below word 4 after its take, it raises word 3 to
    /// match. A raise can only count more than were sent (the program may
    /// add meanwhile), which makes the children look, never skip.
    pub fn count_overflow_handed(&self, n: u64) {
        if n == 0 {
            return;
        }
        let words = self.words.words();
        let taken = words[OVERFLOW_TAKEN_WORD].fetch_add(n, Ordering::SeqCst) + n;
        let sent = words[OVERFLOW_SENT_WORD].load(Ordering::SeqCst);
        if sent < taken {
            words[OVERFLOW_SENT_WORD].fetch_add(taken - sent, Ordering::SeqCst);
        }
    }

    /// The child in `slot` finished a connection.
    pub fn count_served(&self, slot: usize) {
        self.word(slot, SERVED).fetch_add(1, Ordering::Relaxed);
    }

    /// A new child in `slot` starts its counts from zero.
    pub fn reset(&self, slot: usize) {
        self.set_busy(slot);
        self.word(slot, TAKEN).store(0, Ordering::Relaxed);
        self.word(slot, SERVED).store(0, Ordering::Relaxed);
        self.word(slot, NEXT).store(0, Ordering::Relaxed);
    }

    /// `slot`'s record now.
    pub fn sample(&self, slot: usize) -> Sample {
        Sample {
            busy: self.slot(slot).load(Ordering::SeqCst) == BUSY,
            taken: self.word(slot, TAKEN).load(Ordering::Relaxed),
            served: self.word(slot, SERVED).load(Ordering::Relaxed),
            next: self.word(slot, NEXT).load(Ordering::Relaxed),
        }
    }

    /// Whether a connection arriving now would go to a slot above `slot`:
    /// none below it is idle or reserved, and one above it is idle. Only
    /// then does it matter that the child in `slot` marks itself idle
    /// before its client sees the connection close: a client that waits
    /// for the close and connects again would otherwise land on a colder
    /// child above it. Plain loads, no system call; the scan stops at the
    /// first idle slot above, so at light load it reads a word or two, and
    /// a saturated pool (nothing idle) is what it spares the two system
    /// calls of holding the connection open (`Worker::serve`).
    pub fn next_would_pass(&self, slot: usize) -> bool {
        let free = |s: usize| self.slot(s).load(Ordering::Relaxed) != BUSY;
        !(0..slot.min(self.slots)).any(free) && (slot + 1..self.slots).any(free)
    }

    /// Says whether the supervisor wants a child going idle to tell it.
    pub fn set_waiting(&self, waiting: bool) {
        self.words.words()[WAITING_WORD].store(u64::from(waiting), Ordering::SeqCst);
    }

    /// Takes an idle `slot` for a connection the supervisor hands over;
    /// false when it was not idle (the program or the child moved first).
    pub fn claim(&self, slot: usize) -> bool {
        self.slot(slot)
            .compare_exchange(IDLE, BUSY, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Takes `slot` reserved as `seen` for a connection the supervisor
    /// hands over (a reservation to busy), counted with the takeovers
    /// (word 6); false when the word moved. Its own connection, if it
    /// ever comes, waits on the child's socket until the handed one is
    /// served.
    pub fn claim_reserved(&self, slot: usize, seen: u64) -> bool {
        let claimed = matches!(SlotWord::from_raw(seen), SlotWord::Reserved { .. })
            && self
                .slot(slot)
                .compare_exchange(seen, BUSY, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
        if claimed {
            // Counted with the program's takeovers: a connection that
            // never came, either way.
            self.words.words()[TAKEN_OVER_WORD].fetch_add(1, Ordering::Relaxed);
        }
        claimed
    }

    /// Gives a reservation back (idle again) if it is still the one seen
    /// as `seen`: its connection never reached the child.
    pub fn release_stale(&self, slot: usize, seen: u64) -> bool {
        matches!(SlotWord::from_raw(seen), SlotWord::Reserved { .. })
            && self
                .slot(slot)
                .compare_exchange(seen, IDLE, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    /// Sets `slot`'s word to `raw` (tests: a reservation of any age).
    #[cfg(test)]
    pub(crate) fn store_raw(&self, slot: usize, raw: u64) {
        self.slot(slot).store(raw, Ordering::SeqCst);
    }

    /// Dead reservations the program has taken over since the board was
    /// made.
    pub fn taken_over(&self) -> u64 {
        self.words.words()[TAKEN_OVER_WORD].load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A board holding `states` (a real map: these tests need CAP_BPF,
    /// as every kernel dispatch test does).
    fn board_of(states: &[u64]) -> Board {
        let (_map, board) = Board::create(states.len()).expect("a scoreboard map (CAP_BPF)");
        for (slot, &state) in states.iter().enumerate() {
            board.slot(slot).store(state, Ordering::Relaxed);
        }
        board
    }

    #[test]
    fn the_next_connection_passes_a_slot_only_to_an_idle_one_above_it() {
        let reserved = 1_000_000 | RESERVED_BIT;
        // A sequential client on slot 0, slot 1 idle: it would pass.
        assert!(board_of(&[BUSY, IDLE, IDLE]).next_would_pass(0));
        assert!(board_of(&[BUSY, BUSY, IDLE]).next_would_pass(0));
        // Saturated, or idle only below: it would not.
        assert!(!board_of(&[BUSY, BUSY, BUSY]).next_would_pass(0));
        assert!(!board_of(&[BUSY, BUSY, BUSY]).next_would_pass(2));
        assert!(!board_of(&[IDLE, BUSY, IDLE]).next_would_pass(1));
        assert!(!board_of(&[reserved, BUSY, IDLE]).next_would_pass(1));
        // A reservation above counts as free (the program picked it, and
        // the next would go past it only if it were busy).
        assert!(board_of(&[BUSY, reserved]).next_would_pass(0));
        // The last slot has nothing above it.
        assert!(!board_of(&[BUSY, IDLE, BUSY]).next_would_pass(2));
    }

    #[test]
    fn the_supervisors_take_mends_connections_the_program_never_counted() {
        let board = board_of(&[BUSY, BUSY]);
        let words = board.words.words();
        // Two connections reached the overflow before the program was
        // attached, then the program sent three there.
        words[OVERFLOW_SENT_WORD].store(3, Ordering::SeqCst);
        // A child took one of the counted ones; the supervisor takes the
        // other four.
        board.count_overflow_taken(1);
        assert!(board.overflow_may_wait());
        board.count_overflow_handed(4);
        assert!(!board.overflow_may_wait(), "all five are taken");
        assert_eq!(words[OVERFLOW_SENT_WORD].load(Ordering::SeqCst), 5);
        // The next one the program sends is seen by the children.
        words[OVERFLOW_SENT_WORD].fetch_add(1, Ordering::SeqCst);
        assert!(board.overflow_may_wait(), "a counted one waits");
        board.count_overflow_taken(1);
        assert!(!board.overflow_may_wait());
        // A take that finds the count whole changes nothing.
        board.count_overflow_handed(0);
        words[OVERFLOW_SENT_WORD].fetch_add(2, Ordering::SeqCst);
        board.count_overflow_handed(1);
        assert_eq!(words[OVERFLOW_SENT_WORD].load(Ordering::SeqCst), 8);
        assert!(board.overflow_may_wait(), "one counted is still there");
    }

    #[test]
    fn the_spread_is_capped_at_the_slots_and_keeps_the_programs_count_while_unchanged() {
        let board = board_of(&[BUSY; 4]);
        assert_eq!(board.spread(), 0);
        board.set_spread(3);
        assert_eq!(board.spread(), 3);
        // The program's picks count above the low 16 bits.
        let word = &board.words.words()[SPREAD_WORD];
        word.fetch_add(5 * SPREAD_STEP, Ordering::SeqCst);
        board.set_spread(3);
        assert_eq!(word.load(Ordering::SeqCst), 5 * SPREAD_STEP + 3);
        board.set_spread(9);
        assert_eq!(board.spread(), 4, "no more than the slots");
        board.set_spread(0);
        assert_eq!(word.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_child_beyond_the_bound_leaves_the_overflow_to_the_others() {
        let board = board_of(&[BUSY; 4]);
        board.words.words()[OVERFLOW_SENT_WORD].store(1, Ordering::SeqCst);
        assert!((0..4).all(|slot| board.may_take_next(slot)), "no bound");
        board.set_bound(Some(2));
        assert_eq!(board.bound(), Some(2));
        assert!(board.may_take_next(0) && board.may_take_next(1));
        assert!(!board.may_take_next(2) && !board.may_take_next(3));
        // Within the width, nothing sent: nothing to look for.
        board.count_overflow_taken(1);
        assert!(!board.may_take_next(0));
        // A bound at or past the last slot, or none, is no bound (word 5
        // is 0); a bound of 0 children still lets slot 0 serve.
        board.set_bound(Some(4));
        assert_eq!(board.bound(), None);
        board.set_bound(Some(9));
        assert_eq!(board.bound(), None);
        board.set_bound(Some(0));
        assert_eq!(board.bound(), Some(1));
        board.set_bound(None);
        assert_eq!(board.words.words()[BOUND_WORD].load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_raw_word_reads_as_busy_idle_or_a_reservation() {
        assert_eq!(SlotWord::from_raw(0), SlotWord::Busy);
        assert_eq!(SlotWord::from_raw(1), SlotWord::Idle);
        assert_eq!(
            SlotWord::from_raw(1_000_000 | RESERVED_BIT),
            SlotWord::Reserved {
                at_ns: 1_000_000 | RESERVED_BIT
            }
        );
    }
}
