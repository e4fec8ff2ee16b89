//! The simulator's reloads and reforks: SIGHUP at random moments (during a
//! rollout too), with a configuration that cannot be read, one that does
//! not validate, or new code that is broken (workers or a template that
//! crash at start, hang, lie, or die soon after `Ready`); and the refork
//! the core asks for, to a worker that may not make a working template.
//!
//! The invariants of a rollout, after every step:
//! - it ends: within [`ROLL_LIMIT`] the new generation serves, or the
//!   reload failed and the old one keeps serving;
//! - the new generation never has more live children than
//!   `max_children`, and no fork takes the slots past the limit of a
//!   rolling pool (`slot_limit`);
//! - if workers were ready when it began, some worker is ready at every
//!   moment until it ends, unless one died, was killed or closed its
//!   channel meanwhile (from outside, or for misbehaving).

use super::world::{BrokenCode, Happening, TemplateBehaviour, MS, SEC};
use super::Sim;
use crate::config::PoolConfig;
use crate::core::child::Child;
use crate::core::Input;
use crate::scoreboard::SlotState;

/// How long a rollout may run, in simulated time, before the simulator
/// calls it stuck. A broken new generation fails within a start deadline
/// (3 s here) or two; a healthy one is through in well under this.
const ROLL_LIMIT: u64 = 30 * SEC;

/// What the simulator watches while a rollout runs.
#[derive(Debug, Clone, Copy)]
pub(super) struct RollWatch {
    /// The generation rolling in.
    generation: u32,
    /// When it began.
    began: u64,
    /// Some worker was ready when it began.
    serving: bool,
    /// A worker died, was killed, or closed its channel since.
    disturbed: bool,
}

impl Sim {
    /// Workers ready to serve now.
    fn ready_workers(&self) -> u32 {
        let c = self.core.board.counts();
        c.idle + c.busy
    }

    /// Workers ready and alive in the world (one killed a moment ago may
    /// still be ready to the core, which has not heard yet).
    fn ready_alive(&self) -> u32 {
        self.core
            .board
            .iter()
            .filter(|(_, s)| matches!(s.state, SlotState::Idle | SlotState::Busy))
            .filter(|(_, s)| {
                self.world
                    .procs
                    .get(&s.pid)
                    .is_some_and(|p| !p.exited && !p.closed)
            })
            .count() as u32
    }

    /// SIGHUP: a configuration the shell could not read, one that does
    /// not validate, or one to roll to, whose code may be broken.
    pub(super) fn reload_happens(&mut self) {
        let now = self.now();
        if self.core.shutdown.is_some() {
            return;
        }
        let every = self.scenario.reload_every;
        let next = every / 2 + self.world.rng.below(every);
        self.world.at(next, Happening::Reload);
        let refused = self.scenario.refused_reload_per_mille;
        let config = if self.world.rng.per_mille(refused / 2) {
            Err("cannot read the configuration: no such file".into())
        } else if self.world.rng.per_mille(refused / 2) {
            Ok(Box::new(PoolConfig {
                max_children: 0,
                ..self.core.config.clone()
            }))
        } else {
            // Sometimes a smaller or larger pool: the old generation may
            // hold more slots than the new one may have.
            let max = if self.world.rng.per_mille(300) {
                2 + self.world.rng.below(15) as u32
            } else {
                self.core.config.max_children
            };
            self.max_seen = self.max_seen.max(max);
            let min_spare = self.core.config.min_spare.min(max);
            Ok(Box::new(PoolConfig {
                min_children: 1 + self.world.rng.below(u64::from(max)) as u32,
                max_children: max,
                min_spare,
                ..self.core.config.clone()
            }))
        };
        let (before, ready) = (self.core.generation, self.ready_alive());
        let refused_before = self.core.totals.reloads_refused;
        self.core.on(Input::Reload(config), now);
        if self.core.generation == before {
            self.outcome.refused += self.core.totals.reloads_refused - refused_before;
            return;
        }
        if self
            .world
            .rng
            .per_mille(self.scenario.broken_reload_per_mille)
        {
            let broken = BrokenCode::pick(&mut self.world.rng);
            self.world.broken.insert(self.core.generation, broken);
        }
        self.watch_roll(ready);
    }

    /// The refork the core asks for, as the shell does it: `T` to the
    /// worker (whose send may fail), then the core is told.
    pub(super) fn consider_refork(&mut self) -> Result<(), String> {
        let now = self.now();
        let Some(slot) = self.core.refork_due() else {
            return Ok(());
        };
        let pid = self.core.board.get(slot).map_or(0, |s| s.pid);
        let reachable = self
            .world
            .procs
            .get(&pid)
            .is_some_and(|p| !p.exited && !p.closed);
        if !reachable || self.world.rng.per_mille(100) {
            // The send of `T` failed (the worker is gone, or at random):
            // it is tried again next turn.
            return Ok(());
        }
        let ready = self.ready_alive();
        self.core.on(Input::Refork { slot }, now);
        self.watch_roll(ready);
        self.carry_out()
    }

    /// Carries out [`Effect::BecameTemplate`]: the worker becomes the
    /// template, working or not as the new generation's code says.
    pub(super) fn became_template(&mut self, generation: u32, pid: i32) -> Result<(), String> {
        let Some(p) = self.world.procs.get(&pid).filter(|p| !p.exited) else {
            return Err(format!("pid {pid} became the template, but it is gone"));
        };
        let good = p.behaviour == super::world::Behaviour::Good;
        let behaviour = if good
            && !self
                .world
                .rng
                .per_mille(self.scenario.broken_reload_per_mille)
        {
            TemplateBehaviour::Good
        } else {
            BrokenCode::pick(&mut self.world.rng).template
        };
        // Kernel dispatch: the program may have given it a connection since
        // the core last read the board; it reads `T` once that is served,
        // and gives up its seat.
        let p = self.world.procs.get_mut(&pid).expect("alive");
        p.board = None;
        if let Some(conn) = p.serving.take() {
            p.serving = Some(conn);
            self.settle(conn, pid, super::world::Conn::Served)?;
            self.outcome.served += 1;
            self.world.procs.get_mut(&pid).expect("alive").serving = None;
        }
        self.world.become_template(pid, generation, behaviour);
        Ok(())
    }

    /// A rollout began with `ready` workers ready just before.
    fn watch_roll(&mut self, ready: u32) {
        if !self.core.rolling() {
            return;
        }
        self.outcome.rollouts += 1;
        self.roll_starts.push_back(self.world.now);
        self.roll = Some(RollWatch {
            generation: self.core.generation,
            began: self.world.now,
            serving: ready > 0,
            disturbed: false,
        });
    }

    /// Each slot's generation, state and pid, for a failure's message.
    fn board_line(&self) -> String {
        let slots: Vec<String> = self
            .core
            .board
            .iter()
            .map(|(slot, s)| format!("{slot}: g{} {:?} pid {}", s.generation, s.state, s.pid))
            .collect();
        let templates: Vec<String> = self
            .core
            .templates
            .iter()
            .map(|t| {
                let how = self.world.templates.get(&t.role.pid).map(|w| w.behaviour);
                format!("g{} {} {how:?}", t.role.generation, t.state_name())
            })
            .collect();
        let now = self.now();
        format!(
            "slots [{}], templates [{}], serving g{}, spawns held for {:?}",
            slots.join(", "),
            templates.join(", "),
            self.core.serving_generation(),
            self.core.spawns_held_until(now).map(|t| t - now),
        )
    }

    /// A worker died, was killed or closed its channel: the rule that
    /// some worker stays ready holds only without such a loss.
    pub(super) fn disturb(&mut self) {
        if let Some(r) = self.roll.as_mut() {
            r.disturbed = true;
        }
    }

    /// The invariants of a rollout (see the module's doc).
    pub(super) fn check_roll(&mut self) -> Result<(), String> {
        if self.core.shutdown.is_some() {
            return Ok(());
        }
        let Some(r) = self.roll.filter(|_| self.core.rolling()) else {
            if let Some(r) = self.roll.take() {
                if self.core.generation == r.generation {
                    self.outcome.rolled += 1;
                } else {
                    self.outcome.reload_failed += 1;
                }
            }
            return Ok(());
        };
        if self.core.generation != r.generation {
            return Err(format!(
                "rolling to generation {} but the simulator saw {} begin",
                self.core.generation, r.generation
            ));
        }
        let took = self.world.now - r.began;
        if took > ROLL_LIMIT {
            return Err(format!(
                "the rollout to generation {} has run for {:?}: it never ends ({}; {} templates \
                 killed, code {:?})",
                r.generation,
                super::world::span(took),
                self.board_line(),
                self.core.totals.templates_killed,
                self.world.broken.get(&r.generation),
            ));
        }
        if r.serving && !r.disturbed && self.ready_workers() == 0 {
            return Err(format!(
                "no worker ready while rolling to generation {}, though workers were ready \
                 when it began and none was lost: {}",
                r.generation,
                self.board_line()
            ));
        }
        let max = self.core.config.max_children;
        let new_live = self
            .core
            .board
            .iter()
            .filter(|(_, s)| s.generation == r.generation && !s.link.told_to_leave())
            .count() as u32;
        if new_live > max {
            return Err(format!(
                "{new_live} live children of generation {}, max_children {max}",
                r.generation
            ));
        }
        Ok(())
    }

    /// A child forked (or ordered) into `slot`: the slot limit holds.
    pub(super) fn adopt_checked(
        &mut self,
        slot: usize,
        pid: i32,
        child: Child,
    ) -> Result<(), String> {
        let now = self.now();
        let generation = self.core.generation;
        self.core.adopt(slot, pid, generation, child, now);
        let limit = self.core.slot_limit();
        if self.core.board.occupied() > limit {
            return Err(format!(
                "a fork took {} slots, above the limit of {limit} (rolling: {})",
                self.core.board.occupied(),
                self.core.rolling()
            ));
        }
        Ok(())
    }
}

/// A reload every this often, on average, in the scenarios that have
/// them: often (a HUP during a rollout, a stop during one), or seldom
/// (time for a stuck rollout to show).
pub(super) fn reload_interval(rng: &mut super::rng::Rng) -> u64 {
    if rng.per_mille(500) {
        (200 + rng.below(5_000)) * MS
    } else {
        (5_000 + rng.below(60_000)) * MS
    }
}
