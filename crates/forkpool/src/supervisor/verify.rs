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
//! - no slot and no template holds that pid already;
//! - that process started after its fork order was sent (the kernel's
//!   start time) and is in its template's process group: a sender with
//!   `CAP_SYS_ADMIN`, a template run as root, can put any pid in its
//!   credentials, but cannot make a process it did not fork (a sidecar,
//!   an orphan adopted later) younger than the order or a member of its
//!   group.
//!
//! Anything else is the template's fault: its whole process group is
//! killed (the unverified workers it forked are in that group) and the
//! slot is freed, counted as a failed start. A claimed worker that
//! vanishes without being reaped (a template that ignores `SIGCHLD` lets
//! the kernel reap it) is counted `lost` and its slot freed once its
//! deadline passes. No signal ever goes to a claimed pid.

use std::time::Instant;

use super::Supervisor;
use crate::observe::procfs::{parent_of, stat_of, Stat};

impl Supervisor {
    /// Whether the slot holds a worker ordered from a template whose pid
    /// the kernel has not confirmed yet.
    pub(super) fn unverified(&self, slot: usize) -> bool {
        self.core.unverified(slot)
    }

    /// The first message from the unverified worker in `slot`, sent by
    /// `sender` as the kernel says: the slot gets its pid if the template's
    /// claim matches (`core/vouch.rs`). `Ok(false)` when the slot was freed
    /// meanwhile (its template's answer said the worker already died);
    /// `Err` is the lie.
    pub(super) fn verify_worker(
        &mut self,
        slot: usize,
        sender: Option<i32>,
        now: Instant,
    ) -> Result<bool, String> {
        if self
            .core
            .board()
            .link(slot)
            .is_some_and(|l| l.child.role.claimed.is_none())
        {
            // The template's `W` was sent before this; read it first.
            self.learn_pid_from_template(slot, now);
        }
        if self.core.board().link(slot).is_none() {
            return Ok(false);
        }
        if self.core.board().get(slot).is_some_and(|s| s.pid != 0) {
            return Ok(true);
        }
        // One read of the sender's record gives its parent, start and group.
        let record = sender.and_then(stat_of);
        let sender_is_child = record.is_some_and(|r| r.ppid == self.published.pid as i32);
        // Credentials can be forged by a sender with CAP_SYS_ADMIN (a
        // template run as root): the process must also be one its template
        // forked, as far as the kernel's records tell: started after the
        // order, and still in the template's process group.
        let ordered_at = self
            .core
            .board()
            .link(slot)
            .and_then(|l| l.ordered_at_ticks);
        let template_group = self
            .core
            .board()
            .get(slot)
            .and_then(|s| self.core.template(s.generation))
            .map(|t| t.role.pid);
        let from_template = forked_by_template(record, ordered_at, template_group);
        let pid = self
            .core
            .verify(slot, sender, sender_is_child, from_template)?;
        if let Some(link) = self.core.link_mut(slot) {
            // The supervisor's unreaped child: the pid is certainly it.
            link.pidfd = super::children::hold(pid);
        }
        Ok(true)
    }

    /// The template of the unverified worker in `slot` lied or failed it.
    pub(super) fn template_failed_worker(&mut self, slot: usize, why: String, now: Instant) {
        self.core.template_failed_worker(slot, why, now);
        self.carry_out(now);
    }

    /// The unverified worker in `slot` missed a deadline (`detail`): the
    /// core decides, once told whether the claimed process is still the
    /// supervisor's child.
    pub(super) fn give_up_unverified(&mut self, slot: usize, detail: &str, now: Instant) {
        let claim = self
            .core
            .board()
            .link(slot)
            .and_then(|l| l.child.role.claimed);
        let claimed_is_child = claim.is_some_and(|p| self.is_our_child(p));
        self.core
            .give_up_unverified(slot, detail, claimed_is_child, now);
        self.carry_out(now);
    }

    /// Whether the process the template claimed for `slot` is not (or no
    /// longer) the supervisor's child: reaped by someone else, or never
    /// ours. A zombie the supervisor has not reaped yet is still its child.
    pub(super) fn claim_vanished(&self, slot: usize) -> bool {
        self.core
            .board()
            .link(slot)
            .and_then(|l| l.child.role.claimed)
            .is_some_and(|pid| !self.is_our_child(pid))
    }

    /// Whether `pid` is this process's child (a zombie not reaped yet
    /// included), as `/proc` says.
    fn is_our_child(&self, pid: i32) -> bool {
        parent_of(pid) == Some(self.published.pid as i32)
    }

    /// Carries out [`crate::core::Effect::Abandoned`]: the shell's ends
    /// of a worker never verified are closed.
    pub(super) fn close_abandoned(&mut self, slot: usize, link: &super::ChildLink) {
        tracing::debug!(slot, "freed the slot of a worker never verified");
        if let Some(output) = &link.output {
            self.forget_output(output);
        }
        self.release_order(link);
        self.deregister_channel(&link.channel);
    }
}

/// Whether the process of `record` is one its template forked, as far as
/// the kernel's records tell: started no earlier than the order (the boot
/// clock's ticks `ordered_at`), and still in the process group of the
/// template (`template`, its pid). Without any of the three, it is not.
fn forked_by_template(
    record: Option<Stat>,
    ordered_at: Option<u64>,
    template: Option<i32>,
) -> bool {
    match (record, ordered_at, template) {
        (Some(r), Some(order), Some(template)) => r.start_ticks >= order && r.pgrp == template,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_is_the_templates_if_it_started_after_the_order_in_its_group() {
        let worker = Stat {
            state: 'S',
            ppid: 1,
            pgrp: 500,
            utime_ticks: 0,
            stime_ticks: 0,
            start_ticks: 1000,
        };
        assert!(forked_by_template(Some(worker), Some(1000), Some(500)));
        // Older than the order: a process that was there before.
        assert!(!forked_by_template(Some(worker), Some(1001), Some(500)));
        // In another group: not the template's.
        assert!(!forked_by_template(Some(worker), Some(900), Some(501)));
        // Nothing to compare with: not vouched for.
        assert!(!forked_by_template(None, Some(900), Some(500)));
        assert!(!forked_by_template(Some(worker), None, Some(500)));
        assert!(!forked_by_template(Some(worker), Some(900), None));
    }
}
