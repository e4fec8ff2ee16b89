//! What the loop publishes at the end of a turn for its small servers
//! (`endpoints/`): the core's [`CoreView`], and the few facts only the
//! shell knows (whether the pool has been ready, where it is in its life
//! as a balancer sees it, why kernel dispatch fell back). The servers
//! answer from this alone, with the sampled `/proc` figures beside it;
//! they never read the core or the children's channels.

use std::time::Instant;

use super::resources::ChildFigures;
use super::Supervisor;
use crate::core::CoreView;
use crate::fleet::Capacity;

/// The pool as of the end of the last turn.
#[derive(Debug, Clone)]
pub(crate) struct Published {
    /// The core's part.
    pub core: CoreView,
    /// The supervisor's pid.
    pub pid: u32,
    /// When the supervisor started.
    pub started: Instant,
    /// Whether the pool has been ready (told systemd, logged).
    pub ready: bool,
    /// Why kernel dispatch was asked for and handoff runs instead (set
    /// once, at start: `kernel.rs`).
    pub dispatch_fallback: Option<String>,
    /// Whether kernel dispatch runs (a busy child's peer is then asked of
    /// the kernel when status is read).
    pub kernel: bool,
    /// The pool's capacity, for the agent check and `/ready`.
    pub capacity: Capacity,
    /// Each child's sampled figures, by slot, copied from its link.
    pub figures: Vec<Option<ChildFigures>>,
}

impl Published {
    /// Nothing published yet: the state before the first turn.
    pub fn new(now: Instant) -> Published {
        Published {
            core: CoreView::new(now),
            pid: std::process::id(),
            started: now,
            ready: false,
            dispatch_fallback: None,
            kernel: false,
            capacity: Capacity {
                idle: 0,
                busy: 0,
                starting: 0,
                waiting: 0,
                max_children: 0,
                spawn_held_back: false,
                phase: crate::fleet::Phase::Starting,
            },
            figures: Vec::new(),
        }
    }
}

impl Supervisor {
    /// Publishes the pool as of `now`, at the end of a turn in which the
    /// endpoints have work: no I/O, and no allocation once the lists have
    /// grown.
    pub(super) fn publish(&mut self, now: Instant) {
        self.core.publish(&mut self.published.core, now);
        let view = &self.published.core;
        // Queued connections change no child count (`pool_counts`): they
        // are read below, for the places they take.
        let counts = self.core.pool_counts(|| 0, self.cpu_count());
        // Connections that wait for a child (none is idle): what the
        // supervisor holds and what the backlogs hold.
        let waiting = waiting(counts.idle, self.dispatcher.parked(), || self.queued());
        let capacity = Capacity {
            idle: counts.idle,
            busy: counts.busy,
            starting: counts.starting,
            waiting,
            max_children: view.bounds[1],
            spawn_held_back: view.spawns_held,
            phase: self.phase(),
        };
        let p = &mut self.published;
        p.capacity = capacity;
        p.ready = self.notify.told_ready;
        p.kernel = self.kernel.is_some();
        let board = self.core.board();
        p.figures.resize(board.span(), None);
        for (slot, figures) in p.figures.iter_mut().enumerate() {
            match board.link(slot) {
                Some(link) => figures
                    .get_or_insert_with(Default::default)
                    .clone_from(&link.figures),
                None => *figures = None,
            }
        }
    }
}

/// Connections waiting for a child, as a load balancer is told: those
/// parked with the supervisor and those `queued` in the backlogs, read
/// only when no child is idle (an idle child takes them at once, so none
/// wait).
fn waiting(idle: u32, parked: usize, queued: impl FnOnce() -> u32) -> u32 {
    if idle > 0 {
        return 0;
    }
    let parked = u32::try_from(parked).unwrap_or(u32::MAX);
    parked.saturating_add(queued())
}

#[cfg(test)]
mod tests {
    use super::waiting;

    #[test]
    fn connections_wait_only_while_no_child_is_idle() {
        assert_eq!(waiting(0, 2, || 5), 7);
        assert_eq!(waiting(1, 2, || panic!("the backlog is not read")), 0);
        assert_eq!(waiting(0, usize::MAX, || 5), u32::MAX);
    }
}
