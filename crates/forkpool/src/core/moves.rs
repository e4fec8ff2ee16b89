//! The one place a worker's life moves. A worker has two views: its life
//! (`Child::live`: starting, up, leaving and why) and its slot on the
//! board (`SlotState`: the table dispatch and scaling read). A life event
//! moves both, here, or neither: both tables are asked first, and a move
//! either refuses changes nothing. The simulator checks after every step
//! that the two views agree.

use std::fmt;
use std::time::Instant;

use super::child::{HasChild, IllegalLife, LifeEvent};
use super::Core;
use crate::scoreboard::{IllegalTransition, SlotEvent, SlotState};

/// A worker's move that was refused, by its life or by its slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    /// No child in that slot.
    NoChild(usize),
    /// Its life cannot move so.
    Life(IllegalLife),
    /// Its slot cannot move so.
    Slot(IllegalTransition),
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::NoChild(slot) => write!(f, "slot {slot} holds no child"),
            Refused::Life(e) => e.fmt(f),
            Refused::Slot(e) => e.fmt(f),
        }
    }
}

/// The board's move that goes with a life event in a slot now in `state`;
/// none when the slot stays as it is.
fn slot_event(event: &LifeEvent, state: SlotState) -> Option<SlotEvent> {
    match event {
        LifeEvent::Ready { .. } => Some(SlotEvent::Ready),
        LifeEvent::Asked { .. } => Some(SlotEvent::Retire),
        LifeEvent::Killed { .. } => Some(SlotEvent::Kill),
        // No more work can reach it: out of the idle set, unless it is
        // on its way out already.
        LifeEvent::Closed { .. } => {
            (!matches!(state, SlotState::Retiring | SlotState::Killed)).then_some(SlotEvent::Retire)
        }
        LifeEvent::StopBy { .. } => None,
    }
}

impl<L: HasChild> Core<L> {
    /// Moves the worker in `slot` by `event`: its life and its slot
    /// together, or, refused, neither.
    pub(super) fn move_worker(
        &mut self,
        slot: usize,
        event: LifeEvent,
        now: Instant,
    ) -> Result<(), Refused> {
        let entry = self.board.get(slot).ok_or(Refused::NoChild(slot))?;
        let life = entry
            .link
            .child()
            .life
            .after(&event)
            .map_err(Refused::Life)?;
        let on_board = slot_event(&event, entry.state);
        if let Some(e) = on_board {
            if entry.state.after(e).is_none() {
                return Err(Refused::Slot(IllegalTransition {
                    slot,
                    from: entry.state,
                    event: e.name(),
                }));
            }
        }
        let moved = match on_board {
            Some(SlotEvent::Ready) => self.board.ready(slot, now),
            Some(SlotEvent::Retire) => self.board.retire(slot, now),
            Some(SlotEvent::Kill) => self.board.kill(slot, now),
            _ => Ok(()),
        };
        // Both tables said yes above; the board applies its own answer.
        moved.map_err(Refused::Slot)?;
        let child = self
            .board
            .link_mut(slot)
            .expect("checked above")
            .child_mut();
        // The life's own table said yes above, to this very event.
        child.live(event).map_err(Refused::Life)?;
        debug_assert_eq!(child.life, life);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PoolConfig;
    use crate::core::child::Child;
    use std::time::Duration;

    fn one_worker() -> (Core<Child>, Instant) {
        let t0 = Instant::now();
        let mut core: Core<Child> = Core::new(PoolConfig::default());
        core.adopt(0, 40, 1, Child::new(t0, true, 1), t0);
        (core, t0)
    }

    #[test]
    fn a_refused_move_changes_neither_the_life_nor_the_slot() {
        let (mut core, t0) = one_worker();
        let ready = LifeEvent::Ready {
            after: Duration::from_millis(5),
        };
        core.move_worker(0, ready.clone(), t0).unwrap();
        // Ready twice: the life refuses; the slot stays idle.
        assert!(matches!(
            core.move_worker(0, ready, t0),
            Err(Refused::Life(_))
        ));
        assert_eq!(core.board.get(0).unwrap().state, SlotState::Idle);
        // A stop deadline for a child not leaving: refused, nothing moves.
        let stop = LifeEvent::StopBy { by: t0 };
        assert!(core.move_worker(0, stop, t0).is_err());
        assert_eq!(core.board.get(0).unwrap().link.leave_deadline(), None);
        assert!(matches!(
            core.move_worker(3, LifeEvent::StopBy { by: t0 }, t0),
            Err(Refused::NoChild(3))
        ));
    }

    #[test]
    fn life_and_slot_move_together() {
        let (mut core, t0) = one_worker();
        let closed = LifeEvent::Closed { by: t0 };
        core.move_worker(0, closed, t0).unwrap();
        let s = core.board.get(0).unwrap();
        assert_eq!(
            (s.state, s.link.life.name()),
            (SlotState::Retiring, "leaving")
        );
        core.move_worker(0, LifeEvent::Killed { why: "late".into() }, t0)
            .unwrap();
        let s = core.board.get(0).unwrap();
        assert_eq!((s.state, s.link.life.name()), (SlotState::Killed, "killed"));
    }
}
