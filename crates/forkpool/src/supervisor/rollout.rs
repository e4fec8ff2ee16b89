//! A reload in progress: the new generation rolls in beside the old one,
//! which keeps serving until each of its children has a ready replacement.
//!
//! SIGHUP (see `reload.rs`) installs the new configuration and starts a
//! [`Rollout`]; while one runs, the supervisor's pool upkeep asks
//! [`rollout_step`] instead of the scaling policy. A new child that fails
//! at start-up (exits, cannot exec, misses its start deadline) abandons the
//! rollout: the configuration that was serving comes back, the new
//! generation's children are told to quit, the log says
//! `reload failed: ...; generation N keeps serving`, and systemd gets
//! `READY=1` with a `STATUS=` saying the same.

use std::io;
use std::time::Instant;

use tracing::{error, info};

use super::{notify, Supervisor};
use crate::config::PoolConfig;
use crate::policy::backoff::START_WINDOW;
use crate::policy::rollout::{rollout_step, GenerationCounts};
use crate::scoreboard::SlotState;
use crate::worker::ChildStart;

/// One reload rolling out.
#[derive(Debug)]
pub(crate) struct Rollout {
    /// The generation serving before the reload, and its configuration:
    /// what comes back if the new one fails.
    serving: u32,
    serving_config: PoolConfig,
    /// The generation rolling in.
    new: u32,
    /// How many children the new generation should have.
    target: u32,
}

/// The rollout state the supervisor keeps.
#[derive(Debug, Default)]
pub(crate) struct Rollouts {
    current: Option<Rollout>,
    /// The highest generation number handed out, so a generation that
    /// failed is never reused.
    highest: u32,
}

impl Rollouts {
    /// Whether a rollout is running.
    pub fn active(&self) -> bool {
        self.current.is_some()
    }

    /// The generation serving for sure: the old one while a rollout runs.
    pub fn serving(&self, generation: u32) -> u32 {
        self.current.as_ref().map_or(generation, |r| r.serving)
    }
}

impl Supervisor {
    /// Starts rolling to `config` as a new generation. The old children
    /// keep serving; `advance_rollout` replaces them one for one.
    pub(super) fn begin_rollout(&mut self, config: PoolConfig) {
        let previous = std::mem::replace(&mut self.core.config, config);
        let old_live = self
            .core
            .board
            .iter()
            .filter(|(_, s)| is_live(s.state))
            .count() as u32;
        let target = old_live
            .max(self.core.config.min_children)
            .min(self.core.config.max_children)
            .max(1);
        // A second reload while one rolls: the last known-good
        // configuration stays the one to fall back to.
        let (serving, serving_config) = match self.rollouts.current.take() {
            Some(r) => (r.serving, r.serving_config),
            None => (self.core.generation, previous),
        };
        self.rollouts.highest = self.rollouts.highest.max(self.core.generation) + 1;
        self.core.generation = self.rollouts.highest;
        self.rollouts.current = Some(Rollout {
            serving,
            serving_config,
            new: self.core.generation,
            target,
        });
        // A start-up failure of the generation before says nothing of
        // this one.
        self.core.spawn_gate.forget_failures();
        info!(
            generation = self.core.generation,
            serving, target, "reloading: rolling children to a new generation, a canary first"
        );
    }

    /// One step of the running rollout, in place of the scaling policy.
    pub(super) fn advance_rollout(&mut self, now: Instant) -> io::Result<Option<ChildStart>> {
        let Some(r) = self.rollouts.current.as_ref() else {
            return Ok(None);
        };
        let (new, target) = (r.new, r.target);
        let counts = self.generation_counts(new, now);
        let step = rollout_step(target, counts);
        if step.done {
            let serving = r.serving;
            self.rollouts.current = None;
            self.core.memory = Default::default();
            info!(generation = new, "reload done: generation {new} serves");
            notify::ready_with_status(&format!(
                "reload done: generation {new} serves (was {serving})"
            ));
            return Ok(None);
        }
        for _ in 0..step.retire_old {
            let old = self
                .core
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
        self.spawn_gated(step.spawn, now)
    }

    /// When a new child of the rollout proves its start by time alone
    /// (workers that never say `Ready`), for the loop's timer.
    pub(super) fn rollout_deadline(&self, now: Instant) -> Option<Instant> {
        let r = self.rollouts.current.as_ref()?;
        if self.core.config.dispatch.speaks_protocol() {
            return None;
        }
        self.core
            .board
            .iter()
            .filter(|(_, s)| s.generation == r.new && is_live(s.state))
            .map(|(_, s)| s.link.child.spawned_at + START_WINDOW)
            .filter(|t| *t > now)
            .min()
    }

    /// A child of generation `generation` failed at start-up (`how`, with
    /// the last lines of its stderr): if that is the generation rolling
    /// in, abandon the reload and keep the serving one.
    pub(super) fn rollout_start_failed(
        &mut self,
        generation: u32,
        how: &str,
        stderr: &[String],
        now: Instant,
    ) {
        let Some(r) = self.rollouts.current.as_ref() else {
            return;
        };
        if generation != r.new {
            return;
        }
        let r = self.rollouts.current.take().expect("checked above");
        let watching = self.core.config.dispatch.parent_watches_listeners();
        self.core.config = r.serving_config;
        if watching && !self.core.config.dispatch.parent_watches_listeners() {
            self.unwatch_listeners();
        }
        if let Err(e) = self.watch_listeners(now) {
            error!("cannot watch the listeners after the failed reload: {e}");
        }
        self.core.generation = r.serving;
        self.core.memory = Default::default();
        self.core.totals.reload_failures += 1;
        // This generation will not be started again: its failures hold
        // nothing back for the one that serves.
        self.core.spawn_gate.forget_failures();
        let failed: Vec<usize> = self
            .core
            .board
            .iter()
            .filter(|(_, s)| s.generation == r.new)
            .map(|(slot, _)| slot)
            .collect();
        for slot in failed {
            self.retire(slot, "reload failed", now);
        }
        let said = if stderr.is_empty() {
            String::from("(nothing on stderr)")
        } else {
            format!("stderr: {}", stderr.join(" | "))
        };
        let line = format!(
            "reload failed: a worker of generation {} {how}; {said}; generation {} keeps serving",
            r.new, r.serving
        );
        error!("{line}");
        notify::ready_with_status(&format!(
            "reload failed: generation {} did not start; generation {} keeps serving",
            r.new, r.serving
        ));
    }

    fn generation_counts(&self, new: u32, now: Instant) -> GenerationCounts {
        let mut c = GenerationCounts::default();
        let by_time = !self.core.config.dispatch.speaks_protocol();
        for (_, s) in self.core.board.iter() {
            if s.generation != new {
                c.old_live += u32::from(is_live(s.state));
                continue;
            }
            // A new child that closed its channel on its own is on its way
            // to a start-up failure, not gone: no second canary meanwhile.
            let link = &s.link;
            if link.child.told_to_leave() {
                continue;
            }
            c.new_live += 1;
            // Workers that never say `Ready` prove themselves by living
            // through the start window.
            let ready = is_live(s.state)
                && link.child.is_ready()
                && (!by_time || link.child.start().started_by(now));
            c.new_ready += u32::from(ready);
        }
        c
    }
}

/// Not told to quit and not killed.
fn is_live(state: SlotState) -> bool {
    !matches!(state, SlotState::Retiring | SlotState::Killed)
}
