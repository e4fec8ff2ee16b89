//! `kernel` dispatch in the simulator: the world plays the eBPF program
//! and the scoreboard. A worker that says `K` keeps a record (once seated:
//! at once when exec'd, on `S` when a template forked it); the program
//! gives each arriving connection to the lowest idle record, and the rest
//! wait on the overflow, which finishing workers take from themselves and
//! the core hands on (claiming the record first). The core learns only by
//! reading the records each turn (`Core::sampled`), as the supervisor does;
//! some workers scramble their counts, which must not break anything.
//! The program and the finishing workers keep to the dispatch width's
//! bound, as the real ones read it in word 5.

use super::world::{Conn, Happening};
use super::Sim;
use crate::core::sampled::Sample;
use crate::protocol::ChildMessage;

/// A worker's record on the simulated scoreboard.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Record {
    pub idle: bool,
    pub taken: u64,
    pub served: u64,
    pub next: u64,
    /// It writes nonsense into its counts.
    pub liar: bool,
}

impl Sim {
    /// In kernel dispatch, most workers keep the board (`K`), a few say
    /// `R` and are served as in handoff. Returns the first message.
    pub(super) fn kernel_first_message(&mut self, pid: i32) -> ChildMessage {
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
                idle: true,
                liar,
                ..Record::default()
            });
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
            idle: !p.told_quit,
            liar: p.liar,
            ..Record::default()
        });
        self.outcome.seats += 1;
        Ok(())
    }

    /// The program: each waiting connection to the lowest idle record.
    pub(super) fn kernel_picks(&mut self) {
        let bound = self.core.board.dispatch_bound().unwrap_or(usize::MAX);
        while let Some(&conn) = self.world.backlog.front() {
            let pick = self
                .seated()
                .find(|&(slot, _, r)| r.idle && slot < bound)
                .map(|(_, pid, _)| pid);
            let Some(pid) = pick else {
                return;
            };
            self.world.backlog.pop_front();
            self.take(pid, conn, false);
            self.outcome.kernel_taken += 1;
        }
    }

    /// The worker `pid` takes `conn` itself (from its socket, or the
    /// overflow as it finished one).
    fn take(&mut self, pid: i32, conn: u64, next: bool) {
        let p = self.world.procs.get_mut(&pid).expect("alive");
        let record = p.board.as_mut().expect("on the board");
        record.idle = false;
        record.taken += 1;
        if next {
            record.next += 1;
        }
        p.serving = Some(conn);
        self.world.conns[conn as usize] = Conn::Held(pid);
        let t = self.world.ms(1, 40);
        self.world.at(t, Happening::Finish(pid, conn));
    }

    /// The core hands a connection to `pid`: a worker on the board must be
    /// idle there, and is claimed (busy) first; false if it was not.
    pub(super) fn claim(&mut self, pid: i32) -> bool {
        match self
            .world
            .procs
            .get_mut(&pid)
            .and_then(|p| p.board.as_mut())
        {
            None => true,
            Some(r) if r.idle => {
                r.idle = false;
                true
            }
            Some(_) => false,
        }
    }

    /// A worker on the board finished a connection: it counts it, takes
    /// the next from the overflow if one waits, or goes idle (and wakes
    /// the core with `I` while connections wait). True if it is on the
    /// board (the handoff report is then not sent).
    pub(super) fn kernel_finished(&mut self, pid: i32, slot: usize) -> bool {
        let Some(p) = self.world.procs.get_mut(&pid) else {
            return false;
        };
        let told_quit = p.told_quit;
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
        if let Some(conn) = within.then(|| self.world.backlog.pop_front()).flatten() {
            self.take(pid, conn, true);
            return true;
        }
        record.idle = true;
        if !self.world.backlog.is_empty() {
            self.report(slot, ChildMessage::Idle);
        }
        true
    }

    /// Told to quit: the shell stores busy before the `Q` goes.
    pub(super) fn kernel_quit(&mut self, pid: i32) {
        if let Some(r) = self
            .world
            .procs
            .get_mut(&pid)
            .and_then(|p| p.board.as_mut())
        {
            r.idle = false;
        }
    }

    /// The live workers with a record, lowest slot first: the program's
    /// socket array, as the slots' processes hold their sockets.
    fn seated(&self) -> impl Iterator<Item = (usize, i32, Record)> + '_ {
        self.core.board.iter().filter_map(|(slot, s)| {
            let p = self.world.procs.get(&s.pid).filter(|p| !p.exited)?;
            Some((slot, s.pid, p.board?))
        })
    }

    /// The supervisor's reading of the board, each turn.
    pub(super) fn read_board(&mut self) {
        let now = self.now();
        let seated: Vec<(usize, i32, Record)> = self.seated().collect();
        for (slot, _, r) in seated {
            let scramble = |n: u64, rng: &mut super::rng::Rng| match rng.below(3) {
                0 => n,
                1 => rng.below(u64::MAX),
                _ => 0,
            };
            let sample = if r.liar {
                Sample {
                    busy: !r.idle,
                    taken: scramble(r.taken, &mut self.world.rng),
                    served: scramble(r.served, &mut self.world.rng),
                    next: scramble(r.next, &mut self.world.rng),
                }
            } else {
                Sample {
                    busy: !r.idle,
                    taken: r.taken,
                    served: r.served,
                    next: r.next,
                }
            };
            self.core.sampled(slot, sample, now);
        }
    }
}
