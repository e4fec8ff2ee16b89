//! The verbs that change a child's life in the core: retire, let leave,
//! kill, a closed channel, a failed send, and the end (reaped). Each
//! changes the slot through the transition table and asks the shell for
//! what must happen outside (send a quit, SIGKILL, stop reading).

use std::time::{Duration, Instant};

use tracing::{debug, error, info, warn};

use super::child::{own_life, HasChild, LeaveCause, LifeEvent};
use super::effect::{Effect, Gone};
use super::Core;
use crate::policy::backoff::{fails_a_reload, Verdict, START_WINDOW};
use crate::policy::liveness::{closed_channel_grace, unverified_closed_grace, Deadlines};
use crate::protocol::ParentMessage;
use crate::scoreboard::SlotState;
use crate::status::KillReason;
use crate::sys::process::ExitStatus;

/// How long a replacement waits for the reap of a child whose channel
/// closed unasked ([`Core::replacement_waits_until`]).
pub const REAP_WAIT: Duration = Duration::from_millis(100);

impl<L: HasChild> Core<L> {
    /// Whether the slot holds a worker ordered from a template whose pid
    /// the kernel has not confirmed yet: no signal may go to it.
    pub fn unverified(&self, slot: usize) -> bool {
        self.board.get(slot).is_some_and(|s| {
            s.pid == 0 && s.link.child().role.version == crate::protocol::TEMPLATE_VERSION
        })
    }

    /// Tells the child in `slot` to finish its connection, if any, and
    /// exit.
    pub fn retire(&mut self, slot: usize, reason: &str, now: Instant) {
        if !self.mark_leaving(slot, reason, now) {
            return;
        }
        let child = self.board.link(slot).expect("marked above").child();
        if child.channel_closed {
            // It is on its way out already; nothing can reach it.
        } else if self.config.dispatch.speaks_protocol() {
            self.effects.push(Effect::Send {
                slot,
                msg: ParentMessage::Quit,
            });
        } else if !self.unverified(slot) {
            // No channel to say quit on: SIGTERM, as systemd and every
            // init system would; SIGKILL follows at the leave deadline.
            self.effects.push(Effect::Terminate { slot });
        }
    }

    /// A child said it is leaving (`X`): it is retired like one told to
    /// quit, and sent nothing more, since it may have closed its channel.
    pub fn let_leave(&mut self, slot: usize, now: Instant) {
        self.mark_leaving(slot, "it asked to leave", now);
    }

    /// Marks the child in `slot` as leaving for `reason`, with its leave
    /// deadline. Returns false if it was told to go already.
    fn mark_leaving(&mut self, slot: usize, reason: &str, now: Instant) -> bool {
        let deadline = now + self.config.shutdown_timeout;
        let Some(pid) = self.board.get(slot).map(|s| s.pid) else {
            return false;
        };
        let asked = LifeEvent::Asked {
            why: reason.to_string(),
            by: deadline,
        };
        if self.move_worker(slot, asked, now).is_err() {
            // Told to go already, or killed.
            return false;
        }
        self.totals.retired += 1;
        debug!(slot, pid, "retiring child: {reason}");
        true
    }

    /// SIGKILLs the child in `slot` (through the shell) and marks it; it is
    /// reaped later. A worker the kernel has not vouched for is not
    /// signalled: its template answers for it.
    pub fn kill(&mut self, slot: usize, why: KillReason, detail: String, now: Instant) {
        let Some(entry) = self.board.get(slot) else {
            return;
        };
        if entry.state == SlotState::Killed {
            return;
        }
        if self.unverified(slot) {
            self.effects.push(Effect::GiveUpUnverified { slot, detail });
            return;
        }
        warn!(
            slot,
            pid = entry.pid,
            reason = why.key(),
            "killing child: {detail}"
        );
        self.effects.push(Effect::Kill { slot });
        // The slot was not killed (checked above), so neither was its
        // child's life.
        own_life(self.move_worker(slot, LifeEvent::Killed { why: detail }, now));
        self.totals.killed += 1;
        self.totals.killed_by.add(why);
        if let Some(link) = self.board.link_mut(slot) {
            if let Some(listener) = link.child_mut().role.ordered_on.take() {
                self.effects.push(Effect::OrderDropped { listener });
            }
        }
    }

    /// A 0-byte read: the child closed its channel, or sent an empty
    /// datagram (on `SOCK_SEQPACKET` the two read alike); `hung_up` tells
    /// them apart. A child that closed it is exiting and has
    /// `exit_timeout` for its tear-down (a large heap takes seconds); one
    /// that keeps it open sent the empty datagram the protocol forbids and
    /// has only a short grace. A deadline already set is only moved
    /// earlier.
    pub fn channel_closed(&mut self, slot: usize, hung_up: bool, now: Instant) {
        let unverified = self.unverified(slot);
        let limits = Deadlines::of(&self.config);
        let Some(link) = self.board.link_mut(slot) else {
            return;
        };
        let child = link.child_mut();
        let grace = if unverified {
            unverified_closed_grace(child.role.claimed.is_some(), &limits)
        } else {
            closed_channel_grace(hung_up, &limits)
        };
        child.channel_closed = true;
        child.role.hung_up = hung_up;
        self.effects.push(Effect::StopReading { slot });
        // No more work can reach it: it leaves the idle set. Its leaving
        // cause is a closed channel, so the end reports a death.
        own_life(self.move_worker(slot, LifeEvent::Closed { by: now + grace }, now));
    }

    /// A send to the child in `slot` failed. A child told to go, or whose
    /// channel closed, is leaving with a deadline: whatever the error, the
    /// failed send is neither a kill nor a failed start, and a child that
    /// did not hear its quit is killed at that deadline like any other
    /// that overstays. For any other child it means its channel is broken
    /// (`peer_gone` or not): it is killed.
    pub fn send_failed(&mut self, slot: usize, peer_gone: bool, detail: String, now: Instant) {
        let leaving = self
            .board
            .link(slot)
            .is_some_and(|l| l.child().told_to_leave() || l.child().channel_closed);
        if leaving {
            debug!(
                slot,
                peer_gone, "a send to a leaving child failed: {detail}"
            );
            return;
        }
        self.kill(slot, KillReason::ChannelFailed, detail, now);
    }

    /// The process `pid` was reaped with `status`: a template, a worker in
    /// a slot (or claimed for one), a binary upgrade's successor (which
    /// fails the upgrade), or a stranger the shell looks at.
    pub fn reaped_pid(&mut self, pid: i32, status: ExitStatus, now: Instant) {
        if self.template_exited(pid, status, now) {
            return;
        }
        match self.slot_of(pid) {
            Some(slot) => self.reaped(slot, pid, status, now),
            None if self.is_successor(pid) => {
                self.upgrade_failed();
                self.effects.push(Effect::SuccessorGone { pid, status });
            }
            None => self.effects.push(Effect::Stranger { pid, status }),
        }
    }

    /// The child in `slot`, `pid`, has been reaped with `status`: logs how
    /// it ended, judges its start and frees the slot; the shell gets what
    /// it kept for the child back in [`Effect::Gone`].
    pub fn reaped(&mut self, slot: usize, pid: i32, status: ExitStatus, now: Instant) {
        let verified = !self.unverified(slot);
        let Some(entry) = self.board.vacate(slot) else {
            return;
        };
        if !verified {
            // Its template no longer owes an answer for it.
            if let Some(t) = self
                .templates
                .iter_mut()
                .find(|t| t.role.generation == entry.generation)
            {
                t.role.pending.remove(&slot);
            }
        }
        let child = entry.link.child();
        let served = entry.served;
        match child.leave_cause() {
            Some(LeaveCause::Killed(reason)) => {
                info!(slot, pid, %status, served, "killed child reaped ({reason})");
            }
            Some(LeaveCause::Asked(reason)) => {
                info!(slot, pid, %status, served, "child exited ({reason})");
            }
            Some(LeaveCause::ChannelClosed) | None => {
                self.totals.died += 1;
                warn!(
                    slot,
                    pid,
                    %status,
                    served,
                    "child died unexpectedly; a replacement will be started"
                );
            }
        }
        let reload_failed = self
            .judge_start(child, status, now)
            .and_then(|how| self.rollout_start_failed(entry.generation, how, now));
        self.effects.push(Effect::Gone(Gone {
            slot,
            pid,
            verified,
            reload_failed,
            link: entry.link,
        }));
    }

    /// Called for every child reaped: a start-up failure holds spawns
    /// back; the death of a worker that had started is replaced (within
    /// the replacement rate). Returns how the child failed, if its end
    /// fails a reload that is rolling its generation in.
    fn judge_start(
        &mut self,
        child: &super::child::Child,
        status: ExitStatus,
        now: Instant,
    ) -> Option<String> {
        let asked = child.asked_to_leave() || self.shutdown.is_some();
        // A worker up since the last failure ends that run before this
        // end is counted.
        self.note_starts(now);
        let verdict = self.spawn_gate.child_exited(child.start(), asked, now);
        let how = match child.leave_cause() {
            Some(LeaveCause::Killed(reason)) => format!("killed: {reason}"),
            _ => status.to_string(),
        };
        if let Verdict::FailedStart { delay } = verdict {
            error!(
                "worker exited during start-up ({how}); check the command and its stderr: \
                 retrying in {delay:?}"
            );
            return Some(format!("exited during start-up ({how})"));
        }
        fails_a_reload(verdict, child.born, now)
            .then(|| format!("exited within {:?} of starting ({how})", START_WINDOW))
    }

    /// Tells the gate of every worker that has started, while a run of
    /// start-up failures holds spawns: one that started after the last
    /// failure ends the run and lifts its hold.
    pub fn note_starts(&mut self, now: Instant) {
        if !self.spawn_gate.failures_hold(now) {
            return;
        }
        for (_, entry) in self.board.iter() {
            if let Some(at) = entry
                .link
                .child()
                .start()
                .started_at()
                .filter(|at| *at <= now)
            {
                self.spawn_gate.started(at);
            }
        }
    }

    /// Whether spawns wait at `now`: for a run of start-up failures (unless
    /// a worker has started since), or for the replacement rate.
    pub fn spawns_held(&mut self, now: Instant) -> bool {
        self.note_starts(now);
        self.spawn_gate
            .held_until(now, self.config.max_spawn_rate)
            .is_some()
    }

    /// Until when spawns wait, if they do, for the loop's timer.
    pub fn spawns_held_until(&self, now: Instant) -> Option<Instant> {
        self.spawn_gate.held_until(now, self.config.max_spawn_rate)
    }

    /// Until when a replacement waits for the reap of a child whose
    /// channel closed without its asking to leave (killed from outside, or
    /// crashed): a dying process's descriptors close just before it can
    /// be reaped, so the reap follows within moments and the replacement
    /// then takes the slot it frees, not a higher one. At most
    /// [`REAP_WAIT`] after the close: a child that closed its channel and
    /// lingers is replaced beside it.
    pub fn replacement_waits_until(&self, now: Instant) -> Option<Instant> {
        self.board
            .iter()
            .filter(|(_, e)| {
                e.state == SlotState::Retiring
                    && matches!(
                        e.link.child().leave_cause(),
                        Some(LeaveCause::ChannelClosed)
                    )
            })
            .map(|(_, e)| e.since + REAP_WAIT)
            .filter(|at| *at > now)
            .min()
    }

    /// A start that failed before any worker existed (a fork order left
    /// unanswered, a template's lie): it feeds the back-off.
    pub fn count_failed_start(&mut self, now: Instant) {
        self.spawn_gate.failed(now, std::time::Duration::ZERO);
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use crate::config::PoolConfig;
    use crate::core::child::Child;
    use crate::core::{Core, Input};
    use crate::protocol::ChildMessage;
    use crate::scoreboard::SlotState;

    /// Two ready children, the one in slot 1 told to go.
    fn two_ready_one_retired(t0: Instant) -> Core<Child> {
        let mut core: Core<Child> = Core::new(PoolConfig::default());
        for (slot, pid) in [(0, 40), (1, 41)] {
            core.adopt(slot, pid, 1, Child::new(t0, true, 1), t0);
            let ready = ChildMessage::Ready { pid: pid as u32 };
            core.on(Input::Report { slot, msg: ready }, t0);
        }
        core.retire(1, "surplus", t0);
        core
    }

    /// A failed send (not a closed peer: a full channel, say) to a child
    /// told to go leaves it to its deadline; to any other, it is a kill.
    #[test]
    fn a_failed_send_kills_only_a_child_that_is_not_leaving() {
        let t0 = Instant::now();
        let mut core = two_ready_one_retired(t0);
        let failed = |slot| Input::SendFailed {
            slot,
            peer_gone: false,
            detail: "No buffer space available".into(),
        };
        let later = t0 + Duration::from_millis(5);
        core.on(failed(1), later);
        assert_eq!(core.board.get(1).unwrap().state, SlotState::Retiring);
        assert_eq!(core.totals.killed, 0);
        core.on(failed(0), later);
        assert_eq!(core.board.get(0).unwrap().state, SlotState::Killed);
        assert_eq!(core.totals.killed_by.channel_failed, 1);
    }

    /// A child whose channel closed unasked holds its replacement back
    /// until its reap frees its slot, for a moment at most; one told to
    /// quit does not.
    #[test]
    fn a_replacement_waits_a_moment_for_the_reap_of_a_child_whose_channel_closed() {
        let t0 = Instant::now();
        let mut core = two_ready_one_retired(t0);
        assert_eq!(core.replacement_waits_until(t0), None);
        let closed = Input::ChannelClosed {
            slot: 0,
            hung_up: true,
            claimed_is_child: true,
        };
        core.on(closed, t0);
        let until = t0 + super::REAP_WAIT;
        assert_eq!(core.replacement_waits_until(t0), Some(until));
        assert_eq!(core.next_deadline(t0).map(|d| d <= until), Some(true));
        assert_eq!(core.replacement_waits_until(until), None);
        let status = crate::sys::process::ExitStatus::Code(1);
        core.reaped(0, 40, status, t0);
        assert_eq!(core.replacement_waits_until(t0), None);
    }
}
