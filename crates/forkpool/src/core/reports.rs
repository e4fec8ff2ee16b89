//! What a child's report means for its slot. A report that does not fit
//! the child's state, breaks the protocol's rules, or comes too fast gets
//! the child killed; nothing a child writes can stop the supervisor.

use std::time::Instant;

use tracing::debug;

use super::child::{HasChild, LifeEvent, Path};
use super::effect::Effect;
use super::moves::Refused;
use super::Core;
use crate::policy::messages;
use crate::protocol::ChildMessage;
use crate::scoreboard::IllegalTransition;
use crate::status::KillReason;

impl<L: HasChild> Core<L> {
    /// The child in `slot` sent `msg`: spends its message budget, then
    /// applies it; a child over budget or out of order is killed.
    pub fn report(&mut self, slot: usize, msg: ChildMessage, now: Instant) {
        let Some(link) = self.board.link_mut(slot) else {
            return;
        };
        let budget = &mut link.child_mut().role.messages;
        if !budget.spend(now, 1) {
            let why = format!(
                "sent more than {} messages a second on its back-channel",
                budget.rate()
            );
            self.kill(slot, KillReason::Misbehaved, why, now);
            return;
        }
        self.board.heard_from(slot, now);
        if let Err(why) = self.apply_report(slot, msg, now) {
            self.kill(slot, KillReason::Misbehaved, why, now);
        }
    }

    /// Acts on one report from the child in `slot`: each kind of report is
    /// one verb below. An `Err` is why the child is killed as misbehaved.
    fn apply_report(&mut self, slot: usize, msg: ChildMessage, now: Instant) -> Result<(), String> {
        self.check_report_kind(&msg)?;
        let on_board = self.keeps_board(slot);
        let by_messages = self.path(slot) == Some(Path::Messages);
        messages::mode_allows(self.config.dispatch, on_board, by_messages, &msg)?;
        match msg {
            ChildMessage::Ready { pid } => {
                self.on_ready(slot, pid, now)?;
                if self.config.dispatch == crate::config::DispatchMode::Kernel {
                    if let Some(link) = self.board.link_mut(slot) {
                        link.child_mut().role.path = Some(Path::Handoff);
                    }
                }
                Ok(())
            }
            ChildMessage::ReadyOnBoard { pid } => {
                self.on_ready(slot, pid, now)?;
                if let Some(link) = self.board.link_mut(slot) {
                    let child = link.child_mut();
                    child.role.path = Some(Path::Board);
                    // Forked by a template, it has no socket of its own yet.
                    if child.role.version == crate::protocol::TEMPLATE_VERSION {
                        self.effects.push(Effect::Seat { slot });
                    }
                }
                Ok(())
            }
            ChildMessage::ReadyByMessages { pid } => self.on_ready_by_messages(slot, pid, now),
            // Kernel dispatch: only a wake-up; the scoreboard says idle.
            ChildMessage::Idle if on_board => Ok(()),
            ChildMessage::Idle => {
                self.on_idle(slot, now)?;
                self.mark_board(slot, by_messages, true);
                Ok(())
            }
            ChildMessage::Busy => {
                self.on_busy(slot, now)?;
                self.mark_board(slot, by_messages, false);
                Ok(())
            }
            ChildMessage::Next => self.on_next(slot, !by_messages, now),
            ChildMessage::Leaving => self.on_leaving(slot, now),
            ChildMessage::Missed => self.on_missed(slot, now),
            ChildMessage::Pong { seq } => self.on_pong(slot, seq),
            ChildMessage::Load {
                open,
                capacity,
                received,
                running,
            } => self.on_load(slot, (open, capacity, received, running), now),
        }
    }

    /// Kernel dispatch: whether the child in `slot` keeps its record on
    /// the scoreboard (it said `K`), so its state is read there.
    pub fn keeps_board(&self, slot: usize) -> bool {
        self.path(slot) == Some(Path::Board)
    }

    /// Whether this pool's children serve many connections at once.
    pub fn hosts_sessions(&self) -> bool {
        self.board.session_capacity().is_some()
    }

    /// Refuses a report of the wrong kind for this pool's children: load
    /// from a one-connection child, idle/busy/missed from a many-connection
    /// one.
    fn check_report_kind(&self, msg: &ChildMessage) -> Result<(), String> {
        let hosts = self.hosts_sessions();
        match msg {
            ChildMessage::Load { .. } if !hosts => {
                Err("sent a load report, but this pool runs one connection per child".into())
            }
            ChildMessage::Idle | ChildMessage::Busy | ChildMessage::Missed | ChildMessage::Next
                if hosts =>
            {
                Err(format!(
                    "sent {msg:?}, but this pool's children serve many connections and \
                     report their load instead"
                ))
            }
            _ => Ok(()),
        }
    }

    /// `Ready`: the child is up. Checks it is who it says it is, gives a
    /// worker forked by a template its own process group, and records how
    /// long its start took.
    pub(super) fn on_ready(&mut self, slot: usize, pid: u32, now: Instant) -> Result<(), String> {
        let expected = self.board.get(slot).map_or(0, |s| s.pid);
        if i64::from(pid) != i64::from(expected) {
            return Err(format!("said it is pid {pid}, but it is pid {expected}"));
        }
        if self
            .board
            .link(slot)
            .is_some_and(|l| l.child().role.version == crate::protocol::TEMPLATE_VERSION)
        {
            // Forked by a template, it is in the template's process group;
            // now it is the supervisor's child, it gets a group of its own
            // like every worker (`supervisor/containment.rs`).
            self.effects.push(Effect::OwnGroup { slot });
        }
        let born = self.board.link(slot).map_or(now, |l| l.child().born);
        let after = now.saturating_duration_since(born);
        self.move_worker(slot, LifeEvent::Ready { after }, now)
            .map_err(|refused| match refused {
                Refused::Slot(e) => out_of_order(e),
                other => other.to_string(),
            })?;
        self.effects.push(Effect::Room);
        Ok(())
    }

    /// `Pong`: the answer to a ping, possibly a late one.
    fn on_pong(&mut self, slot: usize, seq: u32) -> Result<(), String> {
        let child = self
            .board
            .link_mut(slot)
            .expect("checked by caller")
            .child_mut();
        // Sequence numbers only grow, so any pong up to the last ping sent
        // is a real answer, possibly a late one (in `shared` mode a ping
        // can cross a `Busy`); a pong for a ping never sent is a lie.
        if seq == 0 || seq > child.role.pinged_up_to {
            return Err(format!("sent pong {seq} for a ping it never got"));
        }
        messages::pong_is_new(seq, child.role.answered_up_to)?;
        child.role.answered_up_to = seq;
        if child
            .ping
            .is_some_and(|(outstanding, _)| seq >= outstanding)
        {
            child.ping = None;
        }
        Ok(())
    }

    /// `Idle`: the child finished its connection (or its start) and waits
    /// for work.
    fn on_idle(&mut self, slot: usize, now: Instant) -> Result<(), String> {
        self.connection_ended(slot, now);
        let finished = self.board.idle(slot, now).map_err(out_of_order)?;
        if finished {
            self.effects.push(Effect::Served { slot });
        }
        self.effects.push(Effect::Room);
        Ok(())
    }

    /// `Busy`: the child accepted a connection itself.
    fn on_busy(&mut self, slot: usize, now: Instant) -> Result<(), String> {
        self.board.busy(slot, now).map_err(out_of_order)?;
        debug!(slot, "child accepted a connection");
        // In `shared` mode a ping can cross this report: the child answers
        // it after its connection. Stop the clock, but still accept that
        // answer.
        let child = self
            .board
            .link_mut(slot)
            .expect("checked by caller")
            .child_mut();
        child.ping = None;
        child.role.late_missed = child.role.ordered_on.is_some();
        self.totals.accepted += 1;
        self.order_answered(slot);
        Ok(())
    }

    /// `Next`: the child finished one connection and took the next waiting
    /// one itself.
    /// `taken_next`: it came from a listener it watched for the next one
    /// (else, a `G` child's, from its own socket).
    fn on_next(&mut self, slot: usize, taken_next: bool, now: Instant) -> Result<(), String> {
        self.connection_ended(slot, now);
        self.board.next(slot, now).map_err(out_of_order)?;
        self.totals.accepted += 1;
        self.totals.taken_next += u64::from(taken_next);
        self.effects.push(Effect::Served { slot });
        Ok(())
    }

    /// `Leaving`: the child is leaving on purpose; it is counted retired.
    fn on_leaving(&mut self, slot: usize, now: Instant) -> Result<(), String> {
        // Its connection, if it had one, is over: count it as an `Idle`
        // would, then the child is on its way out.
        if self.board.get(slot).is_some_and(|s| s.holds_connection()) {
            self.connection_ended(slot, now);
            self.board.idle(slot, now).map_err(out_of_order)?;
        }
        self.let_leave(slot, now);
        Ok(())
    }

    /// `Missed`: the child was woken or ordered to accept but found no
    /// connection waiting (a futile wake-up).
    fn on_missed(&mut self, slot: usize, now: Instant) -> Result<(), String> {
        if self.late_missed(slot) {
            // The answer to an order its `B` already answered (the `B`
            // crossed the `A`): a futile wake-up, nothing more.
            self.totals.futile_wakeups += 1;
            return Ok(());
        }
        self.board.missed(slot, now).map_err(out_of_order)?;
        self.totals.futile_wakeups += 1;
        self.order_answered(slot);
        self.effects.push(Effect::Room);
        Ok(())
    }

    /// `Load` (`L`): the child's load. A child that has room again takes
    /// the connections parked for want of one first; one that finished
    /// connections may be past a limit and is recycled.
    fn on_load(
        &mut self,
        slot: usize,
        report: (u32, u32, u32, u32),
        now: Instant,
    ) -> Result<(), String> {
        let (open, capacity, ..) = report;
        self.board
            .report_load(slot, report, now)
            .map_err(|e| format!("sent an impossible load report: {e}"))?;
        let in_flight = self
            .board
            .get(slot)
            .and_then(|s| s.load)
            .map_or(0, |load| load.in_flight());
        debug!(slot, open, capacity, in_flight, "load report");
        self.effects.push(Effect::Room);
        self.effects.push(Effect::Served { slot });
        Ok(())
    }

    /// Whether an `M` from the busy child in `slot` is the late answer to
    /// an order its `B` answered; it may come once.
    fn late_missed(&mut self, slot: usize) -> bool {
        let busy = self.board.get(slot).is_some_and(|s| s.holds_connection());
        let Some(link) = self.board.link_mut(slot) else {
            return false;
        };
        let role = &mut link.child_mut().role;
        let late = busy && role.late_missed;
        role.late_missed = false;
        late
    }

    /// The child's accept order, if any, is answered.
    fn order_answered(&mut self, slot: usize) {
        let ordered = self
            .board
            .link_mut(slot)
            .and_then(|l| l.child_mut().role.ordered_on.take());
        if let Some(listener) = ordered {
            self.effects.push(Effect::OrderAnswered { listener });
        }
    }

    /// The child in `slot` ended a connection: how long it took, measured
    /// before the slot leaves `Busy`.
    fn connection_ended(&mut self, slot: usize, now: Instant) {
        let Some(entry) = self.board.get(slot) else {
            return;
        };
        let took = (entry.holds_connection() && entry.load.is_none())
            .then(|| now.saturating_duration_since(entry.since));
        self.effects.push(Effect::ConnectionEnded {
            slot,
            pid: entry.pid,
            took,
        });
    }
}

/// Why a report that does not fit the child's state gets it killed.
fn out_of_order(e: IllegalTransition) -> String {
    format!("sent an out-of-order message: {e}")
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use crate::config::{DispatchMode, PoolConfig};
    use crate::core::child::Child;
    use crate::core::{Core, Input};
    use crate::protocol::ChildMessage;
    use crate::scoreboard::SlotState;

    fn order_pool(t0: Instant) -> Core<Child> {
        let mut core: Core<Child> = Core::new(PoolConfig {
            dispatch: DispatchMode::Order,
            ..PoolConfig::default()
        });
        core.adopt(0, 40, 1, Child::new(t0, true, 1), t0);
        let ready = ChildMessage::Ready { pid: 40 };
        core.on(
            Input::Report {
                slot: 0,
                msg: ready,
            },
            t0,
        );
        core
    }

    fn report(core: &mut Core<Child>, msg: ChildMessage, t0: Instant) {
        core.on(Input::Report { slot: 0, msg }, t0);
    }

    /// A child that accepted on its own sent `B` across an order; it reads
    /// the `A` while busy and answers `M`: a futile wake-up, not a kill.
    /// Only once: a second `M` while busy is a lie.
    #[test]
    fn a_missed_for_an_order_its_busy_crossed_is_not_a_kill() {
        let t0 = Instant::now();
        let mut core = order_pool(t0);
        core.ordered_accept(0, 0, t0);
        report(&mut core, ChildMessage::Busy, t0);
        report(&mut core, ChildMessage::Missed, t0);
        assert_eq!(core.board.get(0).unwrap().state, SlotState::Busy);
        assert_eq!(core.totals.killed, 0);
        assert_eq!(core.totals.futile_wakeups, 1);
        report(&mut core, ChildMessage::Idle, t0);
        assert_eq!(core.board.get(0).unwrap().served, 1);
        // A `B` of its own (no order out) leaves no answer owed.
        report(&mut core, ChildMessage::Busy, t0);
        report(&mut core, ChildMessage::Missed, t0);
        assert_eq!(core.board.get(0).unwrap().state, SlotState::Killed);
        assert_eq!(core.totals.killed_by.misbehaved, 1);
    }
}
