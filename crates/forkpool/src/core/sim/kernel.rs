//! `kernel` dispatch in the simulator: the world plays the eBPF program,
//! the scoreboard and the slots' sockets. A worker that says `K` keeps a
//! record (once seated: at once when exec'd, on `S` when a template
//! forked it). At each SYN the program reserves the lowest idle record,
//! failing that takes over the lowest dead reservation, failing that
//! sends the connection to the overflow, as the real one does
//! (`dispatch/kernel/program.rs`); what the connection turns out to be
//! (`network.rs`) decides whether and when it is queued on the chosen
//! slot's socket. Finishing workers take from the overflow themselves and
//! the core hands the rest on (claiming a record first). The core learns
//! only by reading the records each turn (`Core::sampled`,
//! `Core::board_read`), as the supervisor does; some workers scramble
//! their counts, which must not break anything. The program and the
//! finishing workers keep to the dispatch width's bound, as the real ones
//! read it in word 5.
//!
//! Some pools' workers take the messages path (`G`): the shell moves
//! their records from their `B`/`N`/`I` (`Effect::MarkBoard`), they accept
//! from their own sockets whenever they are not serving and from the
//! overflow while they wait, the core hands them nothing, and with no
//! worker idle the program spreads connections over their sockets (word 7,
//! `Core::spread_over`, as the shell last set it). A departed worker's
//! socket keeps what was queued on it for the slot's next worker, which
//! the core starts (`Core::left_on_socket`).
//!
//! Invariants (`check_network`): no connection waits more than
//! [`STALL_AT_MOST`] while a child that could take it is idle or held by
//! a dead reservation, and a pool whose children are all taken grows
//! while connections wait.

use std::collections::VecDeque;
use std::time::Duration;

use super::network::Kind;
use super::world::{Conn, Happening, MS};
use super::Sim;
use crate::core::sampled::{ReservationLook, Sample};
use crate::policy::reservations;
use crate::protocol::ChildMessage;
use crate::scaling::Decision;

/// The longest a connection may wait while a child that could take it is
/// idle or held by a dead reservation.
pub(super) const STALL_AT_MOST: u64 = 50 * MS;

/// The longest a slot with connections on its socket waits for a worker
/// while the core could start one (the scaling rule's turns come often;
/// this is slack for the turn, not a start-up).
pub(super) const REFILL_AT_MOST: u64 = 2_000 * MS;

/// A slot's queue as a failed check describes it: the slot, how many
/// wait there, and its worker's word, whether it was told to quit and
/// whether it serves.
type QueueSeen = (usize, usize, Option<(Word, bool, bool)>);

/// A record's state word.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum Word {
    /// Busy, or not yet idle.
    #[default]
    Busy,
    /// Waiting on its socket.
    Idle,
    /// Reserved by the program at this moment (ns).
    Reserved(u64),
}

/// A worker's record on the simulated scoreboard.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Record {
    pub word: Word,
    pub taken: u64,
    pub served: u64,
    pub next: u64,
    /// It writes nonsense into its counts.
    pub liar: bool,
}

impl Record {
    /// Waiting for a connection on its socket (idle, or reserved).
    fn waiting(&self) -> bool {
        self.word != Word::Busy
    }
}

/// The slots' sockets and the program's counts.
#[derive(Debug, Default)]
pub(super) struct Sockets {
    /// Connections queued on each slot's socket, by slot.
    queues: Vec<VecDeque<u64>>,
    /// Slots out of the socket array (their child told to quit).
    off: Vec<bool>,
    /// Dead reservations the program took over (board word 6).
    taken_over: u64,
    /// The spread as the shell last set it (word 7), and the program's
    /// count of its picks.
    spread: usize,
    spread_picks: usize,
    /// Since when each slot has waited for a worker to refill it.
    refill_since: std::collections::BTreeMap<usize, u64>,
    /// Since when a connection has waited with a child that could take
    /// it idle or held by a dead reservation.
    stalled_since: Option<u64>,
}

impl Sockets {
    fn grow(&mut self, slot: usize) {
        if self.queues.len() <= slot {
            self.queues.resize_with(slot + 1, VecDeque::new);
            self.off.resize(slot + 1, false);
        }
    }
}

impl Sim {
    /// In kernel dispatch, most workers keep the board (`K`), a few say
    /// `R` and are served as in handoff. Returns the first message.
    pub(super) fn kernel_first_message(&mut self, pid: i32) -> ChildMessage {
        let exec_d = self
            .world
            .procs
            .get(&pid)
            .is_some_and(|p| p.in_group_of.is_none());
        if self.scenario.kernel && self.scenario.by_messages && exec_d {
            let p = self.world.procs.get_mut(&pid).expect("alive");
            p.said_g = true;
            p.board = Some(Record::default());
            return ChildMessage::ReadyByMessages { pid: pid as u32 };
        }
        let keeps = self.scenario.kernel && self.world.rng.per_mille(850);
        if !keeps {
            return ChildMessage::Ready { pid: pid as u32 };
        }
        let liar = self.world.rng.per_mille(self.scenario.bad_per_mille / 4);
        let p = self.world.procs.get_mut(&pid).expect("alive");
        p.said_k = true;
        // Exec'd, it has its sockets and the board already; forked by a
        // template, it waits for `S`.
        if p.in_group_of.is_none() {
            p.board = Some(Record {
                word: Word::Idle,
                liar,
                ..Record::default()
            });
            let slot = p.slot;
            self.seated_anew(slot);
        } else {
            p.liar = liar;
        }
        ChildMessage::ReadyOnBoard { pid: pid as u32 }
    }

    /// The core sent `S` to the worker in `slot`.
    pub(super) fn seat(&mut self, slot: usize) -> Result<(), String> {
        let pid = self.core.board.get(slot).map_or(0, |s| s.pid);
        let Some(p) = self.world.procs.get_mut(&pid) else {
            return Err(format!(
                "a seat for slot {slot}, whose pid {pid} is no process"
            ));
        };
        if !p.said_k || p.board.is_some() {
            return Err(format!(
                "a seat for slot {slot} (pid {pid}), which did not ask for one"
            ));
        }
        p.board = Some(Record {
            word: if p.told_quit { Word::Busy } else { Word::Idle },
            liar: p.liar,
            ..Record::default()
        });
        self.outcome.seats += 1;
        self.seated_anew(slot);
        Ok(())
    }

    /// A new child has `slot`'s sockets: they are in the socket array
    /// again, and it takes what waits on them.
    fn seated_anew(&mut self, slot: usize) {
        self.sockets.grow(slot);
        self.sockets.off[slot] = false;
        self.accept_queued(slot);
    }

    /// A SYN: the program picks a slot (or the overflow), and the
    /// connection follows as its kind says.
    pub(super) fn syn(&mut self) {
        let kind = self.draw_kind();
        let pick = self.program_picks();
        let (after, serve) = match kind {
            Kind::Never => {
                self.outcome.never_came += 1;
                return;
            }
            Kind::Queued { after, serve } => (after, serve),
        };
        let conn = self.new_conn(serve);
        self.world.at(after, Happening::Queued(pick, conn));
    }

    /// The program, at a SYN: the lowest idle record within the bound,
    /// reserved; else the lowest dead reservation, taken over; else the
    /// overflow (`None`).
    fn program_picks(&mut self) -> Option<usize> {
        let now = self.world.now;
        let bound = self.core.board.dispatch_bound().unwrap_or(usize::MAX);
        let candidates: Vec<(usize, i32, Word)> = self
            .seated()
            .filter(|&(slot, _, _)| slot < bound && !self.is_off(slot))
            .map(|(slot, pid, r)| (slot, pid, r.word))
            .collect();
        let idle = candidates.iter().find(|c| c.2 == Word::Idle);
        let dead = || {
            candidates
                .iter()
                .find(|c| matches!(c.2, Word::Reserved(at) if !reservations::young(at, now)))
        };
        let Some(&(slot, pid, word)) = idle.or_else(dead) else {
            return self.spread_pick();
        };
        if word != Word::Idle {
            self.sockets.taken_over += 1;
        }
        self.record_mut(pid).word = Word::Reserved(now);
        Some(slot)
    }

    /// The program with no slot idle or dead: the next slot of the spread,
    /// if the shell set one and a live worker holds its socket; else the
    /// overflow.
    fn spread_pick(&mut self) -> Option<usize> {
        let over = self.sockets.spread;
        if over == 0 {
            return None;
        }
        let slot = self.sockets.spread_picks % over;
        self.sockets.spread_picks += 1;
        let held = self.core.board.get(slot).is_some_and(|s| {
            self.world
                .procs
                .get(&s.pid)
                .is_some_and(|p| !p.exited && p.board.is_some())
        });
        let picked = (held && !self.is_off(slot)).then_some(slot);
        self.outcome.spread += u64::from(picked.is_some());
        picked
    }

    /// After a worker's first message: one on the messages path now waits
    /// on its sockets and the overflow.
    pub(super) fn after_first_message(&mut self, pid: i32) {
        let Some(p) = self.world.procs.get(&pid).filter(|p| p.said_g) else {
            return;
        };
        let slot = p.slot;
        self.seated_anew(slot);
        self.take_from_overflow(pid);
    }

    /// The shell marks the record of the messages worker in `slot`.
    pub(super) fn mark_board(&mut self, slot: usize, idle: bool) -> Result<(), String> {
        let pid = self.core.board.get(slot).map_or(0, |s| s.pid);
        let Some(p) = self.world.procs.get_mut(&pid) else {
            return Err(format!(
                "the board marked for slot {slot}, whose pid {pid} is no process"
            ));
        };
        if !p.said_g {
            return Err(format!(
                "the board marked for slot {slot}, whose worker never said G"
            ));
        }
        if let Some(r) = p.board.as_mut() {
            r.word = if idle { Word::Idle } else { Word::Busy };
        }
        Ok(())
    }

    /// A messages worker not serving takes the next connection on the
    /// overflow, if one waits there (it waits on the pool's listeners too).
    fn take_from_overflow(&mut self, pid: i32) {
        let free = self
            .world
            .procs
            .get(&pid)
            .is_some_and(|p| p.said_g && !p.exited && !p.told_quit && p.serving.is_none());
        if free {
            if let Some(conn) = self.world.backlog.pop_front() {
                self.take(pid, conn, false);
            }
        }
    }

    /// A connection reached the overflow: a messages worker that waits
    /// there, the lowest, takes it.
    pub(super) fn messages_worker_takes_overflow(&mut self) {
        let waiting = self.seated().map(|(_, pid, _)| pid).find(|pid| {
            let p = &self.world.procs[pid];
            p.said_g && !p.told_quit && p.serving.is_none()
        });
        if let Some(pid) = waiting {
            self.take_from_overflow(pid);
        }
    }

    /// A connection's handshake is done (and its data, with deferred
    /// accept, has come): it is queued on the socket the program picked.
    pub(super) fn queued(&mut self, pick: Option<usize>, conn: u64) {
        match pick {
            None => self.queue_on_overflow(conn),
            Some(slot) => {
                self.sockets.grow(slot);
                self.sockets.queues[slot].push_back(conn);
                self.accept_queued(slot);
            }
        }
    }

    /// The worker in `slot`, if it waits on its socket, accepts what is
    /// queued there; with no live worker in the slot, the supervisor
    /// takes it to hand on (a departed child's socket).
    fn accept_queued(&mut self, slot: usize) {
        let Some(&conn) = self.sockets.queues.get(slot).and_then(|q| q.front()) else {
            return;
        };
        let worker = self
            .seated()
            .find(|&(s, _, _)| s == slot)
            .map(|(_, pid, r)| (pid, r));
        match worker {
            Some((pid, r)) if self.waits_on_socket(pid, r) => {
                self.sockets.queues[slot].pop_front();
                self.take(pid, conn, false);
                self.outcome.kernel_taken += 1;
            }
            Some(_) => {}
            // No child on the board there (gone, or starting): the
            // supervisor watches the sockets until one is ready.
            None => self.orphans(slot),
        }
    }

    /// What is queued on `slot`'s socket, its child gone: the supervisor
    /// accepts it and hands it on (closed if the pool is stopping).
    pub(super) fn orphans(&mut self, slot: usize) {
        self.sockets.grow(slot);
        // Nobody could be handed them: they wait for the slot's next
        // worker, which the core starts.
        if !self.core.hands_on() {
            if !self.sockets.queues[slot].is_empty() && !self.core.refill_pending(slot) {
                self.core.left_on_socket(slot);
                self.outcome.refills += u64::from(self.core.refill_pending(slot));
            }
            return;
        }
        while let Some(conn) = self.sockets.queues[slot].pop_front() {
            self.queue_on_overflow(conn);
        }
    }

    /// The worker `pid` takes `conn` itself (from its socket, or the
    /// overflow as it finished one).
    fn take(&mut self, pid: i32, conn: u64, next: bool) {
        let serve = self.service(conn);
        let p = self.world.procs.get_mut(&pid).expect("alive");
        if p.said_g {
            // It says so; the shell moves its record.
            let slot = p.slot;
            p.serving = Some(conn);
            self.world.conns[conn as usize] = Conn::Held(pid);
            self.world.at(serve, Happening::Finish(pid, conn));
            let msg = if next {
                ChildMessage::Next
            } else {
                ChildMessage::Busy
            };
            self.report(slot, msg);
            return;
        }
        let record = p.board.as_mut().expect("on the board");
        record.word = Word::Busy;
        record.taken += 1;
        if next {
            record.next += 1;
        }
        p.serving = Some(conn);
        self.world.conns[conn as usize] = Conn::Held(pid);
        self.world.at(serve, Happening::Finish(pid, conn));
    }

    /// The core hands a connection to the child in `slot`: the lowest
    /// child the core counts idle whose record is idle, else one held by
    /// a dead reservation, claimed busy (`Claiming`); a child not on the
    /// board needs no claim. None: no child can take it.
    pub(super) fn claim_lowest(&mut self) -> Option<usize> {
        let now = self.world.now;
        let idle: Vec<usize> = self.core.board.idle_slots().collect();
        let word_of = |sim: &Sim, slot: usize| -> Option<(i32, Option<Word>)> {
            let pid = sim.core.board.get(slot)?.pid;
            let p = sim.world.procs.get(&pid)?;
            Some((pid, p.board.map(|r| r.word)))
        };
        for dead_too in [false, true] {
            for &slot in &idle {
                if !self.core.takes_handed(slot) {
                    continue;
                }
                let Some((pid, word)) = word_of(self, slot) else {
                    continue;
                };
                let claimable = match word {
                    None => !dead_too,
                    Some(Word::Idle) => !dead_too,
                    Some(Word::Reserved(at)) => dead_too && !reservations::young(at, now),
                    Some(Word::Busy) => false,
                };
                if claimable {
                    if word.is_some() {
                        self.record_mut(pid).word = Word::Busy;
                    }
                    if dead_too {
                        // Counted with the takeovers (board word 6).
                        self.sockets.taken_over += 1;
                    }
                    return Some(slot);
                }
            }
        }
        None
    }

    /// A worker on the board finished a connection: it counts it, takes
    /// the next from the overflow if one waits, or goes idle (and wakes
    /// the core with `I` while connections wait) and takes what is queued
    /// on its own socket. True if it is on the board (the handoff report
    /// is then not sent).
    pub(super) fn kernel_finished(&mut self, pid: i32, slot: usize) -> bool {
        let Some(p) = self.world.procs.get_mut(&pid) else {
            return false;
        };
        let told_quit = p.told_quit;
        if p.said_g {
            return self.messages_worker_finished(pid, slot, told_quit);
        }
        let Some(record) = p.board.as_mut() else {
            return false;
        };
        record.served += 1;
        if told_quit {
            return true;
        }
        let within = self
            .core
            .board
            .dispatch_bound()
            .is_none_or(|bound| slot < bound);
        // Its own socket first (a connection the kernel gave it), then
        // the overflow, as the worker does.
        let own = self.sockets.queues.get(slot).is_some_and(|q| !q.is_empty());
        if let Some(conn) = (within && !own)
            .then(|| self.world.backlog.pop_front())
            .flatten()
        {
            self.take(pid, conn, true);
            return true;
        }
        record.word = Word::Idle;
        if !self.world.backlog.is_empty() {
            self.report(slot, ChildMessage::Idle);
        }
        self.accept_queued(slot);
        true
    }

    /// A worker told to quit, with no connection: it takes the next one
    /// the kernel queued on its socket before it was taken off, if any
    /// (true), instead of exiting.
    pub(super) fn serve_what_was_queued(&mut self, pid: i32) -> bool {
        let p = &self.world.procs[&pid];
        if p.board.is_none() || matches!(p.behaviour, super::world::Behaviour::HangOnQuit) {
            return false;
        }
        let slot = p.slot;
        let Some(conn) = self
            .sockets
            .queues
            .get_mut(slot)
            .and_then(VecDeque::pop_front)
        else {
            return false;
        };
        self.take(pid, conn, false);
        true
    }

    /// The supervisor exits: every slot's socket closes, and the
    /// connections on them, or still in their handshake, are reset.
    pub(super) fn close_sockets(&mut self) {
        for queue in &mut self.sockets.queues {
            for conn in queue.drain(..) {
                self.world.conns[conn as usize] = Conn::Closed;
            }
        }
        let in_handshake: Vec<u64> = self
            .world
            .conns
            .iter()
            .enumerate()
            .filter(|&(i, c)| *c == Conn::Queued && !self.world.backlog.contains(&(i as u64)))
            .map(|(i, _)| i as u64)
            .collect();
        for conn in in_handshake {
            self.world.conns[conn as usize] = Conn::Closed;
        }
    }

    /// Told to quit (or killed): the shell stores busy and takes the
    /// slot's sockets out of the array before the `Q` goes; what was
    /// queued there is the child's to serve, or the supervisor's to hand
    /// on once the child is gone.
    pub(super) fn kernel_quit(&mut self, pid: i32) {
        let Some(p) = self.world.procs.get_mut(&pid) else {
            return;
        };
        let slot = p.slot;
        if let Some(r) = p.board.as_mut() {
            r.word = Word::Busy;
            self.sockets.grow(slot);
            self.sockets.off[slot] = true;
        }
    }

    /// A messages worker finished a connection: the next queued on its
    /// own socket, else on the overflow, with `N`; else `I`. Told to quit,
    /// it says `I` and serves what its socket holds as it leaves.
    fn messages_worker_finished(&mut self, pid: i32, slot: usize, told_quit: bool) -> bool {
        if !told_quit {
            let own = self
                .sockets
                .queues
                .get_mut(slot)
                .and_then(VecDeque::pop_front);
            if let Some(conn) = own.or_else(|| self.world.backlog.pop_front()) {
                self.take(pid, conn, true);
                return true;
            }
        }
        self.report(slot, ChildMessage::Idle);
        true
    }

    /// Whether the worker `pid` takes what is queued on its socket now: a
    /// `K` worker waiting there, a messages worker whenever it is not
    /// serving (told to quit, it serves its socket as it leaves).
    fn waits_on_socket(&self, pid: i32, r: Record) -> bool {
        let p = &self.world.procs[&pid];
        let free = if p.said_g { !p.told_quit } else { r.waiting() };
        free && p.serving.is_none()
    }

    fn is_off(&self, slot: usize) -> bool {
        self.sockets.off.get(slot).copied().unwrap_or(false)
    }

    fn record_mut(&mut self, pid: i32) -> &mut Record {
        self.world
            .procs
            .get_mut(&pid)
            .and_then(|p| p.board.as_mut())
            .expect("a record")
    }

    /// The live workers with a record, lowest slot first: the program's
    /// socket array, as the slots' processes hold their sockets.
    fn seated(&self) -> impl Iterator<Item = (usize, i32, Record)> + '_ {
        self.core.board.iter().filter_map(|(slot, s)| {
            let p = self.world.procs.get(&s.pid).filter(|p| !p.exited)?;
            Some((slot, s.pid, p.board?))
        })
    }

    /// The supervisor's reading of the board, each turn: the records, the
    /// reservations, and (after a takeover) what waits on a busy child's
    /// socket, handed on.
    pub(super) fn read_board(&mut self) {
        let now = self.now();
        let now_ns = self.world.now;
        let seated: Vec<(usize, i32, Record)> = self.seated().collect();
        let mut look = ReservationLook {
            taken_over: self.sockets.taken_over,
            ..ReservationLook::default()
        };
        for &(slot, pid, r) in &seated {
            let scramble = |n: u64, rng: &mut super::rng::Rng| match rng.below(3) {
                0 => n,
                1 => rng.below(u64::MAX),
                _ => 0,
            };
            let busy = r.word == Word::Busy;
            let sample = if r.liar {
                Sample {
                    busy,
                    taken: scramble(r.taken, &mut self.world.rng),
                    served: scramble(r.served, &mut self.world.rng),
                    next: scramble(r.next, &mut self.world.rng),
                }
            } else {
                Sample {
                    busy,
                    taken: r.taken,
                    served: r.served,
                    next: r.next,
                }
            };
            self.core.sampled(slot, sample, now);
            if let Word::Reserved(at) = r.word {
                if reservations::young(at, now_ns) {
                    look.young += 1;
                    let left = reservations::hold_left(at, now_ns);
                    look.hold_left = Some(look.hold_left.map_or(left, |l: Duration| l.min(left)));
                } else if reservations::given_back(at, now_ns, self.core.config.defer_accept) {
                    self.record_mut(pid).word = Word::Idle;
                    look.released += 1;
                }
            }
        }
        self.core.board_read(look, now);
        self.sockets.spread = self.core.spread_over();
        if self.core.behind_look_due(now) {
            let behind = self.waiting_behind();
            self.core.looked_behind(behind, now);
            self.take_what_waits_behind();
        }
    }

    /// Connections on the socket of a child that is not waiting there
    /// (busy, or leaving) go to the overflow for an idle child, while one
    /// can be claimed.
    fn take_what_waits_behind(&mut self) {
        if !self.core.hands_on() {
            return;
        }
        let behind: Vec<usize> = (0..self.sockets.queues.len())
            .filter(|&slot| !self.sockets.queues[slot].is_empty())
            .filter(|&slot| {
                self.seated()
                    .find(|&(s, _, _)| s == slot)
                    .is_none_or(|(_, _, r)| !r.waiting())
            })
            .collect();
        for slot in behind {
            if self.core.board.idle_slots().next().is_none() {
                return;
            }
            self.outcome.rescued += self.sockets.queues[slot].len() as u64;
            self.orphans(slot);
        }
    }

    /// Connections on the sockets of children not waiting there: they
    /// wait for a child like the overflow's, for the scaling rule too.
    pub(super) fn waiting_behind(&self) -> u32 {
        (0..self.sockets.queues.len())
            .filter(|&slot| {
                // A child told to quit serves what was queued on it (or,
                // if it hangs, the supervisor hands it on once the child
                // is killed, by `exit_timeout`): not counted here.
                !self.is_off(slot)
                    && self
                        .seated()
                        .find(|&(s, _, _)| s == slot)
                        .is_none_or(|(_, pid, r)| {
                            !r.waiting() || self.world.procs[&pid].serving.is_some()
                        })
            })
            .map(|slot| self.sockets.queues[slot].len() as u32)
            .sum()
    }

    /// What waits behind children as [`Sim::waiting_behind`] counts it,
    /// less what waits on a messages worker's own socket.
    fn waiting_behind_others(&self) -> u32 {
        let on_messages_worker = |slot: usize| {
            self.seated()
                .find(|&(s, _, _)| s == slot)
                .is_some_and(|(_, pid, _)| self.world.procs[&pid].said_g)
        };
        // And what waits on the socket of a slot with no worker on it yet
        // (empty, or starting) in a pool that cannot hand it on: for the
        // slot's next worker (`check_refill`).
        let refilled =
            |slot: usize| !self.core.hands_on() && self.seated().all(|(s, _, _)| s != slot);
        let theirs: u32 = (0..self.sockets.queues.len())
            .filter(|&slot| !self.is_off(slot) && (on_messages_worker(slot) || refilled(slot)))
            .map(|slot| self.sockets.queues[slot].len() as u32)
            .sum();
        self.waiting_behind() - theirs.min(self.waiting_behind())
    }

    /// Whether, as the world is, every child is taken: none waits on its
    /// socket idle or under a dead reservation, and the core counts none
    /// idle that is not on the board.
    fn every_child_taken(&self) -> bool {
        let now = self.world.now;
        let on_board_free = self.seated().any(|(_, _, r)| match r.word {
            Word::Idle => true,
            Word::Reserved(at) => !reservations::young(at, now),
            Word::Busy => false,
        });
        // A child the core counts idle that is not on the board (one it
        // hands connections to, or one it does not know is gone yet), or
        // whose record says busy (a worker that scrambles its counts is
        // not believed busy): the core cannot know it is taken.
        let off_board_idle = self.core.board.idle_slots().any(|slot| {
            self.seated()
                .find(|&(s, _, _)| s == slot)
                .is_none_or(|(_, _, r)| r.word == Word::Busy)
        });
        !on_board_free && !off_board_idle
    }

    /// The scaling rule, asked this turn with connections waiting and
    /// every child taken (young reservations included), grows the pool
    /// while it may.
    fn check_growth(&self, decision: Decision) -> Result<(), String> {
        // What waits behind busy children as the shell last looked (it
        // looks every 12 ms, not on every turn).
        let waiting = self.world.backlog.len() as u32 + self.core.queued_behind(self.now());
        let counts = self.core.board.counts();
        if waiting > 0
            && self.every_child_taken()
            && counts.starting == 0
            && counts.live() < self.core.config.max_children
            && self.core.board.width().is_none()
            && !self.core.rolling()
            && !matches!(decision, Decision::Spawn(_))
        {
            let line = self.core.board.line();
            let words: Vec<(usize, Word, bool)> =
                self.seated().map(|(s, _, r)| (s, r.word, r.liar)).collect();
            return Err(format!(
                "{waiting} connections wait, every child is taken ({} busy, {} reserved), \
                 {} of at most {}, and the pool does not grow: {decision:?} ({counts:?}, \
                 board {line}, records {words:?})",
                counts.busy,
                self.core.young_reservations(),
                counts.live(),
                self.core.config.max_children
            ));
        }
        Ok(())
    }

    /// At the end of a turn: the core hears whether connections wait.
    pub(super) fn tell_waiting(&mut self) {
        self.core
            .connections_waiting(!self.world.backlog.is_empty());
    }

    /// A connection waits (on the overflow, or on the socket of a child
    /// not waiting there) while a child that could take it is idle or
    /// held by a dead reservation: never for long. And the pool grows
    /// while connections wait and every child is taken.
    pub(super) fn check_network(&mut self, decision: Option<Decision>) -> Result<(), String> {
        if !self.scenario.kernel || self.core.shutdown.is_some() {
            self.sockets.stalled_since = None;
            return Ok(());
        }
        let now = self.world.now;
        let bound = self.core.board.dispatch_bound().unwrap_or(usize::MAX);
        // Behind a busy messages worker a connection waits for that worker
        // (nobody could be handed it; the spread put it there): the price
        // of the path, bounded by the worker's busy timeout, not a stall.
        let waiting_behind = self.waiting_behind_others() > 0;
        let waiting = !self.world.backlog.is_empty() || waiting_behind;
        let free = self.seated().any(|(slot, pid, r)| {
            let p = &self.world.procs[&pid];
            let free_word = match r.word {
                Word::Idle => true,
                Word::Reserved(at) => !reservations::young(at, now),
                Word::Busy => false,
            };
            free_word
                && slot < bound
                && !self.is_off(slot)
                && !p.told_quit
                && p.serving.is_none()
                && self.core.board.idle_slots().any(|s| s == slot)
        });
        match (waiting && free, self.sockets.stalled_since) {
            (false, _) => self.sockets.stalled_since = None,
            (true, None) => self.sockets.stalled_since = Some(now),
            (true, Some(since)) if now - since > STALL_AT_MOST => {
                let behind: Vec<QueueSeen> = (0..self.sockets.queues.len())
                    .filter(|&s| !self.sockets.queues[s].is_empty())
                    .map(|s| {
                        let w = self.seated().find(|&(x, _, _)| x == s).map(|(_, pid, r)| {
                            let p = &self.world.procs[&pid];
                            (r.word, p.told_quit, p.serving.is_some())
                        });
                        (s, self.sockets.queues[s].len(), w)
                    })
                    .collect();
                return Err(format!(
                    "a connection waited {} ms while a child that could take it was idle or \
                     held by a dead reservation (overflow {}, behind a busy child: {}; \
                     queues (slot, len, (word, told quit, serving)) {behind:?}; window {})",
                    (now - since) / MS,
                    self.world.backlog.len(),
                    waiting_behind,
                    self.core.may_wait_behind(self.now())
                ));
            }
            (true, Some(_)) => {}
        }
        if let Some(decision) = decision {
            self.check_growth(decision)?;
        }
        self.check_refill()
    }

    /// A slot that waits for a worker gets one: never for longer than
    /// [`REFILL_AT_MOST`] while the core could start one.
    fn check_refill_starts(&mut self) -> Result<(), String> {
        let now = self.world.now;
        let waiting: Vec<usize> = (0..self.sockets.queues.len())
            .filter(|&slot| {
                !self.sockets.queues[slot].is_empty()
                    && self.core.board.get(slot).is_none()
                    && self.core.refill_pending(slot)
            })
            .collect();
        self.sockets
            .refill_since
            .retain(|slot, _| waiting.contains(slot));
        let may_spawn = self.core.may_spawn(self.now());
        for slot in waiting {
            let since = *self.sockets.refill_since.entry(slot).or_insert(now);
            if may_spawn && now - since > REFILL_AT_MOST {
                return Err(format!(
                    "slot {slot} has waited {} ms for a worker to take what its socket holds, \
                     and the core could start one",
                    (now - since) / MS
                ));
            }
        }
        Ok(())
    }

    /// In a pool that cannot hand connections on, an empty slot whose
    /// socket holds some waits for a worker: the core must know, and start
    /// one there.
    fn check_refill(&mut self) -> Result<(), String> {
        if self.core.hands_on() {
            return Ok(());
        }
        self.check_refill_starts()?;
        for (slot, queue) in self.sockets.queues.iter().enumerate() {
            if !queue.is_empty()
                && self.core.board.get(slot).is_none()
                && !self.core.refill_pending(slot)
            {
                return Err(format!(
                    "{} connections wait on empty slot {slot}'s socket and the core will not \
                     start a worker there",
                    queue.len()
                ));
            }
        }
        Ok(())
    }
}
