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
//! - **replaced** when it ends unasked, while the workers it forked keep
//!   serving: after 100 ms if it had said `R` (rate-limited), with a
//!   doubling back-off if it had not (a start failure); a reload's new
//!   template that ends before any of its workers was ready abandons the
//!   reload (`core/rollout.rs`);
//! - **told to quit** (`Q`) when its generation no longer serves, and at
//!   shutdown.
//!
//! The messages and their bytes are in `docs/protocol.md`, "Templates".

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Instant;

use nix::sys::signal::Signal;
use tracing::{info, warn};

use super::children::open_piped;
use super::event::Event;
use super::output::{finish, read_turn, ChildOutput};
use super::{ChildLink, Supervisor};
use crate::channel::{Channel, Incoming};
use crate::core::{Input, TemplateFailure};
use crate::exec::TemplateStart;
use crate::protocol::{TemplateRequest, TEMPLATE_VERSION};
use crate::sys::process::{self, Forked};

/// Replies read from one template per loop turn before the rest wait for
/// the next turn (the channel is re-armed so they are not forgotten).
const REPLIES_PER_TURN: usize = 64;

/// What the shell holds for one template: what it talks to it with.
#[derive(Debug)]
pub(crate) struct TemplateEnds {
    /// The pid it was started as (for its stderr lines).
    pid: i32,
    channel: Channel,
    output: Option<ChildOutput>,
    /// The last lines of its stderr, to quote when it fails.
    stderr_tail: Vec<String>,
    /// The template held by a pidfd (see `ChildLink::pidfd`).
    pidfd: Option<OwnedFd>,
    /// A reforked worker's own back-channel, kept open (never read) for
    /// the template's life: a worker told `T` while the kernel had given
    /// it a connection (kernel dispatch) may still write to it (an `I`)
    /// before it reads `T`, and must not find it closed.
    worker_channel: Option<Channel>,
}

/// The shell's side of the templates (the core keeps their state), and
/// what outlives any one of them.
#[derive(Debug, Default)]
pub(crate) struct Templates {
    /// Each template's ends, by generation.
    ends: BTreeMap<u32, TemplateEnds>,
    /// The worker command, to name in errors.
    pub command: String,
    /// Whether this process is a child subreaper yet.
    subreaper: bool,
    /// The template channel sent with a refork's `T`, until the core
    /// names the new template's generation (`refork.rs`).
    pub refork_channel: Option<Channel>,
}

impl Supervisor {
    /// Keeps one template for the generation being started, quits those
    /// no generation needs any more, and starts one when it is missing
    /// (unless its back-off holds). In the forked template process,
    /// returns what it needs to exec.
    pub(super) fn maintain_templates(&mut self, now: Instant) -> io::Result<Option<TemplateStart>> {
        let wanted = self.core.maintain_templates(now);
        self.carry_out(now);
        match wanted {
            Some(generation) => self.start_template(generation, now),
            None => Ok(None),
        }
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
        let (ours, theirs, output_read, output_write) = match open_piped() {
            Ok(ends) => ends,
            Err(why) => {
                // Template starts are held back.
                self.core.template_start_failed(now, &why);
                return Ok(None);
            }
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
                self.core
                    .template_start_failed(now, &format!("cannot fork the template: {e}"));
                Ok(None)
            }
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
        self.core.template_started(generation, pid, now);
        self.adopt_template(pid, pidfd, generation, ours, output)?;
        info!(
            pid,
            generation,
            "template started: `{}` loads once, workers are forked from it",
            self.templates.command
        );
        Ok(())
    }

    /// Takes `pid` on as the template of `generation` (which the core
    /// knows as starting: it must say `R` next): watches its channel and
    /// its stderr.
    pub(super) fn adopt_template(
        &mut self,
        pid: i32,
        pidfd: Option<OwnedFd>,
        generation: u32,
        channel: Channel,
        output: Option<ChildOutput>,
    ) -> io::Result<()> {
        if let Some(output) = &output {
            let event = Event::TemplateOutput(generation as usize);
            if let Err(e) = self.wake.watch(output.fd(), event) {
                warn!(pid, "cannot watch the template's stderr: {e}");
            }
        }
        let registered = self
            .wake
            .watch(channel.as_raw_fd(), Event::Template(generation as usize));
        self.templates.ends.insert(
            generation,
            TemplateEnds {
                pid,
                channel,
                output,
                stderr_tail: Vec::new(),
                pidfd,
                worker_channel: None,
            },
        );
        registered
    }

    /// In a freshly forked template: keep what it needs, close the rest.
    pub(super) fn into_template(mut self, mut start: TemplateStart) -> TemplateStart {
        let listeners = std::mem::take(&mut self.listeners);
        // Its workers get what an exec'd worker of this mode gets.
        if start.mode.children_hold_listeners() || self.options.children_take_next {
            start.listeners = listeners.into_iter().map(|l| l.listener).collect();
        }
        drop(self);
        start
    }

    /// Keeps a reforked worker's back-channel with its template (see
    /// [`TemplateEnds::worker_channel`]).
    pub(super) fn keep_worker_channel(&mut self, generation: u32, channel: Channel) {
        if let Some(ends) = self.templates.ends.get_mut(&generation) {
            ends.worker_channel = Some(channel);
        }
    }

    /// What the process just forked as the template of `generation` needs
    /// to exec.
    fn template_start(&self, generation: u32, channel: Channel, stderr: OwnedFd) -> TemplateStart {
        TemplateStart {
            generation,
            channel,
            mode: self.core.config().dispatch,
            listeners: Vec::new(),
            stderr: Some(stderr),
            supervisor_pid: process::parent_pid() as u32,
            // Its workers inherit them: one lifetime for all, without the
            // per-child jitter the supervisor draws for each.
            limits: self.core.self_limits(self.core.config().max_child_lifetime),
            backlog: self.core.config().backlog,
        }
    }

    /// Spawns through the template: takes the lowest free slot and orders
    /// the template of the current generation to fork its worker. Without
    /// a ready template, nothing happens: spawns wait for it.
    pub(super) fn fork_from_template(&mut self, now: Instant) -> io::Result<()> {
        let generation = self.core.generation();
        if !self.core.may_order(generation) {
            return Ok(());
        }
        let (ours, theirs, output_read, output_write) = match open_piped() {
            Ok(ends) => ends,
            Err(why) => {
                self.resource_backoff(now, why);
                return Ok(());
            }
        };
        // The worker's pid is taken from the kernel, not from the template.
        if let Err(e) = ours.pass_credentials() {
            self.resource_backoff(now, format!("cannot ask for a worker's credentials: {e}"));
            return Ok(());
        }
        // Read before the order goes out: the worker starts after it.
        let ordered_at_ticks = match crate::observe::procfs::boot_ticks_now() {
            Ok(ticks) => ticks,
            Err(e) => {
                self.resource_backoff(now, format!("cannot read the boot clock: {e}"));
                return Ok(());
            }
        };
        let slot = self.core.board().lowest_free();
        let order = TemplateRequest::Fork {
            slot: slot as u32,
            generation,
        };
        let Some(ends) = self.templates.ends.get(&generation) else {
            return Ok(());
        };
        let sent = ends
            .channel
            .send_template_request(order, &[theirs.as_fd(), output_write.as_fd()]);
        if let Err(e) = sent {
            self.template_broken(generation, format!("cannot send a fork order: {e}"), now);
            return Ok(());
        }
        self.core.ordered(generation, slot, now);
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
        let mut link = ChildLink::new(ours, output, now, true, TEMPLATE_VERSION);
        link.ordered_at_ticks = Some(ordered_at_ticks);
        self.core.adopt(slot, 0, generation, link, now);
        Ok(())
    }

    /// Reads what the template of `generation` sent, and feeds it to the
    /// core.
    pub(super) fn read_template(&mut self, generation: u32, now: Instant) {
        for _ in 0..REPLIES_PER_TURN {
            let open = self
                .core
                .template(generation)
                .is_some_and(|t| !t.channel_closed);
            let Some(ends) = self.templates.ends.get(&generation).filter(|_| open) else {
                return;
            };
            let incoming = match ends.channel.recv_template_reply() {
                Ok(incoming) => incoming,
                Err(e) => {
                    self.template_broken(
                        generation,
                        format!("template channel read failed: {e}"),
                        now,
                    );
                    return;
                }
            };
            match incoming {
                Incoming::Message(reply, _) => {
                    self.core
                        .on(Input::TemplateReply { generation, reply }, now);
                    self.carry_out(now);
                }
                Incoming::WouldBlock => return,
                Incoming::Closed => {
                    self.wake.forget(ends.channel.as_raw_fd());
                    self.core.on(Input::TemplateClosed { generation }, now);
                    self.carry_out(now);
                    return;
                }
                Incoming::Malformed(why) => {
                    self.template_broken(
                        generation,
                        format!("sent a malformed message: {why}"),
                        now,
                    );
                    return;
                }
            }
        }
        // More may be waiting: the poll is edge-triggered, so re-arm it.
        if let Some(ends) = self.templates.ends.get(&generation) {
            let event = Event::Template(generation as usize);
            let _ = self.wake.rewatch(ends.channel.as_raw_fd(), event);
        }
    }

    /// The template of `generation` cannot be talked to (`why`): the core
    /// kills it.
    pub(super) fn template_broken(&mut self, generation: u32, detail: String, now: Instant) {
        self.core
            .on(Input::TemplateBroken { generation, detail }, now);
        self.carry_out(now);
    }

    /// Carries out [`crate::core::Effect::SendTemplate`].
    pub(super) fn send_to_template(
        &mut self,
        generation: u32,
        request: TemplateRequest,
        now: Instant,
    ) {
        let Some(ends) = self.templates.ends.get(&generation) else {
            return;
        };
        if let Err(e) = ends.channel.send_template_request(request, &[]) {
            let what = match request {
                TemplateRequest::Ping { .. } => "a ping",
                TemplateRequest::Quit => "quit",
                _ => "a request",
            };
            self.template_broken(generation, format!("cannot send {what}: {e}"), now);
        }
    }

    /// Carries out [`crate::core::Effect::KillTemplate`]: SIGKILL to the
    /// template's whole group (its helpers, and the workers it forked that
    /// the kernel has not vouched for yet; verified workers have a group
    /// of their own and keep serving).
    pub(super) fn signal_template(&mut self, generation: u32) {
        let Some(ends) = self.templates.ends.get(&generation) else {
            return;
        };
        let pid = ends.pid;
        let sent = process::signal_group(pid, Signal::SIGKILL).and_then(|any| match any {
            true => Ok(()),
            false => match &ends.pidfd {
                Some(fd) => process::pidfd_signal(fd.as_fd(), Signal::SIGKILL),
                None => process::send_signal(pid, Signal::SIGKILL),
            },
        });
        if let Err(e) = sent {
            warn!(pid, "kill failed: {e}");
        }
    }

    /// The template of `generation` wrote to its stderr.
    pub(super) fn read_template_output(&mut self, generation: u32) {
        let Some(ends) = self.templates.ends.get_mut(&generation) else {
            return;
        };
        let (pid, now) = (ends.pid, Instant::now());
        let event = Event::TemplateOutput(generation as usize);
        let (output, tail) = (&mut ends.output, &mut ends.stderr_tail);
        let (dropped, flood) = read_turn(&self.wake, output, tail, event, now, |line| {
            log_line(generation, pid, line)
        });
        self.core.count(dropped);
        if let Some(why) = flood {
            self.template_broken(generation, why, now);
        }
    }

    /// Carries out [`crate::core::Effect::TemplateGone`]: stops watching
    /// the reaped template (logging the last of its stderr), sweeps its
    /// process group, and when it ended unasked, fails the reload it was
    /// for or holds the next template's start back.
    pub(super) fn template_gone(
        &mut self,
        generation: u32,
        pid: i32,
        failure: Option<TemplateFailure>,
        now: Instant,
    ) {
        let tail = match self.templates.ends.remove(&generation) {
            Some(ends) => self.close_template(generation, ends, now),
            None => Vec::new(),
        };
        self.sweep_template_group(pid, generation);
        let Some(failure) = failure else {
            return;
        };
        if let Some(failed) = &failure.reload_failed {
            // The reload's new code does not start: the old one serves.
            self.log_reload_failed(failed, &tail);
            return;
        }
        let (command, of) = (&self.templates.command, (generation, pid));
        if let Some(line) = self
            .core
            .template_failure_words(&failure, of, command, &tail)
        {
            tracing::error!("{line}");
        }
    }

    /// Stops watching a reaped template, logging the last of its stderr;
    /// returns its stderr's last lines.
    fn close_template(
        &mut self,
        generation: u32,
        mut ends: TemplateEnds,
        now: Instant,
    ) -> Vec<String> {
        let pid = ends.pid;
        let (output, tail) = (&mut ends.output, &mut ends.stderr_tail);
        let dropped = finish(&self.wake, output, tail, now, |line| {
            log_line(generation, pid, line)
        });
        if let Some(dropped) = dropped {
            self.core.count(dropped);
        }
        self.wake.forget(ends.channel.as_raw_fd());
        ends.stderr_tail
    }

    /// For a worker that says `Ready` before its template's `W` was read:
    /// reads the template's replies first (they were sent before it).
    pub(super) fn learn_pid_from_template(&mut self, slot: usize, now: Instant) {
        let Some(generation) = self.core.board().get(slot).map(|s| s.generation) else {
            return;
        };
        self.read_template(generation, now);
    }
}

fn log_line(generation: u32, pid: i32, line: &str) {
    info!(generation, pid, "template stderr: {line}");
}
