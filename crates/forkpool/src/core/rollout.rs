//! A reload in the core: the new generation rolls in beside the old one,
//! which keeps serving until each of its children has a ready replacement
//! (`policy/rollout.rs` counts), and a refork (`--refork-after`) makes the
//! warmest worker the template of a new generation.
//!
//! - [`Input::Reload`](super::Input::Reload) brings the configuration the
//!   shell read (or why it could not): one that does not validate, or
//!   switches dispatch to or from `none`, is refused and nothing changes;
//!   otherwise a new generation starts rolling, a canary first. A reload
//!   while one rolls keeps the configuration that was serving as the one
//!   to fall back to.
//! - While a rollout runs, [`Core::rollout_spawns`] replaces the scaling
//!   rule: it retires old children one for one with ready new ones and
//!   says how many new ones to start; once no old child is left and a new
//!   one is ready, the new generation serves.
//! - A child (or the template) of the new generation that fails at
//!   start-up fails the reload: the configuration and generation that were
//!   serving come back, the new generation's children are told to quit,
//!   and the shell logs it with the failed child's stderr
//!   ([`ReloadFailed`]).
//! - [`Core::refork_due`] says when slot 0 has earned a refork; the shell
//!   sends it `T` and feeds [`Input::Refork`](super::Input::Refork): the
//!   slot is vacated, a rollout begins with the same configuration, and
//!   the worker is the new generation's template, which must say `R`.

use std::time::Instant;

use tracing::{error, info};

use super::child::HasChild;
use super::effect::{Effect, ReloadFailed};
use super::Core;
use crate::config::PoolConfig;
use crate::policy::backoff::START_WINDOW;
use crate::policy::rollout::{refork_due, rollout_step, GenerationCounts};
use crate::scoreboard::SlotState;

/// One reload rolling out.
#[derive(Debug)]
pub(crate) struct Rollout {
    /// The generation serving before the reload: what comes back if the
    /// new one fails.
    serving: u32,
    /// The configuration that was serving.
    serving_config: PoolConfig,
    /// The generation rolling in.
    new: u32,
    /// How many children the new generation should have.
    target: u32,
    /// When it began.
    began: Instant,
    /// A child of the new generation has been ready: its code starts.
    proven: bool,
}

impl Rollout {
    /// The `max_children` of the generation serving before the reload.
    pub fn serving_max_children(&self) -> u32 {
        self.serving_config.max_children
    }
}

impl<L: HasChild> Core<L> {
    /// Whether a rollout is running.
    pub fn rolling(&self) -> bool {
        self.rollout.is_some()
    }

    /// The generation serving for sure: the old one while a rollout runs.
    pub fn serving_generation(&self) -> u32 {
        self.rollout.as_ref().map_or(self.generation, |r| r.serving)
    }

    /// Whether this pool can roll to `config`: it validates, and does not
    /// switch dispatch to or from `none`. The shell asks before what it
    /// applies itself; the core asks again on [`super::Input::Reload`].
    pub fn reloadable(&self, config: &PoolConfig) -> Result<(), String> {
        config.validate().map_err(|e| e.to_string())?;
        let no_protocol = |c: &PoolConfig| !c.dispatch.speaks_protocol();
        if no_protocol(config) != no_protocol(&self.config) {
            // `none` makes the shared listeners blocking, which the
            // supervisor itself cannot accept from in the other modes.
            return Err("switching dispatch to or from 'none' needs a restart".into());
        }
        Ok(())
    }

    /// [`super::Input::Reload`]: rolls to `config`, or refuses it.
    pub(super) fn reload(&mut self, config: Result<Box<PoolConfig>, String>, now: Instant) {
        let config = config.and_then(|c| self.reloadable(&c).map(|()| *c));
        match config {
            Ok(config) => {
                self.totals.reloads += 1;
                self.begin_rollout(config, now);
            }
            Err(why) => {
                error!("reload refused, keeping the running configuration: {why}");
                self.totals.reloads_refused += 1;
            }
        }
    }

    /// Starts rolling to `config` as a new generation.
    fn begin_rollout(&mut self, config: PoolConfig, now: Instant) {
        let watched = self.config.dispatch.parent_watches_listeners();
        let previous = std::mem::replace(&mut self.config, config);
        let old_live = self.board.iter().filter(|(_, s)| is_live(s.state)).count() as u32;
        let target = old_live
            .max(self.config.min_children)
            .min(self.config.max_children)
            .max(1);
        // A second reload while one rolls: the last known-good
        // configuration stays the one to fall back to.
        let (serving, serving_config) = match self.rollout.take() {
            Some(r) => (r.serving, r.serving_config),
            None => (self.generation, previous),
        };
        self.highest_generation = self.highest_generation.max(self.generation) + 1;
        self.generation = self.highest_generation;
        self.rollout = Some(Rollout {
            serving,
            serving_config,
            new: self.generation,
            target,
            began: now,
            proven: false,
        });
        // A start-up failure of the generation before says nothing of
        // this one.
        self.spawn_gate.forget_failures();
        self.effects.push(Effect::Rewatch {
            was_watching: watched,
        });
        info!(
            generation = self.generation,
            serving, target, "reloading: rolling children to a new generation, a canary first"
        );
    }

    /// One step of the running rollout, in place of the scaling rule: old
    /// children retire for ready new ones, and the answer is how many new
    /// children to start (`None` when no rollout runs).
    pub fn rollout_spawns(&mut self, now: Instant) -> Option<u32> {
        let r = self.rollout.as_ref()?;
        let (new, target, serving, began) = (r.new, r.target, r.serving, r.began);
        let counts = self.generation_counts(new, now);
        if counts.new_ready > 0 {
            self.rollout.as_mut().expect("checked above").proven = true;
        }
        let step = rollout_step(target, counts);
        if step.done {
            self.rollout = None;
            self.memory = Default::default();
            info!(
                generation = new,
                took = ?now.duration_since(began),
                "reload done: generation {new} serves"
            );
            self.effects.push(Effect::Status(format!(
                "reload done: generation {new} serves (was {serving})"
            )));
            return Some(0);
        }
        for _ in 0..step.retire_old {
            let old = self
                .board
                .iter()
                .filter(|(_, s)| s.generation != new && is_live(s.state))
                // Idle children first: they have nothing to finish.
                .min_by_key(|(slot, s)| (s.state != SlotState::Idle, *slot))
                .map(|(slot, _)| slot);
            if let Some(slot) = old {
                self.retire(slot, "reload", now);
            }
        }
        Some(step.spawn)
    }

    /// When a new child of the rollout proves its start by time alone
    /// (workers that never say `Ready`), for the loop's timer.
    pub fn rollout_deadline(&self, now: Instant) -> Option<Instant> {
        let r = self.rollout.as_ref()?;
        if self.config.dispatch.speaks_protocol() {
            return None;
        }
        self.board
            .iter()
            .filter(|(_, s)| s.generation == r.new && is_live(s.state))
            .map(|(_, s)| s.link.child().born + START_WINDOW)
            .filter(|t| *t > now)
            .min()
    }

    /// A child (or the template) of `generation` failed at start-up
    /// (`how`): if that is the generation rolling in, the reload is
    /// abandoned and the serving one comes back. Returns what the shell
    /// logs, when it did.
    pub(super) fn rollout_start_failed(
        &mut self,
        generation: u32,
        how: String,
        now: Instant,
    ) -> Option<ReloadFailed> {
        if self.rollout.as_ref()?.new != generation {
            return None;
        }
        let r = self.rollout.take().expect("checked above");
        let watched = self.config.dispatch.parent_watches_listeners();
        self.config = r.serving_config;
        self.generation = r.serving;
        self.memory = Default::default();
        self.totals.reload_failures += 1;
        // This generation will not be started again: its failures hold
        // nothing back for the one that serves.
        self.spawn_gate.forget_failures();
        self.effects.push(Effect::Rewatch {
            was_watching: watched,
        });
        let failed: Vec<usize> = self
            .board
            .iter()
            .filter(|(_, s)| s.generation == r.new)
            .map(|(slot, _)| slot)
            .collect();
        for slot in failed {
            self.retire(slot, "reload failed", now);
        }
        Some(ReloadFailed {
            failed: r.new,
            serving: r.serving,
            how,
        })
    }

    /// Whether `generation` is rolling in and none of its children has
    /// been ready yet: its template's end, even after `R`, fails the
    /// reload (a template that says `R` and then never forks, or lies
    /// about what it forked, is broken code all the same).
    pub(super) fn rolling_in_unproven(&self, generation: u32) -> bool {
        self.rollout
            .as_ref()
            .is_some_and(|r| r.new == generation && !r.proven)
    }

    /// The slot whose worker has earned a refork, if one has: slot 0 (it
    /// gets every connection while idle, so it is the warmest), idle, of
    /// the current generation, past the next `refork_after` threshold,
    /// with a ready template, no rollout running and no stop; and another
    /// worker ready, to serve while the new template loads (taking the
    /// only ready worker away would leave none until the new generation's
    /// canary is up: [`Core::refork_wants_spare`] asks for one first).
    pub fn refork_due(&self) -> Option<usize> {
        let counts = self.board.counts();
        if counts.idle + counts.busy < 2 {
            return None;
        }
        self.refork_earned()
    }

    /// Whether slot 0 has earned a refork but is the only ready worker:
    /// the pool needs one more (room permitting) before it can go.
    pub fn refork_wants_spare(&self) -> bool {
        let counts = self.board.counts();
        counts.idle + counts.busy < 2
            && counts.starting == 0
            && (self.board.occupied() as u32) < self.config.max_children
            && self.refork_earned().is_some()
    }

    /// Slot 0, if it has earned a refork, leaving aside who serves
    /// meanwhile.
    fn refork_earned(&self) -> Option<usize> {
        if !self.config.preload || self.rolling() || self.shutdown.is_some() {
            return None;
        }
        let entry = self.board.get(0)?;
        let eligible = entry.state == SlotState::Idle
            && entry.generation == self.generation
            && entry.pid > 0
            && refork_due(&self.config.refork_after, self.reforks, entry.served);
        (eligible && self.has_ready_template(self.generation)).then_some(0)
    }

    /// [`super::Input::Refork`]: the worker in `slot` was sent `T` and is
    /// now the template of a new generation: its slot is vacated without
    /// a reap, and the pool rolls onto workers forked from it.
    pub(super) fn reforked(&mut self, slot: usize, now: Instant) {
        let Some(entry) = self.board.vacate(slot) else {
            return;
        };
        self.reforks += 1;
        self.totals.reforks += 1;
        if let Some(listener) = entry.link.child().role.ordered_on {
            self.effects.push(Effect::OrderDropped { listener });
        }
        let config = self.config.clone();
        self.begin_rollout(config, now);
        let generation = self.generation;
        info!(
            pid = entry.pid,
            served = entry.served,
            generation,
            "refork: slot {slot} becomes the template; rolling the pool onto workers forked from it"
        );
        self.template_started(generation, entry.pid, now);
        self.effects.push(Effect::BecameTemplate {
            generation,
            pid: entry.pid,
            link: entry.link,
        });
    }

    fn generation_counts(&self, new: u32, now: Instant) -> GenerationCounts {
        let mut c = GenerationCounts::default();
        let by_time = !self.config.dispatch.speaks_protocol();
        for (_, s) in self.board.iter() {
            if s.generation != new {
                c.old_live += u32::from(is_live(s.state));
                continue;
            }
            // A new child that closed its channel on its own is on its way
            // to a start-up failure, not gone: no second canary meanwhile.
            let child = s.link.child();
            if child.told_to_leave() {
                continue;
            }
            c.new_live += 1;
            // Workers that never say `Ready` prove themselves by living
            // through the start window.
            let ready =
                is_live(s.state) && child.is_ready() && (!by_time || child.start().started_by(now));
            c.new_ready += u32::from(ready);
        }
        c
    }
}

/// Not told to quit and not killed.
fn is_live(state: SlotState) -> bool {
    !matches!(state, SlotState::Retiring | SlotState::Killed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::child::Child;
    use crate::core::Input;
    use crate::protocol::ChildMessage;

    /// A pool of `live` ready children under `max_children`.
    fn serving(live: usize, max_children: u32, now: Instant) -> Core<Child> {
        let mut core = Core::new(PoolConfig {
            min_children: live as u32,
            max_children,
            ..PoolConfig::default()
        });
        for slot in 0..live {
            let pid = 100 + slot as i32;
            core.adopt(slot, pid, 1, Child::new(now, true, 1), now);
            let msg = ChildMessage::Ready { pid: pid as u32 };
            core.on(Input::Report { slot, msg }, now);
        }
        core
    }

    /// A reload to a smaller pool than half the children serving: the
    /// old generation holds more slots than twice the new `max_children`,
    /// and the canary must still start, or the rollout never ends.
    #[test]
    fn a_reload_to_a_much_smaller_pool_still_starts_its_canary() {
        let now = Instant::now();
        let mut core = serving(12, 16, now);
        let smaller = PoolConfig {
            min_children: 2,
            max_children: 4,
            ..PoolConfig::default()
        };
        core.on(Input::Reload(Ok(Box::new(smaller))), now);
        assert!(core.rolling());
        assert_eq!(core.rollout_spawns(now), Some(1), "a canary");
        assert!(
            core.may_spawn(now),
            "the canary may not start: {} slots held, limit {}",
            core.board.occupied(),
            core.slot_limit()
        );
    }
}
