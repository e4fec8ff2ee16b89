//! What the core publishes at the end of a turn of the loop, for the
//! supervisor's small servers (`forkpool status`, metrics, `/ready`, the
//! agent check): plain copies of its state, made without I/O and, once
//! its lists have grown to the pool's size, without allocating. The
//! servers read this, never the core, so nothing they do can reach into
//! the state the loop is moving.

use std::time::{Duration, Instant};

use super::child::{HasChild, Path};
use super::Core;
use crate::scoreboard::{Slot, StateCounts};
use crate::status::Totals;

/// The core's state as of the end of one turn.
#[derive(Debug, Clone)]
pub(crate) struct CoreView {
    /// When it was published.
    pub at: Instant,
    /// Turns published so far (tests see it move).
    pub turn: u64,
    /// The generation new children start in.
    pub generation: u32,
    /// The generation known to serve.
    pub serving_generation: u32,
    /// The dispatch mode in force, by name.
    pub dispatch: &'static str,
    /// `min_children`, `max_children`, `min_spare`, `max_spare`.
    pub bounds: [u32; 4],
    /// How many children new connections go to (`None`: all).
    pub dispatch_width: Option<u32>,
    /// Whether `/ready` says no while the pool is saturated.
    pub ready_unless_saturated: bool,
    /// Children by state.
    pub counts: StateCounts,
    /// What happened so far.
    pub totals: Totals,
    /// Since when the pool has been at its ceiling with no idle child
    /// (time not yet in `totals.saturated_ms`).
    pub saturated_since: Option<Instant>,
    /// Whether spawns are held back (start-up failures, the replacement
    /// rate).
    pub spawns_held: bool,
    /// Whether the pool is stopping.
    pub stopping: bool,
    /// Slots in use, the span of the table (for the scoreboard line).
    pub span: usize,
    /// Every occupied slot, lowest first, with its index.
    pub slots: Vec<(usize, SlotView)>,
    /// Every template.
    pub templates: Vec<TemplateView>,
    /// `--preload` before any template said `R`: how many ended first
    /// (`None`: no template is awaited).
    pub templates_unready: Option<u32>,
}

/// One occupied slot, as published: the board's own record, with what
/// the core knows of its child where the board keeps its link.
pub(crate) type SlotView = Slot<ChildView>;

/// What status shows of a child beyond its slot's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ChildView {
    /// How long it took to say `Ready`.
    pub ready_after: Option<Duration>,
    /// `kernel` dispatch: how connections reach it, once it said which.
    pub path: Option<Path>,
}

/// One template, as published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TemplateView {
    /// Its pid.
    pub pid: i32,
    /// The generation it forks.
    pub generation: u32,
    /// Where it is, as `forkpool status` names it.
    pub state: &'static str,
    /// When it was started.
    pub born: Instant,
    /// How long it took to say `R`.
    pub ready_after: Option<Duration>,
    /// Workers it has forked.
    pub forks: u64,
    /// Fork orders it owes.
    pub pending: u32,
}

impl CoreView {
    /// An empty view, as before the first turn.
    pub fn new(now: Instant) -> CoreView {
        CoreView {
            at: now,
            turn: 0,
            generation: 0,
            serving_generation: 0,
            dispatch: "",
            bounds: [0; 4],
            dispatch_width: None,
            ready_unless_saturated: false,
            counts: StateCounts::default(),
            totals: Totals::default(),
            saturated_since: None,
            spawns_held: false,
            stopping: false,
            span: 0,
            slots: Vec::new(),
            templates: Vec::new(),
            templates_unready: None,
        }
    }

    /// The one-letter-per-slot line, `.` for a free slot: `IIB.S`.
    pub fn line(&self) -> String {
        let mut line = vec!['.'; self.span];
        for (slot, s) in &self.slots {
            if let Some(c) = line.get_mut(*slot) {
                *c = s.state.letter();
            }
        }
        line.into_iter().collect()
    }
}

impl<L: HasChild> Core<L> {
    /// How connections reach the child in `slot`, once it has said: in
    /// `kernel` dispatch `K`, `G` or `R`; in `order` and `shared`, `G`
    /// only (it accepts by itself, several at once). `None` before, and
    /// otherwise.
    pub fn path(&self, slot: usize) -> Option<Path> {
        let path = self.board.link(slot)?.child().role.path;
        if self.config.dispatch != crate::config::DispatchMode::Kernel {
            return path.filter(|&p| p == Path::Messages);
        }
        path
    }

    /// Writes the state as of `now` into `view`, reusing its lists.
    pub fn publish(&self, view: &mut CoreView, now: Instant) {
        view.at = now;
        view.turn += 1;
        view.generation = self.generation;
        view.serving_generation = self.serving_generation();
        view.dispatch = self.config.dispatch.name();
        view.bounds = [
            self.config.min_children,
            self.config.max_children,
            self.config.min_spare,
            self.config.max_spare,
        ];
        view.dispatch_width = self.board.width();
        view.templates_unready = (self.config.preload && !self.template_ever_ready)
            .then_some(self.templates_ended_unready);
        view.ready_unless_saturated = self.config.ready_unless_saturated;
        view.counts = self.board.counts();
        view.totals = self.totals;
        view.saturated_since = self.saturated_since();
        view.spawns_held = self.spawns_held_until(now).is_some();
        view.stopping = self.shutdown.is_some();
        view.span = self.board.span();
        view.slots.clear();
        view.slots.extend(self.board.iter().map(|(slot, s)| {
            let view = Slot {
                pid: s.pid,
                state: s.state,
                generation: s.generation,
                served: s.served,
                since: s.since,
                last_heard: s.last_heard,
                load: s.load,
                serving: s.serving,
                link: ChildView {
                    ready_after: s.link.child().ready_after(),
                    path: self.path(slot),
                },
            };
            (slot, view)
        }));
        view.templates.clear();
        view.templates
            .extend(self.templates.iter().map(|t| TemplateView {
                pid: t.role.pid,
                generation: t.role.generation,
                state: t.state_name(),
                born: t.born,
                ready_after: t.ready_after(),
                forks: t.role.forks,
                pending: t.role.pending.len() as u32,
            }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PoolConfig;
    use crate::core::child::Child;
    use crate::core::Input;
    use crate::protocol::ChildMessage;

    #[test]
    fn a_view_is_the_core_as_of_its_turn_and_reuses_its_lists() {
        let t0 = Instant::now();
        let mut core: Core<Child> = Core::new(PoolConfig::default());
        core.adopt(0, 40, 1, Child::new(t0, true, 1), t0);
        core.adopt(2, 42, 1, Child::new(t0, true, 1), t0);
        let ms = Duration::from_millis;
        let ready = ChildMessage::Ready { pid: 40 };
        core.on(
            Input::Report {
                slot: 0,
                msg: ready,
            },
            t0 + ms(30),
        );

        let mut view = CoreView::new(t0);
        core.publish(&mut view, t0 + ms(40));
        assert_eq!(view.turn, 1);
        assert_eq!(view.line(), "I.S");
        assert_eq!((view.counts.idle, view.counts.starting), (1, 1));
        assert_eq!(view.slots[0].1.link.ready_after, Some(ms(30)));
        assert_eq!((view.slots[1].0, view.slots[1].1.pid), (2, 42));
        assert_eq!(view.totals.spawned, 2);

        // The next turn's view replaces this one in place.
        let capacity = view.slots.capacity();
        core.on(
            Input::Report {
                slot: 2,
                msg: ChildMessage::Ready { pid: 42 },
            },
            t0 + ms(50),
        );
        core.publish(&mut view, t0 + ms(60));
        assert_eq!((view.turn, view.line().as_str()), (2, "I.I"));
        assert_eq!(view.slots.capacity(), capacity);
    }
}
