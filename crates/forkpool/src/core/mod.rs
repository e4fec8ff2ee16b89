//! The supervisor's core: every child's state and every rule that moves
//! it, with no I/O. It is fed inputs (a child's report, a child reaped, a
//! closed channel, a stop, the time) and answers with effects (send this,
//! signal that child, stop reading that channel, spawn), which the shell
//! in `supervisor/` carries out. The simulator in `core/sim` drives the
//! very same code with a fake clock and simulated children.

mod by_messages;
pub(crate) mod child;
mod connections;
mod counted;
mod cpu;
mod effect;
mod input;
mod lifecycle;
mod liveness;
mod moves;
mod paced;
mod pool;
mod recycle;
mod reports;
mod rollout;
pub(crate) mod sampled;
mod samples;
#[cfg(test)]
mod sim;
mod slow;
pub(crate) mod stderr;
mod stop;
pub(crate) mod template;
mod templates;
mod timers;
pub(crate) mod upgrade;
mod view;
mod vouch;

pub(crate) use counted::Counted;
pub(crate) use effect::{Effect, Gone, ReloadFailed, TemplateFailure};
pub(crate) use input::Input;
pub(crate) use paced::Warning;
pub(crate) use pool::slot_limit;
pub(crate) use slow::{CaptureOf, HeldKill};
pub(crate) use timers::Timer;
pub(crate) use view::CoreView;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::config::PoolConfig;
use crate::policy::backoff::SpawnGate;
use crate::policy::backoff::StartBackoff;
use crate::policy::shutdown::Stop;
use crate::policy::width::Width;
use crate::scaling::ScalingMemory;
use crate::scoreboard::Scoreboard;
use crate::status::Totals;
use crate::sys::process::ExitStatus;
use child::HasChild;
use template::Template;

/// After a fork that failed for lack of resources (or a template that
/// could not fork), spawns wait at least this long.
pub(crate) const RESOURCE_BACKOFF: Duration = Duration::from_millis(250);

/// The shutdown in progress, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shutdown {
    /// Children still there are killed at this moment.
    pub deadline: Instant,
    /// The supervisor exits at this moment, whatever is left.
    pub exit_by: Instant,
}

/// Every child's state and the memory of the rules, with no I/O. `L` is
/// what the shell keeps per child beside the core's [`child::Child`].
pub(crate) struct Core<L> {
    /// The pool's settings (replaced by a reload).
    config: PoolConfig,
    /// The children, slot by slot.
    board: Scoreboard<L>,
    /// What happened so far, for status and metrics.
    totals: Totals,
    /// The generation new children are started in.
    generation: u32,
    /// The sequence number of the last ping sent.
    ping_seq: u32,
    /// The stop in progress, if any.
    shutdown: Option<Shutdown>,
    /// What holds spawns back: a run of start-up failures, and the rate
    /// of replacing workers that had started (`policy/backoff.rs`).
    spawn_gate: SpawnGate,
    /// What the scaling rule remembers between turns.
    memory: ScalingMemory,
    /// How many children new connections go to (`kernel` dispatch).
    width: Width,
    /// The templates (`--preload`): one per generation, two while a
    /// reload rolls.
    templates: Vec<Template>,
    /// Template start-up failures and unplanned ends in a row.
    template_backoff: StartBackoff,
    /// No template is started before this.
    templates_blocked_until: Option<Instant>,
    /// Templates that ended in a row without saying `R`.
    templates_ended_unready: u32,
    /// Whether any template of this pool has said `R`.
    template_ever_ready: bool,
    /// Why the pool stopped itself, if it did: the supervisor then exits
    /// with this error instead of its totals.
    gave_up: Option<String>,
    /// The reload rolling out, if any (`rollout.rs`).
    rollout: Option<rollout::Rollout>,
    /// The highest generation handed out, so a generation that failed is
    /// never reused.
    highest_generation: u32,
    /// `refork_after` thresholds used so far.
    reforks: usize,
    /// Processes reaped that held no slot, in case a template's `W`
    /// names one of them afterwards (a worker that died at once).
    orphans: VecDeque<(i32, ExitStatus)>,
    /// Since when the pool has been at `max_children` with no idle child.
    saturated_since: Option<Instant>,
    /// Kernel dispatch: what the last reading of the board's
    /// reservations found, and the deadlines they set (`sampled.rs`).
    reading: sampled::BoardReading,
    /// How the pool uses the CPUs: the run-queue looks (`cpu.rs`).
    watches: cpu::Watches,
    /// The shell's own timers (`timers.rs`).
    timers: timers::Timers,
    /// Draws each child's recycling limits (`recycle.rs`).
    jitter: fastrand::Rng,
    /// Slow-request captures: their rate, and those gathering a stack
    /// (`slow.rs`).
    slow: slow::Captures,
    /// The `/proc` sampling round (`samples.rs`).
    samples: samples::SampleRound,
    /// When the lines logged now and then were last logged (`paced.rs`).
    paced: paced::Paced,
    /// A binary upgrade's new supervisor, while it starts (`upgrade.rs`).
    successor: Option<upgrade::Successor>,
    /// Empty slots whose sockets hold connections no child can be handed
    /// (a pool of messages children): each gets a child again
    /// (`by_messages.rs`).
    refill: std::collections::BTreeSet<usize>,
    /// What the shell must carry out, in order.
    effects: Vec<Effect<L>>,
    /// An emptied effects list, kept for its memory.
    spare: Vec<Effect<L>>,
}

impl<L: HasChild> Core<L> {
    /// A core for `config` with no children yet.
    pub fn new(config: PoolConfig) -> Core<L> {
        Core {
            config,
            board: Scoreboard::new(),
            totals: Totals::default(),
            generation: 1,
            ping_seq: 0,
            shutdown: None,
            spawn_gate: SpawnGate::default(),
            memory: ScalingMemory::default(),
            width: Width::default(),
            templates: Vec::new(),
            template_backoff: StartBackoff::default(),
            templates_blocked_until: None,
            templates_ended_unready: 0,
            template_ever_ready: false,
            gave_up: None,
            rollout: None,
            highest_generation: 1,
            reforks: 0,
            orphans: VecDeque::new(),
            saturated_since: None,
            reading: sampled::BoardReading::default(),
            watches: cpu::Watches::default(),
            timers: timers::Timers::default(),
            jitter: fastrand::Rng::new(),
            slow: slow::Captures::default(),
            samples: samples::SampleRound::default(),
            paced: paced::Paced::default(),
            successor: None,
            refill: std::collections::BTreeSet::new(),
            effects: Vec::new(),
            spare: Vec::new(),
        }
    }

    /// Why the pool stopped itself, if it did (taken once: the
    /// supervisor then exits with this error instead of its totals).
    pub fn take_gave_up(&mut self) -> Option<String> {
        self.gave_up.take()
    }

    /// The pool's settings in force (a reload replaces them).
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// The children, slot by slot: read only; every move is the core's.
    pub fn board(&self) -> &Scoreboard<L> {
        &self.board
    }

    /// The shell's link of the child in `slot` (its channel, stderr pipe,
    /// pidfd), for the shell's own parts of it.
    pub fn link_mut(&mut self, slot: usize) -> Option<&mut L> {
        self.board.link_mut(slot)
    }

    /// From now on, children placed in slots serve many connections at
    /// once, each at most `capacity` (`Pool::run_sessions`).
    pub fn host_sessions(&mut self, capacity: u32) {
        self.board.host_sessions(capacity);
    }

    /// What happened so far, for status and metrics.
    pub fn totals(&self) -> &Totals {
        &self.totals
    }

    /// The generation new children are started in.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// The stop in progress, if any.
    pub fn shutdown(&self) -> Option<&Shutdown> {
        self.shutdown.as_ref()
    }

    /// What holds spawns back (`policy/backoff.rs`).
    pub fn spawn_gate(&self) -> &SpawnGate {
        &self.spawn_gate
    }

    /// Takes `input` at `now`; what the shell must do comes out of
    /// [`Core::take_effects`].
    pub fn on(&mut self, input: Input, now: Instant) {
        match input {
            Input::Report { slot, msg } => self.report(slot, msg, now),
            Input::Broken {
                slot,
                reason,
                detail,
            } => self.kill(slot, reason, detail, now),
            Input::ChannelClosed {
                slot,
                hung_up,
                claimed_is_child,
            } => {
                let claimed = self.board.link(slot).and_then(|l| l.child().role.claimed);
                if self.unverified(slot) && claimed.is_some() && !claimed_is_child {
                    self.give_up_unverified(slot, "closed its channel", false, now);
                } else {
                    self.channel_closed(slot, hung_up, now);
                }
            }
            Input::HungUp { slot } => {
                if let Some(link) = self.board.link_mut(slot) {
                    link.child_mut().role.hung_up = true;
                }
            }
            Input::SendFailed {
                slot,
                peer_gone,
                detail,
            } => self.send_failed(slot, peer_gone, detail, now),
            Input::Reaped { pid, status } => self.reaped_pid(pid, status, now),
            Input::TemplateReply { generation, reply } => {
                self.template_reply(generation, reply, now)
            }
            Input::TemplateClosed { generation } => self.template_closed(generation, now),
            Input::TemplateBroken { generation, detail } => self.kill_template(generation, detail),
            Input::Reload(config) => {
                if self.shutdown.is_none() {
                    self.reload(config, now)
                }
            }
            Input::Refork { slot } => self.reforked(slot, now),
            Input::Stop(Stop::Graceful) => self.begin_shutdown(now),
            Input::Stop(Stop::Now) => {
                tracing::info!("stopping now");
                self.stop_now(now)
            }
            Input::Tick => {
                self.check_liveness(now);
                self.check_templates(now);
            }
        }
    }

    /// What the shell must carry out, oldest first; the core forgets them.
    /// Hand the emptied list back with [`Core::give_back`], so the next
    /// input reuses its memory (an allocation per child report otherwise).
    pub fn take_effects(&mut self) -> Vec<Effect<L>> {
        std::mem::replace(&mut self.effects, std::mem::take(&mut self.spare))
    }

    /// The list [`Core::take_effects`] gave, carried out: kept for reuse.
    pub fn give_back(&mut self, mut done: Vec<Effect<L>>) {
        done.clear();
        if done.capacity() > self.spare.capacity() {
            self.spare = done;
        }
    }

    /// The earliest moment the core must be ticked without an input: a
    /// liveness deadline, the end of a spawn hold, a stop's deadline.
    pub fn next_deadline(&self, now: Instant) -> Option<Instant> {
        [
            self.liveness_deadline(),
            // Holds that have passed stay recorded until the next one; a
            // past instant here would make the loop spin.
            self.spawns_held_until(now),
            self.replacement_waits_until(now),
            self.stop_deadline(now),
            self.templates_deadline(),
            self.rollout_deadline(now),
            self.board_deadline(now),
            self.cpu_deadline(now),
            self.successor().map(|s| s.deadline),
            self.next_slow(),
            self.captures_deadline(),
            self.samples_deadline(),
            self.status_line_deadline(),
            self.timers_deadline(),
            // With no child to take it, a connection in the backlog is
            // looked at again now and then (`policy::dispatch`).
            crate::policy::dispatch::backlog_recheck_due(
                self.board.has_room(),
                self.board.counts().live(),
                self.config.dispatch.speaks_protocol(),
                now,
            ),
            // The pool is not sized by the scaling rule while it stops or
            // a reload rolls: a retire that fell due would be due until
            // then, and the loop would spin.
            self.memory
                .retire_due_in(&self.config, now)
                .filter(|_| self.shutdown.is_none() && self.rollout.is_none())
                .map(|d| now + d),
        ]
        .into_iter()
        .flatten()
        .min()
    }
}
