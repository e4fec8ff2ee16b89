//! Children the kernel vouches for: a worker ordered from a template
//! (`--preload`) gets a pid in its slot, and may be signalled, only once
//! the kernel has confirmed which process it is.
//!
//! A template says which pid it forked (`W`), but a template is code the
//! supervisor does not control: it may name a sidecar the supervisor's
//! wrapper started, any orphan adopted by a supervisor running as PID 1,
//! the template itself, or a process in another slot. Taking its word
//! would let it get the supervisor to `SIGKILL` a process outside the
//! pool. So the `W` is kept as a *claim* (`ChildLink::claimed`), and the
//! worker's slot gets its pid only when all of these hold:
//! - the worker's first message on its channel carries the sender's pid
//!   from the kernel (`SCM_CREDENTIALS`, asked for with `SO_PASSCRED` on
//!   the supervisor's end before the other end went to the template), and
//!   it is the pid claimed;
//! - that process is the supervisor's child (reparented to it, the child
//!   subreaper), so its pid cannot be reused before the supervisor reaps it;
//! - no slot and no template holds that pid already.
//!
//! Anything else is the template's fault: its whole process group is
//! killed (the unverified workers it forked are in that group) and the
//! slot is freed, counted as a failed start. A claimed worker that
//! vanishes without being reaped (a template that ignores `SIGCHLD` lets
//! the kernel reap it) is counted `lost` and its slot freed once its
//! deadline passes. No signal ever goes to a claimed pid.

use std::time::Instant;

use tracing::warn;

use super::Supervisor;
use crate::observe::procfs::parent_of;
use crate::policy::verification::{self, FirstMessage, GaveUp};

/// Unverified workers (fork orders unanswered, or claimed and silent) one
/// template may have at once: a template that never delivers a worker
/// cannot make the supervisor open channels and slots without end.
pub(super) const UNVERIFIED_PER_TEMPLATE: usize = 8;

impl Supervisor {
    /// Whether the slot holds a worker ordered from a template whose pid
    /// the kernel has not confirmed yet.
    pub(super) fn unverified(&self, slot: usize) -> bool {
        self.core.unverified(slot)
    }

    /// Workers of `generation` not verified yet.
    pub(super) fn unverified_of(&self, generation: u32) -> usize {
        self.core
            .board
            .iter()
            .filter(|(slot, s)| s.generation == generation && self.unverified(*slot))
            .count()
    }

    /// The first message from the unverified worker in `slot`, sent by
    /// `sender` as the kernel says: the slot gets its pid if the template's
    /// claim matches. `Ok(false)` when the slot was freed meanwhile (its
    /// template's answer said the worker already died); `Err` is the lie.
    pub(super) fn verify_worker(
        &mut self,
        slot: usize,
        sender: Option<i32>,
        now: Instant,
    ) -> Result<bool, String> {
        if self
            .core
            .board
            .link(slot)
            .is_some_and(|l| l.child.claimed.is_none())
        {
            // The template's `W` was sent before this; read it first.
            self.learn_pid_from_template(slot, now);
        }
        let Some(link) = self.core.board.link(slot) else {
            return Ok(false);
        };
        if self.core.board.get(slot).is_some_and(|s| s.pid != 0) {
            return Ok(true);
        }
        let facts = FirstMessage {
            claimed: link.child.claimed,
            sender,
            sender_is_child: sender.is_some_and(|p| self.is_our_child(p)),
            sender_taken: sender.is_some_and(|p| self.pid_taken(p, Some(slot))),
        };
        let sender = verification::verify(facts).map_err(|lie| lie.describe(slot))?;
        self.core.board.set_pid(slot, sender);
        if let Some(link) = self.core.board.link_mut(slot) {
            link.child.claimed = None;
            // The supervisor's unreaped child: the pid is certainly it.
            link.pidfd = super::children::hold(sender);
        }
        Ok(true)
    }

    /// Whether a template or a slot (other than `except`) holds `pid`,
    /// or such a slot claims it.
    pub(super) fn pid_taken(&self, pid: i32, except: Option<usize>) -> bool {
        self.core
            .board
            .iter()
            .filter(|(slot, _)| Some(*slot) != except)
            .any(|(_, s)| s.pid == pid || s.link.child.claimed == Some(pid))
            || self.templates.list.iter().any(|t| t.pid == pid)
    }

    /// The slot whose template claimed `pid` for it and whose worker has
    /// not been verified: the slot a reaped `pid` belongs to.
    pub(super) fn slot_claiming(&self, pid: i32) -> Option<usize> {
        self.core
            .board
            .iter()
            .find(|(_, s)| s.pid == 0 && s.link.child.claimed == Some(pid))
            .map(|(slot, _)| slot)
    }

    /// The template of the unverified worker in `slot` lied or failed it
    /// (`why`): the template's group is killed and the slot freed, as a
    /// failed start.
    pub(super) fn template_failed_worker(&mut self, slot: usize, why: String, now: Instant) {
        if let Some(generation) = self.core.board.get(slot).map(|s| s.generation) {
            self.kill_template(generation, why);
        }
        self.abandon_unverified(slot);
        self.count_failed_start(now);
    }

    /// The unverified worker in `slot` missed a deadline (`detail`). If
    /// its claimed process is gone, or is not the supervisor's child, it
    /// vanished without being reaped: counted `lost`. Otherwise its
    /// template is at fault. Either way the slot is freed, and no signal
    /// goes to the claimed pid.
    pub(super) fn give_up_unverified(&mut self, slot: usize, detail: &str, now: Instant) {
        let claim = self.core.board.link(slot).and_then(|l| l.child.claimed);
        let claimed_is_child = claim.is_some_and(|p| self.is_our_child(p));
        match (claim, verification::gave_up(claim, claimed_is_child)) {
            (Some(pid), GaveUp::Lost) => {
                self.core.totals.lost += 1;
                warn!(
                    slot,
                    pid,
                    "the worker the template forked for slot {slot} vanished without being \
                     reaped by the supervisor (the template or its intermediate reaped it, \
                     e.g. by ignoring SIGCHLD: see docs/protocol.md); counted lost"
                );
                self.abandon_unverified(slot);
                if self.core.shutdown.is_none() {
                    self.count_failed_start(now);
                }
            }
            _ if self.core.shutdown.is_some() => {
                if let Some(generation) = self.core.board.get(slot).map(|s| s.generation) {
                    self.kill_template(generation, format!("its worker for slot {slot} {detail}"));
                }
                self.abandon_unverified(slot);
            }
            _ => self.template_failed_worker(
                slot,
                format!("its worker for slot {slot} {detail} before the kernel vouched for it"),
                now,
            ),
        }
    }

    /// Whether the process the template claimed for `slot` is not (or no
    /// longer) the supervisor's child: reaped by someone else, or never
    /// ours. A zombie the supervisor has not reaped yet is still its child.
    pub(super) fn claim_vanished(&self, slot: usize) -> bool {
        self.core
            .board
            .link(slot)
            .and_then(|l| l.child.claimed)
            .is_some_and(|pid| !self.is_our_child(pid))
    }

    /// Whether `pid` is this process's child (a zombie not reaped yet
    /// included), as `/proc` says.
    fn is_our_child(&self, pid: i32) -> bool {
        parent_of(pid) == Some(self.pid as i32)
    }

    /// Frees `slot`, whose worker was never verified: no process to
    /// signal or reap as its own, only the supervisor's ends to close and
    /// the template's order to forget.
    pub(super) fn abandon_unverified(&mut self, slot: usize) {
        let Some(generation) = self.core.board.get(slot).map(|s| s.generation) else {
            return;
        };
        self.templates.forget_order(generation, slot);
        if let Some(mut child) = self.core.board.vacate(slot) {
            if let Some(output) = child.link.output.take() {
                self.forget_output(&output);
            }
            self.release_order(&child.link);
            self.deregister_channel(&child.link.channel);
        }
    }

    /// A worker did not start: hold spawns back as the back-off says.
    pub(super) fn count_failed_start(&mut self, now: Instant) {
        self.core.count_failed_start(now);
    }
}
