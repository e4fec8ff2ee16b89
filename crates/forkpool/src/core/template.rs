//! What the core knows of one template (`--preload`): the worker program
//! loaded once and ordered to fork each worker. Its channel, stderr and
//! pidfd are the shell's (`supervisor/template.rs`).

use std::collections::BTreeMap;
use std::time::Instant;

use crate::policy::liveness::{
    template_check, Deadlines, TemplateCheck, TemplateFacts, TemplatePhase,
};

/// Where a template is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TemplateState {
    /// Exec'd, loading; it has not said `R` yet.
    Starting,
    /// Waiting for fork orders.
    Ready,
    /// Told to quit.
    Quitting,
    /// Sent `SIGKILL`; waiting to be reaped.
    Killed,
}

impl TemplateState {
    /// The name `forkpool status` shows.
    pub fn name(self) -> &'static str {
        match self {
            TemplateState::Starting => "starting",
            TemplateState::Ready => "ready",
            TemplateState::Quitting => "quitting",
            TemplateState::Killed => "killed",
        }
    }
}

/// The core's knowledge of one template process.
#[derive(Debug, Clone)]
pub(crate) struct Template {
    /// The generation whose workers it forks.
    pub generation: u32,
    /// Its pid (the supervisor forked it, or it was slot 0's worker).
    pub pid: i32,
    /// Its channel reached end of file: it is exiting.
    pub channel_closed: bool,
    /// Where it is in its life.
    pub state: TemplateState,
    /// When it was started.
    pub started_at: Instant,
    /// When it said `R`.
    pub ready_at: Option<Instant>,
    /// When it last sent anything.
    pub last_heard: Instant,
    /// The ping it has not answered yet: its sequence number and when.
    pub ping: Option<(u32, Instant)>,
    /// Fork orders sent and not answered yet, by slot, with when.
    pub pending: BTreeMap<usize, Instant>,
    /// By when it must have exited (told to quit, or its channel closed).
    pub exit_deadline: Option<Instant>,
    /// Why it was killed, for the log at reap.
    pub killed_for: Option<String>,
    /// Workers it has forked.
    pub forks: u64,
}

impl Template {
    /// A template of `generation`, `pid`, just started at `now`.
    pub fn new(generation: u32, pid: i32, now: Instant) -> Template {
        Template {
            generation,
            pid,
            channel_closed: false,
            state: TemplateState::Starting,
            started_at: now,
            ready_at: None,
            last_heard: now,
            ping: None,
            pending: BTreeMap::new(),
            exit_deadline: None,
            killed_for: None,
            forks: 0,
        }
    }

    /// `R`: the template is loaded and takes fork orders.
    pub fn said_ready(&mut self, pid: u32, now: Instant) -> Result<(), String> {
        if self.state != TemplateState::Starting {
            return Err("said Ready twice".into());
        }
        if i64::from(pid) != i64::from(self.pid) {
            return Err(format!("said it is pid {pid}, but it is pid {}", self.pid));
        }
        self.state = TemplateState::Ready;
        self.ready_at = Some(now);
        Ok(())
    }

    /// The fork order for `slot` is answered; an error if none was
    /// outstanding.
    pub fn fork_answered(&mut self, slot: usize) -> Result<(), String> {
        if self.pending.remove(&slot).is_none() {
            return Err(format!(
                "answered a fork order for slot {slot} that was not outstanding"
            ));
        }
        Ok(())
    }

    /// `P`: the answer to a ping; an error unless it answers the one sent.
    pub fn pong(&mut self, seq: u32) -> Result<(), String> {
        match self.ping {
            Some((sent, _)) if sent == seq => {
                self.ping = None;
                Ok(())
            }
            _ => Err(format!("answered ping {seq}, which was never sent")),
        }
    }

    /// The one deadline that applies to it next, with what missing it
    /// means (`policy::liveness::template_check`).
    pub fn next_check(&self, limits: &Deadlines) -> Option<(Instant, TemplateCheck)> {
        let facts = TemplateFacts {
            phase: match self.state {
                TemplateState::Starting => TemplatePhase::Starting,
                TemplateState::Ready => TemplatePhase::Ready,
                TemplateState::Quitting | TemplateState::Killed => TemplatePhase::Leaving,
            },
            started_at: self.started_at,
            last_heard: self.last_heard,
            // A killed template only waits to be reaped.
            exit_deadline: self
                .exit_deadline
                .filter(|_| self.state != TemplateState::Killed),
            oldest_order: self.pending.values().min().copied(),
            ping_sent: self.ping.map(|(_, sent)| sent),
        };
        template_check(&facts, limits)
    }
}
