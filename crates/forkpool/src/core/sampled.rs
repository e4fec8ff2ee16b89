//! Kernel dispatch: what the scoreboard says of a child, read by the
//! supervisor, in place of the reports a child sends in other modes. The
//! child writes its own record, so what it says is bounded here like any
//! message: counts that go back or jump are not believed.

use std::time::{Duration, Instant};

use super::child::HasChild;
use super::effect::Effect;
use super::Core;
use crate::policy::reservations;
use crate::scoreboard::{own_move, SlotState};

/// The most connections one reading believes a child finished or took
/// since the last (the supervisor reads at least every 100 ms).
pub(crate) const MOST_PER_SAMPLE: u64 = 1_000_000;

/// One slot's record on the scoreboard, as the supervisor read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sample {
    /// Serving a connection (a reservation reads as idle).
    pub busy: bool,
    /// Connections taken from its own socket since it started.
    pub taken: u64,
    /// Connections finished since it started.
    pub served: u64,
    /// Of those taken, the ones taken from the overflow as it finished one.
    pub next: u64,
}

/// Kernel dispatch: what one look at the reservations on the board found
/// (the shell reads them off it; `policy::reservations` says which are
/// young and which are given back).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReservationLook {
    /// Reservations that still hold their child: each a connection on
    /// its way to it, or one that will never come but holds the child
    /// from others until the hold ends. Either way that child is not
    /// spare.
    pub young: u32,
    /// How long the oldest young one still holds its child.
    pub hold_left: Option<Duration>,
    /// Given back at this look (idle again): connections that never came.
    pub released: u64,
    /// The program's count of dead reservations it took over since the
    /// board was made (word 6).
    pub taken_over: u64,
}

/// Kernel dispatch: the core's memory of the board's reservations, and
/// the deadlines they set.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BoardReading {
    /// When the board was last read.
    read_at: Option<Instant>,
    /// Young reservations at that reading, at most the idle children.
    young: u32,
    /// The takeovers counted so far.
    taken_over: u64,
    /// Until when a connection may wait on a busy child's socket behind
    /// another (the program took a reservation over, and its own
    /// connection may still come).
    behind_until: Option<Instant>,
    /// When the oldest young reservation stops holding its child.
    young_dies_at: Option<Instant>,
    /// Connections wait for a child (held by the supervisor, or on the
    /// overflow while no child has room), as the shell last said.
    waiting: bool,
    /// When the busy children's sockets were last looked at for
    /// connections waiting behind others, and how many there were.
    behind_looked_at: Option<Instant>,
    behind: u32,
}

/// How far a count moved, as believed: never back, never by more than
/// [`MOST_PER_SAMPLE`].
fn moved(before: u64, now: u64) -> u64 {
    now.saturating_sub(before).min(MOST_PER_SAMPLE)
}

impl<L: HasChild> Core<L> {
    /// The reservations on the board: `young` ones hold children the core
    /// counts idle; `released` were given back at this look, and the
    /// program has taken `taken_over` dead ones over since the board was
    /// made. Both of those were connections that never reached their
    /// child (`totals.abandoned`).
    pub fn board_read(&mut self, look: ReservationLook, now: Instant) {
        let r = &mut self.reading;
        let before = std::mem::replace(&mut r.taken_over, look.taken_over);
        let taken_over = moved(before, look.taken_over);
        // A reservation taken over or given back may still see its
        // connection come, and queue behind another on its child.
        if taken_over > 0 || look.released > 0 {
            r.behind_until = Some(now + reservations::behind_window(self.config.defer_accept));
        }
        r.read_at = Some(now);
        r.young = look.young.min(self.board.counts().idle);
        r.young_dies_at = look.hold_left.map(|left| now + left);
        self.totals.abandoned += look.released + taken_over;
    }

    /// Whether connections wait for a child (the shell says so at the end
    /// of each turn): while they do and every child is taken, the core
    /// wakes the loop when a young reservation dies, so its child can be
    /// claimed for them.
    pub fn connections_waiting(&mut self, waiting: bool) {
        self.reading.waiting = waiting;
    }

    /// Whether a connection may wait behind another on a busy child's
    /// socket now: the supervisor then looks at the busy children's
    /// sockets, at most every `BEHIND_READ_INTERVAL`.
    pub fn may_wait_behind(&self, now: Instant) -> bool {
        self.reading.behind_until.is_some_and(|until| now < until)
    }

    /// Whether the busy children's sockets are to be looked at now (a
    /// system call each): while a connection may wait behind another,
    /// once per `BEHIND_READ_INTERVAL`, not on every turn of the loop.
    pub fn behind_look_due(&self, now: Instant) -> bool {
        self.may_wait_behind(now)
            && self
                .reading
                .behind_looked_at
                .is_none_or(|at| now >= at + reservations::BEHIND_READ_INTERVAL)
    }

    /// The busy children's sockets held `behind` connections at `now`.
    pub fn looked_behind(&mut self, behind: u32, now: Instant) {
        self.reading.behind_looked_at = Some(now);
        self.reading.behind = behind;
    }

    /// Connections waiting behind others on busy children's sockets, as
    /// last looked at; none once that can no longer happen.
    pub fn queued_behind(&self, now: Instant) -> u32 {
        if self.may_wait_behind(now) {
            self.reading.behind
        } else {
            0
        }
    }

    /// Children the core counts idle that a young reservation holds.
    pub(crate) fn young_reservations(&self) -> u32 {
        self.reading.young
    }

    /// Kernel dispatch: when the loop must wake for the board: its next
    /// reading, and the death of a young reservation whose child the
    /// waiting connections need.
    pub fn board_deadline(&self, now: Instant) -> Option<Instant> {
        if self.config.dispatch != crate::config::DispatchMode::Kernel {
            return None;
        }
        let r = &self.reading;
        let read = r
            .read_at
            .map(|at| reservations::next_read(at, r.behind_until));
        let dies = r
            .young_dies_at
            .filter(|t| r.waiting && *t > now && self.board.counts().idle <= r.young);
        [read, dies].into_iter().flatten().min()
    }

    /// The record of the child in `slot` reads `sample`: its state follows
    /// (idle to busy, busy to idle, counting what it finished), and the
    /// connections it took count as accepted. A child not yet ready, on
    /// its way out, or that does not keep its record (it said `R`, not
    /// `K`) is left as it is.
    pub fn sampled(&mut self, slot: usize, sample: Sample, now: Instant) {
        let Some((state, pid)) = self.board.get(slot).map(|s| (s.state, s.pid)) else {
            return;
        };
        if !matches!(state, SlotState::Idle | SlotState::Busy) || !self.keeps_board(slot) {
            return;
        }
        let child = self.board.link_mut(slot).expect("occupied").child_mut();
        let (taken_before, served_before, next_before) = child.role.board_counts;
        let taken = moved(taken_before, sample.taken);
        let mut served = moved(served_before, sample.served);
        let next = moved(next_before, sample.next).min(taken);
        child.role.board_counts = (sample.taken, sample.served, sample.next);
        self.totals.accepted += taken;
        self.totals.taken_next += next;
        // Connections finished: the pool is turning over (the CPU-bound
        // hold reads this; without it a held pool grew as if stalled).
        if served > 0 {
            self.effects.push(Effect::ConnectionEnded {
                slot,
                pid,
                took: None,
            });
        }
        // The state was checked above, so both moves are legal; were one
        // refused (a bug), it is logged and the slot left as it was until
        // the next reading.
        match (state, sample.busy) {
            // Busy before it has ever taken a connection is no connection:
            // a child's record reads busy from its start (or its seat)
            // until its first idle store. Taken for one, it made the pool
            // look short of idle children and grow. (Not "none taken since
            // the last reading": a helper may count a connection before it
            // stores busy, and a reading between the two would then hide
            // the connection for as long as it lasts.)
            (SlotState::Idle, true) if sample.taken == 0 && sample.served == 0 => {}
            (SlotState::Idle, true) => {
                // Busy now: a ping sent while it looked idle is answered
                // after its connection.
                child.ping = None;
                if own_move(self.board.busy(slot, now)).is_none() {
                    return;
                }
            }
            (SlotState::Busy, false) => {
                // `idle` counts the connection the core saw begin; the
                // record's count says whether there was one (a child reads
                // busy from its start until it first says idle).
                if own_move(self.board.idle(slot, now)).is_none() {
                    return;
                }
                if served == 0 {
                    self.board.uncount_one(slot);
                } else {
                    served -= 1;
                    self.effects.push(Effect::Served { slot });
                }
                self.effects.push(Effect::Room);
            }
            _ => {}
        }
        if served > 0 {
            self.board.add_served(slot, served, now);
            self.effects.push(Effect::Served { slot });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::PoolConfig;
    use crate::core::child::Child;
    use crate::protocol::ChildMessage;

    /// A child that said `K` and whose record reads busy before it first
    /// goes idle has served nothing when it does.
    #[test]
    fn a_child_busy_only_while_it_starts_is_idle_and_has_served_nothing() {
        let now = Instant::now();
        let mut core: Core<Child> = Core::new(PoolConfig {
            dispatch: crate::config::DispatchMode::Kernel,
            ..PoolConfig::default()
        });
        core.adopt(0, 42, 1, Child::new(now, true, 1), now);
        core.report(0, ChildMessage::ReadyOnBoard { pid: 42 }, now);
        let record = |busy, taken, served| Sample {
            busy,
            taken,
            served,
            next: 0,
        };
        core.sampled(0, record(true, 0, 0), now);
        assert_eq!(core.board.get(0).unwrap().state, SlotState::Idle);
        core.sampled(0, record(false, 0, 0), now);
        assert_eq!(core.board.get(0).unwrap().served, 0);
        // A real connection, seen begin and end, counts once.
        core.sampled(0, record(true, 1, 0), now);
        assert_eq!(core.board.get(0).unwrap().state, SlotState::Busy);
        core.sampled(0, record(false, 1, 1), now);
        assert_eq!(core.board.get(0).unwrap().served, 1);
        // A helper that counts before it stores busy, read in between:
        // the next reading, busy with nothing newly taken, is still busy.
        core.sampled(0, record(false, 2, 1), now);
        core.sampled(0, record(true, 2, 1), now);
        assert_eq!(core.board.get(0).unwrap().state, SlotState::Busy);
        core.sampled(0, record(false, 2, 2), now);
        assert_eq!(core.board.get(0).unwrap().served, 2);
        // Two finished between readings, the state idle both times.
        core.take_effects();
        core.sampled(0, record(false, 4, 4), now);
        assert_eq!(core.board.get(0).unwrap().served, 4);
        // ... and the pool hears that connections ended (its CPU hold).
        let ended = core
            .take_effects()
            .into_iter()
            .filter(|e| matches!(e, Effect::ConnectionEnded { slot: 0, .. }))
            .count();
        assert_eq!(ended, 1);
    }

    #[test]
    fn counts_never_go_back_or_jump() {
        assert_eq!(moved(5, 7), 2);
        assert_eq!(moved(7, 5), 0);
        assert_eq!(moved(0, u64::MAX), MOST_PER_SAMPLE);
    }
}
