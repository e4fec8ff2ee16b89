//! How many children: the scaling rule's answer carried out as far as the
//! core can (surplus children told to quit, the totals), and whether one
//! more child may be started now (the back-off, the slot limit).

use std::time::Instant;

use super::child::{HasChild, Readiness};
use super::Core;
use crate::config::DispatchMode;
use crate::policy::width::{WidthCounts, WidthMove};
use crate::scaling::{self, CpuUse, Decision, PlaceCounts, PoolCounts};
use crate::scoreboard::own_move;

impl<L: HasChild> Core<L> {
    /// What the scaling rule says for `pool` (the counts, with the queue
    /// and the CPU wait filled in by the shell; the CPU wait only matters
    /// to children that report). Surplus idle children are
    /// told to quit here; a `Spawn` is for the shell to carry out, one
    /// child at a time while [`Core::may_spawn`] says so.
    pub fn decide(&mut self, pool: PoolCounts, now: Instant) -> Decision {
        let decision = if self.config.dispatch.speaks_protocol() {
            let at_ceiling = !self.board.has_room_anywhere()
                && self.board.counts().live() >= self.config.max_children;
            self.account_saturation(at_ceiling, now);
            scaling::decide(pool, &self.config, &mut self.memory, now)
        } else {
            scaling::fixed_size(pool, &self.config)
        };
        // A slot whose socket holds connections only its next child can
        // take gets one, whatever the load says (`by_messages.rs`).
        let decision = match decision {
            Decision::Hold | Decision::CpuBound if self.refill_wanted() => Decision::Spawn(1),
            other => other,
        };
        match decision {
            Decision::Retire(n) => {
                for _ in 0..n {
                    if let Some(slot) = self.board.highest_idle() {
                        self.retire(slot, "surplus idle child", now);
                    }
                }
            }
            // Only a hold for the CPUs (taken, or being measured) counts:
            // waiting for the children already starting (the start limit)
            // is no sign of a CPU-bound load, and a burst of sleeping
            // requests meets it at every step of its growth.
            Decision::CpuBound if pool.cpu_holds() => self.totals.cpu_bound += 1,
            Decision::CpuBound => {}
            Decision::Saturated => self.totals.saturated += 1,
            Decision::Hold | Decision::Spawn(_) => {}
        }
        decision
    }

    /// Since when the pool has been at `max_children` with no idle child.
    pub fn saturated_since(&self) -> Option<Instant> {
        self.saturated_since
    }

    /// The pool as the scaling rule sees it. The backlog (`queued`, asked
    /// only when needed) only matters when no child has room: otherwise
    /// every waiting connection is about to be dispatched. `cpus` bounds
    /// the children starting at once when the pool holds for the CPUs.
    /// While the dispatch width leaves children out, the connections it
    /// holds back are not a reason to grow: they wait for the children
    /// within it by design, and the idle ones beyond are the spare.
    pub fn pool_counts(&self, queued: impl FnOnce() -> u32, cpus: u32) -> PoolCounts {
        let mut counts = self.board.counts();
        // Kernel dispatch: a child held by a young reservation is taken
        // (its connection is on its way, or holds it until the hold ends),
        // though the core counts it idle: the pool grows past it, and the
        // balancer's weight falls.
        let young = self.young_reservations().min(counts.idle);
        counts.idle -= young;
        counts.busy += young;
        let room = match self.board.session_capacity() {
            None if counts.idle == 0 => false,
            None if self.board.dispatch_bound().is_some() => self.board.has_room_anywhere(),
            None => self.board.has_room(),
            Some(_) => self.board.free_places() > 0,
        };
        let queued = if room { 0 } else { queued() };
        match self.board.session_capacity() {
            None => PoolCounts {
                starting: counts.starting,
                idle: counts.idle,
                busy: counts.busy,
                queued,
                cpu: scaling::CpuUse::NotLooked,
                start_limit: if self.config.hold_when_cpu_bound {
                    cpus
                } else {
                    0
                },
            },
            Some(per_child) => scaling::in_child_equivalents(
                PlaceCounts {
                    starting: counts.starting,
                    serving: counts.idle + counts.busy,
                    free: self.board.free_places(),
                    queued,
                },
                per_child,
            ),
        }
    }

    /// A fork (or what it needs) failed for lack of resources: spawns back
    /// off like a start-up failure, at least `floor`, so a process limit
    /// reached does not make the supervisor retry in a tight loop. Returns
    /// the delay.
    pub fn fork_failed(&mut self, now: Instant, floor: std::time::Duration) -> std::time::Duration {
        self.spawn_gate.failed(now, floor)
    }

    /// Moves the dispatch width (`policy::width`) by what the pool shows:
    /// `cpu` and `last_look` as the shell measured them, `queued` the
    /// connections waiting (asked only when no child within the width is
    /// idle), `cpus` the CPUs the pool may use; what the connections begun
    /// lately were like is the core's own measure. Only `kernel` dispatch
    /// with the CPU hold on has a width; children that serve many
    /// connections never run in it.
    pub fn steer_width(
        &mut self,
        cpu: CpuUse,
        last_look: Option<(Instant, u32)>,
        queued: impl FnOnce() -> u32,
        cpus: u32,
        now: Instant,
    ) -> WidthMove {
        let narrows = self.config.dispatch == DispatchMode::Kernel
            && self.config.hold_when_cpu_bound
            && self.board.session_capacity().is_none()
            && self.shutdown.is_none();
        let moved = if narrows {
            let counts = self.board.counts();
            let queued = if self.board.has_room() { 0 } else { queued() };
            self.width.steer(
                WidthCounts {
                    serving: counts.idle + counts.busy,
                    busy: counts.busy,
                    queued,
                    cpu,
                    last_look,
                    cpus,
                    turnover: self.turnover(),
                },
                now,
            )
        } else {
            self.width.open()
        };
        match moved {
            WidthMove::Narrowed => self.totals.width_narrowed += 1,
            WidthMove::Widened => self.totals.width_widened += 1,
            WidthMove::Stayed => {}
        }
        if moved != WidthMove::Stayed {
            tracing::debug!(
                ?moved,
                width = ?self.width.children(),
                ?cpu,
                turnover = ?self.turnover(),
                "dispatch width moved"
            );
        }
        if self.board.width() != self.width.children() {
            self.board.set_width(self.width.children());
        }
        moved
    }

    /// Adds the time spent at the ceiling to the totals.
    fn account_saturation(&mut self, at_ceiling: bool, now: Instant) {
        if let Some(since) = self.saturated_since.take() {
            self.totals.saturated_ms += now.duration_since(since).as_millis() as u64;
        }
        if at_ceiling {
            self.saturated_since = Some(now);
        }
    }

    /// Whether one more child may be started now: spawns are not held
    /// back, no stop is under way, and a slot is free under the limit
    /// (children on their way out hold slots until reaped, so however many
    /// a fault leaves there, the table stays bounded).
    pub fn may_spawn(&mut self, now: Instant) -> bool {
        self.shutdown.is_none()
            && !self.spawns_held(now)
            && self.board.occupied() < self.slot_limit()
    }

    /// The most slots in use at once now (see [`slot_limit`]). While a
    /// reload rolls, the old generation may hold up to its own
    /// `max_children`, which a reload to a smaller pool makes more than
    /// the new one's: the limit is twice the larger, or the new
    /// generation's canary could never start.
    pub fn slot_limit(&self) -> usize {
        let max = self.config.max_children;
        match &self.rollout {
            Some(r) => slot_limit(max.max(r.serving_max_children()), true),
            None => slot_limit(max, false),
        }
    }

    /// A child of `generation` forked into `slot` as `pid` (0 for a worker
    /// ordered from a template, until the kernel vouches for it), with
    /// what the shell keeps for it: the slot is taken and the spawn
    /// counted (for the replacement rate too). A child that never reports
    /// counts as busy from its start.
    pub fn adopt(&mut self, slot: usize, pid: i32, generation: u32, mut link: L, now: Instant) {
        if link.child().role.limits.is_none() {
            link.child_mut().role.limits = Some(self.draw_limits());
        }
        let never_reports = link.child().readiness() == Readiness::Assumed;
        self.board.occupy(slot, pid, generation, now, link);
        self.refilled(slot);
        if never_reports {
            own_move(self.board.assume_busy(slot, now));
        }
        self.totals.spawned += 1;
        self.spawn_gate.forked(now, self.config.max_spawn_rate);
    }
}

/// The most slots in use at once, counting children on their way out:
/// `max_children`, and twice that while a reload rolls (it starts each
/// new child while the old one it replaces finishes its connection).
pub(crate) fn slot_limit(max_children: u32, rolling: bool) -> usize {
    let max = max_children as usize;
    if rolling {
        2 * max
    } else {
        max
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use crate::config::PoolConfig;
    use crate::core::child::Child;
    use crate::core::Core;
    use crate::scaling::{CpuUse, Decision, PoolCounts};

    #[test]
    fn only_a_hold_for_the_cpus_counts_as_cpu_bound() {
        let now = Instant::now();
        let mut core: Core<Child> = Core::new(PoolConfig {
            hold_when_cpu_bound: true,
            ..PoolConfig::default()
        });
        let short = |starting, cpu| PoolCounts {
            starting,
            idle: 0,
            busy: 4,
            queued: 20,
            cpu,
            start_limit: 2,
        };
        // The CPUs measured free, two children already starting: the pool
        // waits for them, and that is not a hold for the CPUs.
        let decision = core.decide(short(2, CpuUse::Waiting(0)), now);
        assert_eq!(decision, Decision::CpuBound);
        assert_eq!(core.totals.cpu_bound, 0);
        // The busy children wait for the CPUs, or are being measured.
        for cpu in [CpuUse::Waiting(2000), CpuUse::Measuring] {
            assert_eq!(core.decide(short(0, cpu), now), Decision::CpuBound);
        }
        assert_eq!(core.totals.cpu_bound, 2);
    }
}
