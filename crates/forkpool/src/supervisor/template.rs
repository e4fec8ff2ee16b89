//! Templates (`--preload`): the worker program started once, loaded, and
//! ordered to fork each worker, so what it loads is shared copy-on-write.
//!
//! A template's life, as the supervisor sees it:
//! - **started** for the current generation when the pool has none (and
//!   not while its restart back-off holds): forked and exec'd like a
//!   worker, with `FORKPOOL_TEMPLATE_FD` instead of a slot (`exec.rs`);
//! - **ready** once it says `R` with its pid; until then no worker is
//!   ordered, so spawns wait for it, and one that takes longer than a
//!   worker's start deadline is killed;
//! - **ordered** to fork: a spawn takes the lowest free slot at once with
//!   pid 0, sends `F slot generation` with the worker's channel and stderr
//!   pipe, and learns the pid from the answer `W` (or frees the slot on
//!   `E`). The worker, reparented to the supervisor (a child subreaper),
//!   then says `R` like any worker, in protocol version 2;
//! - **pinged** while idle, like a worker; one that misses a ping, sits on
//!   a fork order, or breaks the protocol is killed (`SIGKILL`, itself
//!   only: workers it forked are not its children any more);
//! - **replaced** when it ends unasked, with back-off, while the workers
//!   it forked keep serving; a template that fails before `R` is a start
//!   failure, and the failure of a reload's new template abandons the
//!   reload (`rollout.rs`);
//! - **told to quit** (`Q`) when its generation no longer serves, and at
//!   shutdown.
//!
//! The messages and their bytes are in `docs/protocol.md`, "Templates".

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::Interest;
use nix::sys::signal::Signal;
use tracing::{debug, error, info, warn};

use super::event::Event;
use super::output::{ChildOutput, Left, BYTES_PER_TURN};
use super::{ChildLink, Supervisor};
use crate::channel::{Channel, Incoming};
use crate::exec::TemplateStart;
use crate::policy::backoff::{StartBackoff, START_WINDOW};
use crate::policy::budget::{STDERR_FLOOD_LIMIT, STDERR_LINES_PER_SECOND};
use crate::policy::liveness::{
    template_check, Deadlines, TemplateCheck as Check, TemplateFacts, TemplatePhase,
};
use crate::protocol::{TemplateReply, TemplateRequest, TEMPLATE_VERSION};
use crate::sys::fds;
use crate::sys::process::{self, ExitStatus, Forked};

/// Replies read from one template per loop turn before the rest wait for
/// the next turn (the channel is re-armed so they are not forgotten).
const REPLIES_PER_TURN: usize = 64;
/// Processes reaped without a slot that are remembered, in case a
/// template's `W` names one of them afterwards (a worker that died at
/// once). More than any burst of such deaths between two loop turns.
const ORPHANS_KEPT: usize = 64;

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

/// The supervisor's side of one template process.
#[derive(Debug)]
pub(crate) struct Template {
    /// The generation whose workers it forks.
    pub generation: u32,
    pub pid: i32,
    channel: Channel,
    /// Its channel reached end of file: it is exiting.
    channel_closed: bool,
    pub state: TemplateState,
    pub started_at: Instant,
    pub ready_at: Option<Instant>,
    last_heard: Instant,
    /// The ping it has not answered yet: its sequence number and when.
    ping: Option<(u32, Instant)>,
    /// Fork orders sent and not answered yet, by slot, with when.
    pending: BTreeMap<usize, Instant>,
    /// By when it must have exited (told to quit, or its channel closed).
    exit_deadline: Option<Instant>,
    /// Why it was killed, for the log at reap.
    killed_for: Option<String>,
    output: Option<ChildOutput>,
    /// The last lines of its stderr, to quote when it fails.
    stderr_tail: Vec<String>,
    /// Workers it has forked.
    pub forks: u64,
    /// The template held by a pidfd (see `ChildLink::pidfd`).
    pidfd: Option<OwnedFd>,
}

/// Every template the supervisor has (one per generation, two while a
/// reload rolls), and what outlives any one of them.
#[derive(Debug, Default)]
pub(crate) struct Templates {
    pub list: Vec<Template>,
    /// The worker command, to name in errors.
    pub command: String,
    /// Start-up failures and unplanned ends in a row.
    backoff: StartBackoff,
    /// No template is started before this.
    blocked_until: Option<Instant>,
    /// Processes reaped that held no slot (see [`ORPHANS_KEPT`]).
    orphans: VecDeque<(i32, ExitStatus)>,
    /// Whether this process is a child subreaper yet.
    subreaper: bool,
    /// `refork_after` thresholds used so far.
    pub reforks: usize,
}

impl Templates {
    /// Remembers a reaped process that held no slot.
    pub fn remember_orphan(&mut self, pid: i32, status: ExitStatus) {
        if self.orphans.len() == ORPHANS_KEPT {
            self.orphans.pop_front();
        }
        self.orphans.push_back((pid, status));
    }

    fn take_orphan(&mut self, pid: i32) -> Option<ExitStatus> {
        let i = self.orphans.iter().position(|(p, _)| *p == pid)?;
        self.orphans.remove(i).map(|(_, status)| status)
    }

    /// The slot of a fork order to the template of `generation` was
    /// freed: an answer for it is no longer expected (one that comes
    /// anyway breaks the protocol).
    pub fn forget_order(&mut self, generation: u32, slot: usize) {
        if let Some(i) = self.index(generation) {
            self.list[i].pending.remove(&slot);
        }
    }

    fn index(&self, generation: u32) -> Option<usize> {
        self.list.iter().position(|t| t.generation == generation)
    }

    /// Whether the template of `generation` is ready for fork orders.
    pub fn has_ready(&self, generation: u32) -> bool {
        self.list
            .iter()
            .any(|t| t.generation == generation && t.state == TemplateState::Ready)
    }

    /// The template of `generation`, if it is ready for fork orders.
    fn ready(&mut self, generation: u32) -> Option<&mut Template> {
        self.list
            .iter_mut()
            .find(|t| t.generation == generation && t.state == TemplateState::Ready)
    }
}

impl Template {
    /// `R`: the template is loaded and takes fork orders.
    fn said_ready(&mut self, pid: u32, now: Instant) -> Result<(), String> {
        if self.state != TemplateState::Starting {
            return Err("said Ready twice".into());
        }
        if i64::from(pid) != i64::from(self.pid) {
            return Err(format!("said it is pid {pid}, but it is pid {}", self.pid));
        }
        self.state = TemplateState::Ready;
        self.ready_at = Some(now);
        let took = now.duration_since(self.started_at);
        info!(
            pid,
            generation = self.generation,
            ?took,
            "template ready: forking workers from it"
        );
        Ok(())
    }

    /// `W`: the template forked the worker for `slot`; counts it.
    fn forked(&mut self, slot: usize) -> Result<(), String> {
        self.fork_answered(slot)?;
        self.forks += 1;
        Ok(())
    }

    /// The fork order for `slot` is answered; an error if none was
    /// outstanding.
    fn fork_answered(&mut self, slot: usize) -> Result<(), String> {
        if self.pending.remove(&slot).is_none() {
            return Err(format!(
                "answered a fork order for slot {slot} that was not outstanding"
            ));
        }
        Ok(())
    }

    /// `P`: the answer to a ping; an error unless it answers the one sent.
    fn pong(&mut self, seq: u32) -> Result<(), String> {
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
    fn next_check(&self, config: &crate::config::PoolConfig) -> Option<(Instant, Check)> {
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
        template_check(&facts, &Deadlines::of(config))
    }
}

impl Supervisor {
    /// Keeps one template for the generation being started, quits those
    /// no generation needs any more, and starts one when it is missing
    /// (unless its back-off holds). In the forked template process,
    /// returns what it needs to exec.
    pub(super) fn maintain_templates(&mut self, now: Instant) -> io::Result<Option<TemplateStart>> {
        if self.core.shutdown.is_some() {
            return Ok(None);
        }
        let current = self.core.generation;
        let serving = self.rollouts.serving(current);
        let unneeded: Vec<u32> = self
            .templates
            .list
            .iter()
            .filter(|t| {
                let needed = (t.generation == current && self.core.config.preload)
                    || (t.generation == serving && self.rollouts.active());
                !needed && matches!(t.state, TemplateState::Starting | TemplateState::Ready)
            })
            .map(|t| t.generation)
            .collect();
        for generation in unneeded {
            self.quit_template(generation, now);
        }
        if !self.core.config.preload
            || self.templates.index(current).is_some()
            || self.templates.blocked_until.is_some_and(|t| now < t)
        {
            return Ok(None);
        }
        self.start_template(current, now)
    }

    /// Forks and execs a template for `generation`.
    fn start_template(
        &mut self,
        generation: u32,
        now: Instant,
    ) -> io::Result<Option<TemplateStart>> {
        if !self.templates.subreaper {
            process::become_subreaper()?;
            self.templates.subreaper = true;
        }
        let Some((ours, theirs, output_read, output_write)) = self.open_template_ends(now) else {
            return Ok(None);
        };
        match self.fork_child()? {
            Ok(Forked::Child) => {
                drop(ours);
                drop(output_read);
                Ok(Some(self.template_start(generation, theirs, output_write)))
            }
            Ok(Forked::Parent(pid)) => {
                drop(theirs);
                drop(output_write);
                self.template_forked(pid, generation, ours, output_read, now)?;
                Ok(None)
            }
            Err(e) => {
                self.hold_templates(now, format!("cannot fork the template: {e}"));
                Ok(None)
            }
        }
    }

    /// Opens a new template's channel pair (ours, theirs) and stderr pipe
    /// (read, write). `None` when one cannot be opened; template starts
    /// are then held back (see [`Self::hold_templates`]).
    fn open_template_ends(&mut self, now: Instant) -> Option<(Channel, Channel, OwnedFd, OwnedFd)> {
        let (ours, theirs) = match Channel::pair() {
            Ok(pair) => pair,
            Err(e) => {
                self.hold_templates(now, format!("cannot create a template channel: {e}"));
                return None;
            }
        };
        match fds::pipe() {
            Ok((output_read, output_write)) => Some((ours, theirs, output_read, output_write)),
            Err(e) => {
                self.hold_templates(
                    now,
                    format!("cannot create the template's stderr pipe: {e}"),
                );
                None
            }
        }
    }

    /// What the process just forked as the template of `generation` needs
    /// to exec.
    fn template_start(&self, generation: u32, channel: Channel, stderr: OwnedFd) -> TemplateStart {
        TemplateStart {
            generation,
            channel,
            mode: self.core.config.dispatch,
            listeners: Vec::new(),
            stderr: Some(stderr),
            supervisor_pid: process::parent_pid() as u32,
        }
    }

    /// The parent's side of forking a template: takes `pid` on as the
    /// template of `generation` (see [`Self::adopt_template`]).
    fn template_forked(
        &mut self,
        pid: i32,
        generation: u32,
        ours: Channel,
        output_read: OwnedFd,
        now: Instant,
    ) -> io::Result<()> {
        let _ = process::own_process_group(pid);
        let output = match ChildOutput::new(output_read) {
            Ok(output) => Some(output),
            Err(e) => {
                warn!(pid, "cannot read the template's stderr: {e}");
                None
            }
        };
        // Just forked and not reaped: the pid is certainly the template.
        let pidfd = super::children::hold(pid);
        self.adopt_template(pid, pidfd, generation, ours, output, now)?;
        info!(
            pid,
            generation,
            "template started: `{}` loads once, workers are forked from it",
            self.templates.command
        );
        Ok(())
    }

    /// Takes `pid` on as the template of `generation`, starting (it must
    /// say `R` next): watches its channel and its stderr.
    pub(super) fn adopt_template(
        &mut self,
        pid: i32,
        pidfd: Option<OwnedFd>,
        generation: u32,
        channel: Channel,
        output: Option<ChildOutput>,
        now: Instant,
    ) -> io::Result<()> {
        self.templates.list.push(Template {
            generation,
            pid,
            channel,
            channel_closed: false,
            state: TemplateState::Starting,
            started_at: now,
            ready_at: None,
            last_heard: now,
            ping: None,
            pending: BTreeMap::new(),
            exit_deadline: None,
            killed_for: None,
            output,
            stderr_tail: Vec::new(),
            forks: 0,
            pidfd,
        });
        let t = self.templates.list.last().expect("just pushed");
        if let Some(output) = &t.output {
            let registered = self.poll.registry().register(
                &mut SourceFd(&output.pipe.as_raw_fd()),
                Event::TemplateOutput(generation as usize).token(),
                Interest::READABLE,
            );
            if let Err(e) = registered {
                warn!(pid, "cannot watch the template's stderr: {e}");
            }
        }
        self.poll.registry().register(
            &mut SourceFd(&t.channel.as_raw_fd()),
            Event::Template(generation as usize).token(),
            Interest::READABLE,
        )
    }

    /// In a freshly forked template: keep what it needs, close the rest.
    pub(super) fn into_template(mut self, mut start: TemplateStart) -> TemplateStart {
        let listeners = std::mem::take(&mut self.listeners);
        // Its workers get what an exec'd worker of this mode gets.
        if start.mode.children_hold_listeners() || self.children_take_next {
            start.listeners = listeners.into_iter().map(|l| l.listener).collect();
        }
        drop(self);
        start
    }

    /// Holds template starts back after a failure (`why`), doubling.
    fn hold_templates(&mut self, now: Instant, why: String) -> Duration {
        let delay = self.templates.backoff.failed(now);
        self.templates.blocked_until = Some(now + delay);
        error!("{why}; trying again in {delay:?}");
        delay
    }

    /// Spawns through the template: takes the lowest free slot and orders
    /// the template of the current generation to fork its worker. Without
    /// a ready template, nothing happens: spawns wait for it.
    pub(super) fn fork_from_template(&mut self, now: Instant) -> io::Result<()> {
        let generation = self.core.generation;
        if self.templates.ready(generation).is_none()
            || self.unverified_of(generation) >= super::verify::UNVERIFIED_PER_TEMPLATE
        {
            return Ok(());
        }
        let (ours, theirs) = match Channel::pair() {
            Ok(pair) => pair,
            Err(e) => {
                self.resource_backoff(now, format!("cannot create a back-channel: {e}"));
                return Ok(());
            }
        };
        let (output_read, output_write) = match fds::pipe() {
            Ok(pair) => pair,
            Err(e) => {
                self.resource_backoff(now, format!("cannot create a stderr pipe: {e}"));
                return Ok(());
            }
        };
        // The worker's pid is taken from the kernel, not from the template.
        if let Err(e) = ours.pass_credentials() {
            self.resource_backoff(now, format!("cannot ask for a worker's credentials: {e}"));
            return Ok(());
        }
        let slot = self.core.board.lowest_free();
        let order = TemplateRequest::Fork {
            slot: slot as u32,
            generation,
        };
        let template = self.templates.ready(generation).expect("checked above");
        let sent = template
            .channel
            .send_template_request(order, &[theirs.as_fd(), output_write.as_fd()]);
        if let Err(e) = sent {
            self.kill_template(generation, format!("cannot send a fork order: {e}"));
            return Ok(());
        }
        template.pending.insert(slot, now);
        drop(theirs);
        drop(output_write);
        self.register_channel(slot, &ours)?;
        let output = match ChildOutput::new(output_read) {
            Ok(output) => {
                if let Err(e) = self.register_output(slot, &output) {
                    warn!(slot, "cannot watch the worker's stderr: {e}");
                }
                Some(output)
            }
            Err(e) => {
                warn!(slot, "cannot read the worker's stderr: {e}");
                None
            }
        };
        let link = ChildLink::new(ours, output, now, true, TEMPLATE_VERSION);
        self.core.adopt(slot, 0, generation, link, now);
        Ok(())
    }

    /// Reads what the template of `generation` sent.
    pub(super) fn read_template(&mut self, generation: u32, now: Instant) {
        for _ in 0..REPLIES_PER_TURN {
            let Some(i) = self.templates.index(generation) else {
                return;
            };
            let t = &self.templates.list[i];
            if t.channel_closed {
                return;
            }
            let incoming = match t.channel.recv_template_reply() {
                Ok(incoming) => incoming,
                Err(e) => {
                    self.kill_template(generation, format!("template channel read failed: {e}"));
                    return;
                }
            };
            match incoming {
                Incoming::Message(reply, _) => {
                    self.templates.list[i].last_heard = now;
                    if let Err(why) = self.apply_template_reply(generation, reply, now) {
                        self.kill_template(generation, format!("broke the protocol: {why}"));
                        return;
                    }
                }
                Incoming::WouldBlock => return,
                Incoming::Closed => {
                    let t = &mut self.templates.list[i];
                    t.channel_closed = true;
                    let deadline = super::liveness::exit_by(
                        now,
                        &self.core.config,
                        self.core.shutdown.as_ref(),
                    );
                    t.exit_deadline = Some(t.exit_deadline.map_or(deadline, |d| d.min(deadline)));
                    let fd = t.channel.as_raw_fd();
                    let _ = self.poll.registry().deregister(&mut SourceFd(&fd));
                    return;
                }
                Incoming::Malformed(why) => {
                    self.kill_template(generation, format!("sent a malformed message: {why}"));
                    return;
                }
            }
        }
        // More may be waiting: the poll is edge-triggered, so re-arm it.
        if let Some(i) = self.templates.index(generation) {
            let fd = self.templates.list[i].channel.as_raw_fd();
            let token = Event::Template(generation as usize).token();
            let _ = self
                .poll
                .registry()
                .reregister(&mut SourceFd(&fd), token, Interest::READABLE);
        }
    }

    /// What one reply of a template means. An error is a violation.
    fn apply_template_reply(
        &mut self,
        generation: u32,
        reply: TemplateReply,
        now: Instant,
    ) -> Result<(), String> {
        let i = self.templates.index(generation).expect("caller found it");
        let t = &mut self.templates.list[i];
        match reply {
            TemplateReply::Ready { pid } => t.said_ready(pid, now),
            TemplateReply::Forked { slot, pid } => {
                t.forked(slot as usize)?;
                let claimed = self.worker_forked(slot as usize, pid, now);
                if claimed.is_err() {
                    // Its order is answered, badly: no worker will come
                    // for this slot that the supervisor could trust.
                    self.abandon_unverified(slot as usize);
                    self.count_failed_start(now);
                }
                claimed
            }
            TemplateReply::ForkFailed { slot, errno } => {
                t.fork_answered(slot as usize)?;
                self.template_fork_failed(slot as usize, errno, now);
                Ok(())
            }
            TemplateReply::Pong { seq } => t.pong(seq),
        }
    }

    /// The template could not fork the worker for `slot` (`errno`): the
    /// slot is freed and spawning backs off.
    fn template_fork_failed(&mut self, slot: usize, errno: u32, now: Instant) {
        let err = io::Error::from_raw_os_error(errno as i32);
        self.abandon_unverified(slot);
        self.resource_backoff(
            now,
            format!("the template could not fork the worker for slot {slot}: {err}"),
        );
    }

    /// The template said the worker for `slot` is `pid`: a claim, kept
    /// until the worker's first message proves it (`verify.rs`). Refused
    /// outright when it names no process, a template, or a pid a slot
    /// already holds or claims.
    fn worker_forked(&mut self, slot: usize, pid: u32, now: Instant) -> Result<(), String> {
        let pid = crate::policy::verification::claimable(pid, |p| self.pid_taken(p, None))
            .map_err(|why| format!("said slot {slot} is pid {why}"))?;
        let Some(link) = self.core.board.link_mut(slot) else {
            return Err(format!(
                "said slot {slot} is pid {pid}, but the slot is gone"
            ));
        };
        link.child.claimed = Some(pid);
        if let Some(status) = self.templates.take_orphan(pid) {
            // It died before its template's answer was read: a start that
            // failed, reaped by the supervisor, so the claim holds.
            self.child_exited(slot, pid, status, now);
            return Ok(());
        }
        debug!(
            slot,
            pid,
            generation = self.core.generation,
            "the template forked a worker; its pid is trusted once the kernel confirms it"
        );
        Ok(())
    }

    /// The template of `generation` wrote to its stderr.
    pub(super) fn read_template_output(&mut self, generation: u32) {
        let Some(i) = self.templates.index(generation) else {
            return;
        };
        let t = &mut self.templates.list[i];
        let pid = t.pid;
        let Some(output) = t.output.as_mut() else {
            return;
        };
        let now = Instant::now();
        let left = output.read_lines(BYTES_PER_TURN, now, |line| log_line(generation, pid, line));
        self.core.totals.stderr_lines_dropped += std::mem::take(&mut output.gate.dropped);
        if output.gate.flooding_too_long(now) {
            self.kill_template(
                generation,
                format!(
                    "wrote more than {STDERR_LINES_PER_SECOND} lines a second to stderr \
                     for {STDERR_FLOOD_LIMIT:?}"
                ),
            );
            return;
        }
        match left {
            Ok(Left::Empty) => {}
            Ok(Left::More) => {
                let fd = output.pipe.as_raw_fd();
                let token = Event::TemplateOutput(generation as usize).token();
                let _ =
                    self.poll
                        .registry()
                        .reregister(&mut SourceFd(&fd), token, Interest::READABLE);
            }
            Ok(Left::Closed) | Err(_) => {
                if let Some(mut output) = t.output.take() {
                    output.save_tail(&mut t.stderr_tail);
                    self.forget_output(&output);
                }
            }
        }
    }

    /// SIGKILLs the template of `generation` (itself only: the workers it
    /// forked are the supervisor's children and keep serving). The reaper
    /// starts another.
    pub(super) fn kill_template(&mut self, generation: u32, why: String) {
        let Some(i) = self.templates.index(generation) else {
            return;
        };
        let t = &mut self.templates.list[i];
        if t.state == TemplateState::Killed {
            return;
        }
        warn!(pid = t.pid, generation, "killing the template: {why}");
        // Its whole group: its helpers, and the workers it forked that
        // the kernel has not vouched for yet (verified workers have a
        // group of their own and keep serving).
        let sent = process::signal_group(t.pid, Signal::SIGKILL).and_then(|any| match any {
            true => Ok(()),
            false => match &t.pidfd {
                Some(fd) => process::pidfd_signal(fd.as_fd(), Signal::SIGKILL),
                None => process::send_signal(t.pid, Signal::SIGKILL),
            },
        });
        if let Err(e) = sent {
            warn!(pid = t.pid, "kill failed: {e}");
        }
        t.state = TemplateState::Killed;
        t.killed_for = Some(why);
        t.ping = None;
        if self.core.shutdown.is_none() {
            self.core.totals.templates_killed += 1;
        }
    }

    /// Tells the template of `generation` to exit.
    fn quit_template(&mut self, generation: u32, now: Instant) {
        let Some(i) = self.templates.index(generation) else {
            return;
        };
        let deadline =
            super::liveness::exit_by(now, &self.core.config, self.core.shutdown.as_ref());
        let t = &mut self.templates.list[i];
        if !matches!(t.state, TemplateState::Starting | TemplateState::Ready) {
            return;
        }
        t.state = TemplateState::Quitting;
        t.exit_deadline = Some(deadline);
        t.ping = None;
        info!(
            pid = t.pid,
            generation, "template no longer needed: told to quit"
        );
        if let Err(e) = t.channel.send_template_request(TemplateRequest::Quit, &[]) {
            self.kill_template(generation, format!("cannot send quit: {e}"));
        }
    }

    /// At shutdown: every template is told to quit.
    pub(super) fn quit_templates(&mut self, now: Instant) {
        let all: Vec<u32> = self.templates.list.iter().map(|t| t.generation).collect();
        for generation in all {
            self.quit_template(generation, now);
        }
    }

    /// At an immediate stop: every template is killed.
    pub(super) fn kill_templates(&mut self) {
        let all: Vec<u32> = self.templates.list.iter().map(|t| t.generation).collect();
        for generation in all {
            self.kill_template(generation, "immediate stop".into());
        }
    }

    /// Pings quiet templates and kills those that missed a deadline.
    pub(super) fn check_templates(&mut self, now: Instant) {
        let due: Vec<(u32, Check)> = self
            .templates
            .list
            .iter()
            .filter_map(|t| {
                let (at, check) = t.next_check(&self.core.config)?;
                (now >= at).then_some((t.generation, check))
            })
            .collect();
        for (generation, check) in due {
            let why = match check {
                Check::PingDue => {
                    self.ping_template(generation, now);
                    continue;
                }
                Check::Exit => format!(
                    "did not exit in time after being told to quit or closing its channel \
                     (exit_timeout {:?}, or the stop's deadline if sooner)",
                    self.core.config.exit_timeout
                ),
                Check::Start => format!(
                    "did not say Ready within {:?} of starting",
                    super::liveness::start_timeout(&self.core.config)
                ),
                Check::Fork => {
                    // The order it sat on is a worker that did not start.
                    self.count_failed_start(now);
                    format!(
                        "did not answer a fork order within {:?}",
                        super::liveness::start_timeout(&self.core.config)
                    )
                }
                Check::PingAnswer => format!(
                    "did not answer a ping within {:?}",
                    self.core.config.ping_timeout
                ),
            };
            self.kill_template(generation, why);
        }
    }

    fn ping_template(&mut self, generation: u32, now: Instant) {
        self.core.ping_seq = self.core.ping_seq.wrapping_add(1);
        let seq = self.core.ping_seq;
        let Some(i) = self.templates.index(generation) else {
            return;
        };
        let t = &mut self.templates.list[i];
        match t
            .channel
            .send_template_request(TemplateRequest::Ping { seq }, &[])
        {
            Ok(()) => t.ping = Some((seq, now)),
            Err(e) => self.kill_template(generation, format!("cannot send a ping: {e}")),
        }
    }

    /// The earliest template deadline, for the loop's timer.
    pub(super) fn templates_deadline(&self) -> Option<Instant> {
        let next_check = self
            .templates
            .list
            .iter()
            .filter_map(|t| t.next_check(&self.core.config).map(|(at, _)| at))
            .min();
        let start = self.templates.blocked_until.filter(|_| {
            self.core.config.preload && self.templates.index(self.core.generation).is_none()
        });
        match (next_check, start) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// If `pid` was a template: logs how it ended, frees the slots of its
    /// unanswered fork orders and arranges its replacement. Returns
    /// whether it was one.
    pub(super) fn template_exited(&mut self, pid: i32, status: ExitStatus, now: Instant) -> bool {
        let Some(i) = self.templates.list.iter().position(|t| t.pid == pid) else {
            return false;
        };
        let mut t = self.templates.list.remove(i);
        self.close_template(&mut t, now);
        self.sweep_template_group(pid, t.generation);
        // Its unanswered fork orders will never be answered, and the
        // workers it forked that were not verified died in its group.
        let unverified: Vec<usize> = self
            .core
            .board
            .iter()
            .filter(|(slot, s)| s.generation == t.generation && self.unverified(*slot))
            .map(|(slot, _)| slot)
            .collect();
        for slot in unverified {
            self.abandon_unverified(slot);
        }
        if t.state == TemplateState::Quitting || self.core.shutdown.is_some() {
            info!(pid, generation = t.generation, %status, forks = t.forks, "template exited");
        } else {
            self.template_failed(t, status, now);
        }
        true
    }

    /// Stops watching a reaped template, logging the last of its stderr
    /// (and keeping its tail to quote).
    fn close_template(&mut self, t: &mut Template, now: Instant) {
        let (generation, pid) = (t.generation, t.pid);
        if let Some(mut output) = t.output.take() {
            let _ = output.read_lines(BYTES_PER_TURN, now, |line| log_line(generation, pid, line));
            output.flush_partial(now, &mut |line| log_line(generation, pid, line));
            output.save_tail(&mut t.stderr_tail);
            self.forget_output(&output);
        }
        if !t.channel_closed {
            let _ = self
                .poll
                .registry()
                .deregister(&mut SourceFd(&t.channel.as_raw_fd()));
        }
    }

    /// A template ended unasked (`status`): a reload whose new template
    /// never got ready is abandoned; otherwise a new template is started
    /// after a back-off.
    fn template_failed(&mut self, mut t: Template, status: ExitStatus, now: Instant) {
        let (generation, pid) = (t.generation, t.pid);
        let how = t.killed_for.take().map_or_else(
            || format!("exited unexpectedly ({status})"),
            |why| format!("was killed ({why})"),
        );
        let said = if t.stderr_tail.is_empty() {
            String::from("nothing on stderr")
        } else {
            format!("stderr: {}", t.stderr_tail.join(" | "))
        };
        let in_rollout = self.rollouts.active() && generation == self.core.generation;
        if t.ready_at.is_none() && in_rollout {
            // The reload's new code does not start: keep the old one.
            self.rollout_start_failed(
                generation,
                &format!("(the template) {how}"),
                &t.stderr_tail,
                now,
            );
            return;
        }
        if t.ready_at
            .is_some_and(|at| now.duration_since(at) >= START_WINDOW)
        {
            // It had been up: this is not a run of start-up failures.
            self.templates.backoff.reset();
        }
        self.core.totals.template_restarts += 1;
        let stage = if t.ready_at.is_none() {
            " before it was ready"
        } else {
            "; the workers it forked keep serving"
        };
        self.hold_templates(
            now,
            format!(
                "template `{}` (pid {pid}, generation {generation}) {how}{stage}; {said}; \
                 a new template will be started",
                self.templates.command
            ),
        );
    }

    /// Each template as `forkpool status` shows it.
    pub(super) fn template_statuses(&self, now: Instant) -> Vec<crate::status::TemplateStatus> {
        self.templates
            .list
            .iter()
            .map(|t| {
                let memory = crate::observe::procfs::sample_process(t.pid)
                    .ok()
                    .map(|s| s.memory);
                crate::status::TemplateStatus {
                    pid: t.pid,
                    generation: t.generation,
                    state: t.state.name().to_string(),
                    uptime_ms: now.duration_since(t.started_at).as_millis() as u64,
                    ready_after_ms: t
                        .ready_at
                        .map(|at| at.duration_since(t.started_at).as_millis() as u64),
                    forks: t.forks,
                    pending_forks: t.pending.len() as u32,
                    rss_bytes: memory.map(|m| m.rss_bytes),
                    pss_bytes: memory.map(|m| m.pss_bytes),
                    uss_bytes: memory.map(|m| m.uss_bytes),
                }
            })
            .collect()
    }

    /// For a worker that says `Ready` before its template's `W` was read:
    /// reads the template's replies first (they were sent before it).
    pub(super) fn learn_pid_from_template(&mut self, slot: usize, now: Instant) {
        let Some(generation) = self.core.board.get(slot).map(|s| s.generation) else {
            return;
        };
        self.read_template(generation, now);
    }
}

fn log_line(generation: u32, pid: i32, line: &str) {
    info!(generation, pid, "template stderr: {line}");
}
