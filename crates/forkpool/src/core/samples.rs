//! The `/proc` sampling round, as the core paces it: every child and
//! listener once per [`SAMPLE_INTERVAL`], a few children per turn of the
//! loop so a large pool never holds it for more than a handful of reads,
//! and the recycling the round ends with (memory and lifetime,
//! `core/recycle.rs`). The shell reads `/proc` and `sock_diag` for the
//! children and listeners named (`supervisor/resources.rs`).

use std::time::{Duration, Instant};

use super::child::HasChild;
use super::Core;
use crate::scoreboard::SlotState;

/// How often children and listeners are sampled.
pub(crate) const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);
/// Children sampled in one turn of the loop: one sample costs about a
/// tenth to a quarter of a millisecond (more for a child with a large
/// address space), so a large pool is sampled a few children at a time.
pub(crate) const CHILDREN_PER_TURN: usize = 8;
/// The pause between two groups of children in one sampling round.
pub(crate) const BETWEEN_CHUNKS: Duration = Duration::from_millis(10);

/// Where the sampling round is.
#[derive(Debug, Default)]
pub(crate) struct SampleRound {
    /// When the next group is due (`None`: at once).
    next: Option<Instant>,
    /// The next slot to sample in the round under way (0: a new round).
    cursor: usize,
    /// When the round under way began.
    started: Option<Instant>,
}

/// What to sample in this turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SampleTurn {
    /// The children's slots, in order.
    pub children: Vec<usize>,
    /// The round ends with this group: the listeners are sampled, and the
    /// children past a memory or lifetime limit recycled.
    pub round_done: bool,
}

impl<L: HasChild> Core<L> {
    /// The group of children to sample now, if one is due, and whether the
    /// round ends with it. A slot whose template has not said the pid yet
    /// (pid 0) and a killed child are not sampled.
    pub fn samples_due(&mut self, now: Instant) -> Option<SampleTurn> {
        let round = &mut self.samples;
        if round.next.is_some_and(|t| now < t) {
            return None;
        }
        if round.cursor == 0 {
            round.started = Some(now);
        }
        let mut sampled = self
            .board
            .iter()
            .filter(|(_, s)| s.state != SlotState::Killed && s.pid > 0);
        let children: Vec<usize> = sampled
            .by_ref()
            .map(|(slot, _)| slot)
            .filter(|&slot| slot >= round.cursor)
            .take(CHILDREN_PER_TURN)
            .collect();
        let round_done = sampled.next().is_none();
        if round_done {
            round.cursor = 0;
            round.next = round.started.map(|t| t + SAMPLE_INTERVAL);
        } else {
            round.cursor = children.last().map_or(0, |&last| last + 1);
            round.next = Some(now + BETWEEN_CHUNKS);
        }
        Some(SampleTurn {
            children,
            round_done,
        })
    }

    /// When the next group of samples is due; `None` before the first.
    pub(super) fn samples_deadline(&self) -> Option<Instant> {
        self.samples.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PoolConfig;
    use crate::core::child::Child;

    fn pool(children: usize, now: Instant) -> Core<Child> {
        let mut core: Core<Child> = Core::new(PoolConfig {
            max_children: 32,
            ..PoolConfig::default()
        });
        for slot in 0..children {
            core.adopt(slot, 100 + slot as i32, 1, Child::new(now, true, 1), now);
        }
        core
    }

    #[test]
    fn a_small_pool_is_sampled_in_one_turn_each_interval() {
        let t0 = Instant::now();
        let mut core = pool(3, t0);
        // A template's worker whose pid is not known yet is left out.
        core.adopt(3, 0, 1, Child::new(t0, true, 2), t0);
        let turn = core.samples_due(t0).unwrap();
        assert_eq!(turn.children, [0, 1, 2]);
        assert!(turn.round_done);
        assert_eq!(core.samples_deadline(), Some(t0 + SAMPLE_INTERVAL));
        assert_eq!(core.samples_due(t0 + Duration::from_millis(999)), None);
        assert!(core.samples_due(t0 + SAMPLE_INTERVAL).is_some());
    }

    #[test]
    fn a_large_pool_is_sampled_a_group_a_turn_and_the_round_keeps_its_pace() {
        let t0 = Instant::now();
        let mut core = pool(20, t0);
        let first = core.samples_due(t0).unwrap();
        assert_eq!(first.children, (0..8).collect::<Vec<_>>());
        assert!(!first.round_done);
        assert_eq!(core.samples_deadline(), Some(t0 + BETWEEN_CHUNKS));
        assert_eq!(core.samples_due(t0), None);
        let t1 = t0 + BETWEEN_CHUNKS;
        assert_eq!(
            core.samples_due(t1).unwrap().children,
            (8..16).collect::<Vec<_>>()
        );
        let t2 = t1 + BETWEEN_CHUNKS;
        let last = core.samples_due(t2).unwrap();
        assert_eq!(last.children, (16..20).collect::<Vec<_>>());
        assert!(last.round_done);
        // The next round is an interval after this one began, not ended.
        assert_eq!(core.samples_deadline(), Some(t0 + SAMPLE_INTERVAL));
    }

    #[test]
    fn a_pool_of_exactly_one_group_ends_its_round_in_one_turn() {
        let t0 = Instant::now();
        let mut core = pool(CHILDREN_PER_TURN, t0);
        let turn = core.samples_due(t0).unwrap();
        assert_eq!(turn.children.len(), CHILDREN_PER_TURN);
        assert!(turn.round_done);
    }
}
