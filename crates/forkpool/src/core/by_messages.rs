//! Kernel dispatch's messages path (`G`, docs/protocol.md "The messages
//! path"): a child that serves its own socket but cannot keep its record
//! on the scoreboard. What the core decides for it: its record moved from
//! its messages, no connection ever handed to it, and, in a pool of such
//! children, where a connection goes that finds none idle (the spread)
//! and which empty slot must get a child again because connections wait
//! on its socket (the refill).

use std::time::Instant;

use super::child::{HasChild, Path};
use super::effect::Effect;
use super::Core;
use crate::scoreboard::SlotState;

impl<L: HasChild> Core<L> {
    /// Whether the supervisor may hand the child in `slot` a connection
    /// with `C`: in kernel dispatch, only one served as in `handoff` (`R`)
    /// or on the board (`K`); a `G` child takes its connections from its
    /// own socket only (it cannot receive a descriptor).
    pub fn takes_handed(&self, slot: usize) -> bool {
        self.path(slot) != Some(Path::Messages)
    }

    /// Kernel dispatch: whether the child in `slot` takes connections
    /// from its own socket itself (it said `K` or `G`), so the supervisor
    /// leaves that socket to it.
    pub fn serves_own_socket(&self, slot: usize) -> bool {
        matches!(self.path(slot), Some(Path::Board | Path::Messages))
    }

    /// Whether a connection the supervisor takes can be handed on: not
    /// in a pool whose children all serve by messages (`G`), which no
    /// child can be handed one.
    pub fn hands_on(&self) -> bool {
        let (mut by_messages, mut handed) = (false, false);
        for (slot, _) in self.board.iter() {
            match self.path(slot) {
                Some(Path::Messages) => by_messages = true,
                Some(Path::Board | Path::Handoff) => handed = true,
                None => {}
            }
        }
        !by_messages || handed
    }

    /// Kernel dispatch: over how many slots from 0 the program spreads a
    /// connection that finds no idle child, rather than queue it on the
    /// overflow: in a pool whose ready children all serve by messages
    /// (`G`), which no connection can be handed to, up to the highest of
    /// them, within the dispatch width; else 0 (the overflow, handed on).
    pub fn spread_over(&self) -> usize {
        if self.hands_on() {
            return 0;
        }
        let highest = self
            .board
            .iter()
            .filter(|&(slot, _)| self.path(slot) == Some(Path::Messages))
            .map(|(slot, _)| slot + 1)
            .max()
            .unwrap_or(0);
        self.board
            .dispatch_bound()
            .map_or(highest, |bound| highest.min(bound))
    }

    /// `G` (its mode checked): a kernel dispatch child is up that serves its own socket and
    /// says busy and idle in messages; its record starts idle, stored by
    /// the shell for it. A worker forked by a template has no socket of
    /// its own until it is sent one, which takes a descriptor: it says `K`
    /// or `R`.
    pub(super) fn on_ready_by_messages(
        &mut self,
        slot: usize,
        pid: u32,
        now: Instant,
    ) -> Result<(), String> {
        if self
            .board
            .link(slot)
            .is_some_and(|l| l.child().role.version == crate::protocol::TEMPLATE_VERSION)
        {
            return Err("sent G, but a worker forked by a template says K or R".into());
        }
        self.on_ready(slot, pid, now)?;
        if let Some(link) = self.board.link_mut(slot) {
            let role = &mut link.child_mut().role;
            role.path = Some(Path::Messages);
            role.messages = crate::policy::budget::message_budget_by_messages();
        }
        self.mark_board(slot, true, true);
        Ok(())
    }

    /// A `G` child (`by_messages`) said it is idle or busy: in `kernel`
    /// dispatch its record on the scoreboard follows. A child on its way
    /// out stays busy there: it takes no new connection.
    pub(super) fn mark_board(&mut self, slot: usize, by_messages: bool, idle: bool) {
        if self.config.dispatch != crate::config::DispatchMode::Kernel {
            return;
        }
        let serving = self
            .board
            .get(slot)
            .is_some_and(|s| matches!(s.state, SlotState::Idle | SlotState::Busy));
        if by_messages && serving {
            self.effects.push(Effect::MarkBoard { slot, idle });
        }
    }

    /// An empty slot's socket holds connections (the shell looked): in a
    /// pool of messages children, which none can be handed, the slot gets
    /// a child again, which takes them. The load may not want one: a
    /// crash under load left them, or a handshake that ended after its
    /// worker was told to quit.
    pub fn left_on_socket(&mut self, slot: usize) {
        if self.board.get(slot).is_none() && !self.hands_on() {
            self.refill.insert(slot);
        }
    }

    /// Whether a slot waits for a child to take what is on its socket
    /// (and one may be started).
    pub(super) fn refill_wanted(&self) -> bool {
        self.shutdown.is_none() && self.refill_slot().is_some()
    }

    /// The slot the next child goes to: one to refill, else the lowest
    /// free.
    pub fn spawn_slot(&self) -> usize {
        self.refill_slot()
            .unwrap_or_else(|| self.board.lowest_free())
    }

    /// Any slot kernel dispatch has a socket for may be one: one a reload
    /// used beyond `max_children` too (the slot limit bounds how many
    /// children there are, `Core::may_spawn`, not where they sit).
    fn refill_slot(&self) -> Option<usize> {
        self.refill
            .iter()
            .copied()
            .find(|&slot| self.board.get(slot).is_none())
    }

    /// Whether `slot` waits for a child to take what its socket holds.
    #[cfg(test)]
    pub(crate) fn refill_pending(&self, slot: usize) -> bool {
        self.refill.contains(&slot)
    }

    /// A child took `slot`: it no longer waits for one.
    pub(super) fn refilled(&mut self, slot: usize) {
        self.refill.remove(&slot);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use crate::config::{DispatchMode, PoolConfig};
    use crate::core::child::Child;
    use crate::core::{Core, Input};
    use crate::protocol::ChildMessage;

    fn report(core: &mut Core<Child>, msg: ChildMessage, t0: Instant) {
        core.on(Input::Report { slot: 0, msg }, t0);
    }

    fn kernel_pool(t0: Instant, children: usize) -> Core<Child> {
        let mut core: Core<Child> = Core::new(PoolConfig {
            dispatch: DispatchMode::Kernel,
            ..PoolConfig::default()
        });
        for slot in 0..children {
            core.adopt(slot, 40 + slot as i32, 1, Child::new(t0, true, 1), t0);
        }
        core
    }

    /// The board marks the shell was asked for, in order.
    fn marks(core: &mut Core<Child>) -> Vec<(usize, bool)> {
        core.take_effects()
            .into_iter()
            .filter_map(|e| match e {
                crate::core::Effect::MarkBoard { slot, idle } => Some((slot, idle)),
                _ => None,
            })
            .collect()
    }

    /// `G`: the child serves its own socket, says busy and idle in
    /// messages, and each one moves its record; no connection is handed to
    /// it, and a pool of such children spreads instead.
    #[test]
    fn a_child_by_messages_has_its_record_moved_for_it_and_is_never_handed_one() {
        let t0 = Instant::now();
        let mut core = kernel_pool(t0, 2);
        assert!(core.hands_on(), "nobody has said yet");
        report(&mut core, ChildMessage::ReadyByMessages { pid: 40 }, t0);
        assert_eq!(marks(&mut core), [(0, true)]);
        assert_eq!(core.path(0), Some(super::Path::Messages));
        assert!(core.serves_own_socket(0) && !core.takes_handed(0));
        assert!(!core.hands_on());
        assert_eq!(core.spread_over(), 1);
        report(&mut core, ChildMessage::Busy, t0);
        report(&mut core, ChildMessage::Next, t0);
        report(&mut core, ChildMessage::Idle, t0);
        assert_eq!(marks(&mut core), [(0, false), (0, true)]);
        assert_eq!(core.board.get(0).unwrap().served, 2);
        assert_eq!(core.totals.accepted, 2);
        assert_eq!(
            core.totals.taken_next, 0,
            "its own socket's, not the overflow's"
        );
        // A second child on the board: the supervisor hands on again.
        core.on(
            Input::Report {
                slot: 1,
                msg: ChildMessage::ReadyOnBoard { pid: 41 },
            },
            t0,
        );
        assert!(core.hands_on());
        assert_eq!(core.spread_over(), 0);
        // A `Missed` is a lie from it.
        report(&mut core, ChildMessage::Missed, t0);
        assert_eq!(core.totals.killed_by.misbehaved, 1);
    }

    /// A worker forked by a template has no socket of its own until it is
    /// sent one: `G` from it is refused.
    #[test]
    fn a_worker_forked_by_a_template_cannot_say_g() {
        let t0 = Instant::now();
        let mut core: Core<Child> = Core::new(PoolConfig {
            dispatch: DispatchMode::Kernel,
            ..PoolConfig::default()
        });
        core.adopt(
            0,
            40,
            1,
            Child::new(t0, true, crate::protocol::TEMPLATE_VERSION),
            t0,
        );
        report(&mut core, ChildMessage::ReadyByMessages { pid: 40 }, t0);
        assert_eq!(core.totals.killed_by.misbehaved, 1);
        assert!(marks(&mut core).is_empty());
    }

    /// A slot whose socket holds connections in a pool of messages
    /// children gets a child again even when the load wants none, and the
    /// next child goes there; once taken, it waits for nothing more.
    #[test]
    fn an_empty_slot_with_connections_on_its_socket_is_refilled() {
        use crate::scaling::{CpuUse, Decision, PoolCounts};
        let t0 = Instant::now();
        let mut core: Core<Child> = Core::new(PoolConfig {
            dispatch: DispatchMode::Kernel,
            min_children: 1,
            min_spare: 0,
            ..PoolConfig::default()
        });
        core.adopt(0, 40, 1, Child::new(t0, true, 1), t0);
        report(&mut core, ChildMessage::ReadyByMessages { pid: 40 }, t0);
        let calm = PoolCounts {
            starting: 0,
            idle: 1,
            busy: 0,
            queued: 0,
            cpu: CpuUse::NotLooked,
            start_limit: 0,
        };
        assert_eq!(core.decide(calm, t0), Decision::Hold);
        // Slot 3 held a worker that is gone; connections wait there.
        core.left_on_socket(3);
        assert_eq!(core.spawn_slot(), 3);
        assert_eq!(core.decide(calm, t0), Decision::Spawn(1));
        core.adopt(3, 43, 1, Child::new(t0, true, 1), t0);
        assert_eq!(core.decide(calm, t0), Decision::Hold);
        assert_eq!(core.spawn_slot(), 1, "the lowest free again");
        // An occupied slot is not waiting for one, nor is any slot in a
        // pool the supervisor hands connections to.
        core.left_on_socket(0);
        assert_eq!(core.decide(calm, t0), Decision::Hold);
        core.on(
            Input::Report {
                slot: 3,
                msg: ChildMessage::ReadyOnBoard { pid: 43 },
            },
            t0,
        );
        core.left_on_socket(5);
        assert_eq!(core.spawn_slot(), 1);
    }

    /// A messages child says busy and idle for each connection: it may
    /// send twice what a handoff child may before it counts as a flood.
    #[test]
    fn a_child_by_messages_has_twice_the_message_budget() {
        let t0 = Instant::now();
        let mut core = kernel_pool(t0, 1);
        report(&mut core, ChildMessage::ReadyByMessages { pid: 40 }, t0);
        let rate = crate::policy::budget::MESSAGES_PER_SECOND as usize;
        for _ in 0..rate {
            report(&mut core, ChildMessage::Busy, t0);
            report(&mut core, ChildMessage::Idle, t0);
        }
        assert_eq!(core.totals.killed_by.misbehaved, 0);
        report(&mut core, ChildMessage::Busy, t0);
        assert_eq!(core.totals.killed_by.misbehaved, 1, "past the budget");
    }

    /// In `order` and `shared` a worker that accepts every waiting
    /// connection at once says `G`: it is shown on the messages path, never
    /// ordered, its `B`, `N` and `I` counted, and no board is marked.
    #[test]
    fn a_g_child_in_order_dispatch_is_never_ordered_and_its_reports_count() {
        let t0 = Instant::now();
        let mut core: Core<Child> = Core::new(PoolConfig {
            dispatch: DispatchMode::Order,
            ..PoolConfig::default()
        });
        core.adopt(0, 40, 1, Child::new(t0, true, 1), t0);
        report(&mut core, ChildMessage::ReadyByMessages { pid: 40 }, t0);
        assert_eq!(core.path(0), Some(super::Path::Messages));
        assert!(!core.takes_handed(0));
        report(&mut core, ChildMessage::Busy, t0);
        report(&mut core, ChildMessage::Next, t0);
        report(&mut core, ChildMessage::Idle, t0);
        assert!(
            marks(&mut core).is_empty(),
            "no board outside kernel dispatch"
        );
        assert_eq!(core.totals.accepted, 2);
        assert_eq!(core.board.get(0).unwrap().served, 2);
        assert_eq!(core.totals.killed, 0);
    }
}
