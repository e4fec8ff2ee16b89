//! Children the kernel vouches for: a worker ordered from a template gets
//! a pid in its slot, and may be signalled, only once the kernel has
//! confirmed which process it is (see `supervisor/verify.rs` for what the
//! shell asks the kernel). Here: the claims, the verdicts, and what a lie
//! costs the template.

use std::time::Instant;

use tracing::warn;

use super::child::HasChild;
use super::effect::{Abandoned, Effect};
use super::Core;
use crate::policy::verification::{self, FirstMessage, GaveUp};

/// Unverified workers (fork orders unanswered, or claimed and silent) one
/// template may have at once: a template that never delivers a worker
/// cannot make the supervisor open channels and slots without end.
pub(crate) const UNVERIFIED_PER_TEMPLATE: usize = 8;

impl<L: HasChild> Core<L> {
    /// Workers of `generation` not verified yet.
    pub fn unverified_of(&self, generation: u32) -> usize {
        self.board
            .iter()
            .filter(|(slot, s)| s.generation == generation && self.unverified(*slot))
            .count()
    }

    /// Whether a template or a slot (other than `except`) holds `pid`, or
    /// such a slot claims it.
    pub fn pid_taken(&self, pid: i32, except: Option<usize>) -> bool {
        self.board
            .iter()
            .filter(|(slot, _)| Some(*slot) != except)
            .any(|(_, s)| s.pid == pid || s.link.child().role.claimed == Some(pid))
            || self.templates.iter().any(|t| t.role.pid == pid)
    }

    /// The slot whose template claimed `pid` for it and whose worker has
    /// not been verified: the slot a reaped `pid` belongs to.
    pub fn slot_claiming(&self, pid: i32) -> Option<usize> {
        self.board
            .iter()
            .find(|(_, s)| s.pid == 0 && s.link.child().role.claimed == Some(pid))
            .map(|(slot, _)| slot)
    }

    /// The slot `pid` holds, or whose template claimed it.
    pub fn slot_of(&self, pid: i32) -> Option<usize> {
        self.board
            .slot_of_pid(pid)
            .or_else(|| self.slot_claiming(pid))
    }

    /// The first message from the unverified worker in `slot`, sent by
    /// `sender` as the kernel says (`sender_is_child`: that process is the
    /// supervisor's child): the slot gets its pid if the template's claim
    /// matches. `Err` is the lie.
    pub fn verify(
        &mut self,
        slot: usize,
        sender: Option<i32>,
        sender_is_child: bool,
        sender_from_template: bool,
    ) -> Result<i32, String> {
        let claimed = self.board.link(slot).and_then(|l| l.child().role.claimed);
        let facts = FirstMessage {
            claimed,
            sender,
            sender_is_child,
            sender_taken: sender.is_some_and(|p| self.pid_taken(p, Some(slot))),
            sender_from_template,
        };
        let pid = verification::verify(facts).map_err(|lie| lie.describe(slot))?;
        self.board.set_pid(slot, pid);
        if let Some(link) = self.board.link_mut(slot) {
            link.child_mut().role.claimed = None;
        }
        Ok(pid)
    }

    /// The template of the unverified worker in `slot` lied or failed it
    /// (`why`): the template's group is killed and the slot freed, as a
    /// failed start.
    pub fn template_failed_worker(&mut self, slot: usize, why: String, now: Instant) {
        if let Some(generation) = self.board.get(slot).map(|s| s.generation) {
            self.kill_template(generation, why);
        }
        self.abandon_unverified(slot);
        self.count_failed_start(now);
    }

    /// The unverified worker in `slot` missed a deadline (`detail`). If
    /// its claimed process is gone, or is not the supervisor's child
    /// (`claimed_is_child`, as `/proc` says), it vanished without being
    /// reaped: counted `lost`. Otherwise its template is at fault. Either
    /// way the slot is freed, and no signal goes to the claimed pid.
    pub fn give_up_unverified(
        &mut self,
        slot: usize,
        detail: &str,
        claimed_is_child: bool,
        now: Instant,
    ) {
        let claim = self.board.link(slot).and_then(|l| l.child().role.claimed);
        match (claim, verification::gave_up(claim, claimed_is_child)) {
            (Some(pid), GaveUp::Lost) => {
                self.totals.lost += 1;
                warn!(
                    slot,
                    pid,
                    "the worker the template forked for slot {slot} vanished without being \
                     reaped by the supervisor (the template or its intermediate reaped it, \
                     e.g. by ignoring SIGCHLD: see docs/protocol.md); counted lost"
                );
                let generation = self.board.get(slot).map(|s| s.generation);
                self.abandon_unverified(slot);
                if self.shutdown.is_none() {
                    self.count_failed_start(now);
                }
                if let Some(generation) = generation.filter(|g| self.rolling_in_unproven(*g)) {
                    // The new code's template loses every worker it forks.
                    let how = format!("vanished without being reaped (slot {slot})");
                    if let Some(failed) = self.rollout_start_failed(generation, how, now) {
                        self.effects.push(Effect::ReloadFailed(failed));
                    }
                }
            }
            _ if self.shutdown.is_some() => {
                if let Some(generation) = self.board.get(slot).map(|s| s.generation) {
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

    /// Frees `slot`, whose worker was never verified: no process to signal
    /// or reap as its own, only the shell's ends to close and the
    /// template's order to forget.
    pub fn abandon_unverified(&mut self, slot: usize) {
        let Some(generation) = self.board.get(slot).map(|s| s.generation) else {
            return;
        };
        if let Some(t) = self
            .templates
            .iter_mut()
            .find(|t| t.role.generation == generation)
        {
            t.role.pending.remove(&slot);
        }
        if let Some(entry) = self.board.vacate(slot) {
            self.effects.push(Effect::Abandoned(Abandoned {
                slot,
                link: entry.link,
            }));
        }
    }
}
