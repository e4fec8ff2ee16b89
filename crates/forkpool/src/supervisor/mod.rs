//! The parent: one thread, one event loop, never blocked on a child.
//!
//! [`Supervisor::run`] is the whole life of the parent. Each turn it waits
//! for something to happen (a listener readable, a child's report, a signal,
//! or the next deadline), handles it, then lets the scaling policy look at
//! the pool and carries out what it says. Every step is a named verb in one
//! of the files beside this one:
//! - `event.rs`: everything the loop waits on, as one enum, and the poll,
//!   signals and unread channels that wake it;
//! - `options.rs`: what the pool was built with (output capture, reload
//!   source, credentials, listeners that outlive it);
//! - `effects.rs`: each effect of the core, carried out;
//! - `link.rs`: the supervisor's side of one child (channel, stderr,
//!   pidfd), kept in the child's scoreboard slot;
//! - `children.rs`: spawn, reap, retire, kill;
//! - `reports.rs`: what a child's message means for its slot, and the
//!   core's deadlines (pings, start, busy, stop) ticked each turn;
//! - `dispatching.rs`: lends [`crate::dispatch`] the slot table and acts on
//!   how each pass ended (stop watching, pause, kill an unreachable child);
//! - `kernel.rs`: kernel dispatch: set up or fall back, a socket per slot,
//!   the scoreboard and its reservations read into the core;
//! - `backoff.rs`: holding spawns back while workers fail at start-up;
//! - `cpu.rs`: the run-queue looks at the children the core's watches
//!   name when a look is due (the scaling hold, the dispatch width);
//! - `load.rs`: how children that serve many connections count;
//! - `recycle.rs`, `resources.rs`: the children the core names recycled
//!   (by count, memory and age), on the `/proc` samples of the children
//!   each turn of the core's sampling round names, which status shows too;
//! - `slow.rs`: slow requests captured where they wait: `/proc` read and
//!   the stack asked for, the capture the core completes logged;
//! - `template.rs`, `verify.rs`, `refork.rs`: `--preload` templates, a
//!   forked worker's pid checked against the kernel, reforks;
//! - `reload.rs`: HUP and TTIN/TTOU; a reload's failure logged;
//! - `upgrade.rs`: USR2, a new binary taking the listeners over;
//! - `stop_backlog.rs`: a graceful stop serves what was queued first;
//! - `signals.rs`: signal flags and the self-pipe that wakes the loop;
//! - `output.rs`: exec'd workers' and templates' stderr pipes read, the
//!   lines (cut and paced by `core/stderr.rs`) logged with the slot;
//! - `containment.rs`: what a worker starts goes when it goes;
//! - `published.rs`, `balancer.rs`, `endpoints/`: the pool as of a turn's
//!   end, its capacity for a load balancer, and the status, metrics and
//!   agent endpoints that answer from it;
//! - `notify.rs`, `watchdog.rs`: systemd's readiness and watchdog.
//!
//! How a connection reaches a child is in [`crate::dispatch`]; the rules
//! the supervisor follows (how many children, which child, which deadline)
//! are pure functions in `crate::policy`, and every decision with memory
//! (when to sample, capture, recycle, look at the CPUs, log a paced line)
//! is the core's (`crate::core`): a verb here does the I/O it asks for.

mod backoff;
mod balancer;
mod children;
mod containment;
mod cpu;
mod dispatching;
mod effects;
mod endpoints;
mod event;
mod kernel;
mod link;
mod load;
mod merge_pages;
mod notify;
mod options;
mod output;
mod published;
mod recycle;
mod refork;
mod reload;
mod reports;
mod resources;
mod signals;
mod slow;
mod stop_backlog;
mod template;
mod upgrade;
mod verify;
mod watchdog;

pub(crate) use endpoints::Endpoints;
pub use endpoints::{AGENT_FD_NAME, METRICS_FD_NAME};
pub use reload::ReloadSource;
pub use upgrade::{UpgradeCommand, READY_FD_ENV, SOCKET_ACTIVATED_ENV, UPGRADE_FROM_ENV};

use std::io;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll};
use tracing::{info, warn};

use crate::channel::Channel;
use crate::config::PoolConfig;
use crate::dispatch::{Dispatcher, WatchedListener};
use crate::listener::Listener;
use crate::policy::dispatch;
use crate::policy::shutdown::{self, Stop};
use crate::scaling::Decision;
use crate::status::Totals;
use crate::worker::ChildStart;

use crate::core::{Core, Input as CoreInput, Timer};
use event::Event;
pub(crate) use link::ChildLink;
use output::ChildOutput;
use signals::Signals;

/// How the loop ended.
pub(crate) enum Exit {
    /// The pool shut down; these are its totals.
    Done(Totals),
    /// This process is a freshly forked child and must run the worker.
    Child(ChildStart),
    /// This process is a freshly forked template (`--preload`) and must
    /// exec the worker program as one.
    Template(crate::exec::TemplateStart),
}

/// The parent process's state.
pub(crate) struct Supervisor {
    /// What wakes the loop: the poll, the signals, and children with
    /// reports left unread last turn.
    wake: event::Wake,
    /// What the pool was built with: output capture, next-connection
    /// taking, the reload source, listeners outliving it, credentials.
    pub(crate) options: options::ShellOptions,
    /// systemd: told ready yet, and its watchdog.
    notify: notify::Notify,
    pub listeners: Vec<WatchedListener>,
    /// The children, slot by slot, and the rules' memory (no I/O).
    pub core: Core<ChildLink>,
    pub(crate) endpoints: endpoints::Endpoints,
    /// The agent check, `/live`, `/ready` and the drain delay.
    balancer: balancer::Balancer,
    /// A binary upgrade's two ends: the command, the successor starting,
    /// the predecessor waiting (`upgrade.rs`).
    pub(crate) handover: upgrade::Handover,
    /// Children's CPU, memory and peers, listeners' queues.
    pub(crate) resources: resources::Resources,
    /// Templates the workers are forked from (`--preload`).
    pub(crate) templates: template::Templates,
    /// Where connections go: parked ones and the dispatch latency.
    pub(crate) dispatcher: Dispatcher,
    /// Kernel dispatch's scoreboard and socket groups, when it runs
    /// (`kernel.rs`).
    pub(crate) kernel: Option<crate::dispatch::kernel::Kernel>,
    /// The pool as of the end of the last turn, for the endpoints; also
    /// the supervisor's pid and start.
    published: published::Published,
}

impl Supervisor {
    /// A supervisor for `config` serving `listeners`, with its poll, its
    /// signal pipe and no children yet.
    ///
    /// One function on purpose: it is the constructor, listing every field
    /// once with its starting value (each field's meaning is on the struct).
    pub fn new(config: PoolConfig, listeners: Vec<Listener>) -> io::Result<Supervisor> {
        for listener in &listeners {
            listener.set_defer_accept(config.defer_accept)?;
        }
        merge_pages::apply(config.merge_pages).map_err(io::Error::other)?;
        let poll = Poll::new()?;
        let signals = Signals::register()?;
        let signal_pipe = signals.pipe()?;
        poll.registry().register(
            &mut SourceFd(&signal_pipe.as_raw_fd()),
            Event::Signal.token(),
            Interest::READABLE,
        )?;
        let listeners = listeners.into_iter().map(WatchedListener::new).collect();
        let mut core = Core::new(config);
        if let Some(seed) = recycle::jitter_seed() {
            core.seed_jitter(seed);
        }
        Ok(Supervisor {
            wake: event::Wake {
                poll,
                signals,
                signal_pipe,
                unread: Vec::new(),
                orphaned_sockets: Vec::new(),
            },
            options: options::ShellOptions::default(),
            notify: notify::Notify {
                told_ready: false,
                watchdog: watchdog::Watchdog::from_env(Instant::now()),
            },
            core,
            listeners,
            endpoints: endpoints::Endpoints::default(),
            balancer: balancer::Balancer::default(),
            handover: upgrade::Handover {
                predecessor: crate::sys::process::take_fd_from_env(READY_FD_ENV)?,
                ..Default::default()
            },
            resources: resources::Resources::default(),
            templates: template::Templates::default(),
            dispatcher: Dispatcher::default(),
            kernel: None,
            published: published::Published::new(Instant::now()),
        })
    }

    /// The parent's life: returns when the pool has shut down, or, in a
    /// freshly forked child, at once with what the child needs.
    pub fn run(mut self) -> io::Result<Exit> {
        self.watch_listeners(Instant::now())?;
        self.endpoints.register(self.wake.poll.registry())?;
        let mut events = Events::with_capacity(256);
        let mut ready: Vec<Event> = Vec::with_capacity(256);
        loop {
            let now = Instant::now();
            if let Some(start) = self.maintain_templates(now)? {
                return Ok(Exit::Template(self.into_template(start)));
            }
            if let Some(start) = self.maintain_pool(now)? {
                return Ok(Exit::Child(self.into_child(start)));
            }
            if self.finished(now) {
                info!(totals = ?self.core.totals(), "all children gone, supervisor exiting");
                self.endpoints.remove_control_file();
                if let Some(why) = self.core.take_gave_up() {
                    return Err(io::Error::other(why));
                }
                return Ok(Exit::Done(*self.core.totals()));
            }
            let timeout = if self.wake.unread.is_empty() && !self.endpoints.has_more() {
                self.next_deadline(now)
                    .map(|d| d.saturating_duration_since(now))
            } else {
                Some(Duration::ZERO)
            };
            match self.wake.poll.poll(&mut events, timeout) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            ready.clear();
            ready.extend(self.wake.unread.drain(..).map(Event::Child));
            ready.extend(events.iter().filter_map(|e| Event::from_token(e.token())));
            let now = Instant::now();
            // Kernel dispatch: the children's states, as they are now.
            self.read_board(now);
            // Reports first: a child that just became idle should take the
            // connection that woke us in the same turn, so listeners are
            // only marked here and served after every other event.
            for event in ready.iter().copied() {
                self.handle(event, now)?;
            }
            self.dispatch_marked(now);
            self.keep_up(Instant::now());
            self.ask_for_idle_children(Instant::now());
            if ready.contains(&Event::Endpoints) || self.endpoints.has_more() {
                // Published on the turns it is read: a handoff pool turns
                // once a connection, and no other turn needs the copy.
                let now = Instant::now();
                self.publish(now);
                self.serve_endpoints(now);
            }
            let only_reports = ready.iter().all(|e| matches!(e, Event::Child(_)));
            let stopping = self.core.shutdown().is_some();
            let has_room = self.core.board().has_room();
            if let Some(pause) =
                dispatch::report_batch_pause(has_room, ready.len(), only_reports, stopping)
            {
                // Waits for a signal, never past the pause.
                self.wake.signal_pipe.wait(pause);
            }
        }
    }

    /// After each turn's events: the checks that run whatever woke the
    /// loop, each a verb that does nothing until its deadline or condition.
    fn keep_up(&mut self, now: Instant) {
        if self.has_room_for_overflow() {
            self.rewatch_listeners(now);
        }
        // Before the deadlines: a capture completed gives its child's busy
        // deadline back to them.
        self.watch_slow(now);
        self.check_liveness(now);
        self.notify_ready_once();
        self.endpoints.expire_clients(now);
        self.endpoints.check_accept_pause(now);
        self.check_upgrade(now);
        self.check_drain(now);
        self.check_backlog_finish(now);
        self.log_scoreboard(now);
        self.keep_watchdog(now);
        self.sample_resources(now);
    }

    /// One event, one verb.
    fn handle(&mut self, event: Event, now: Instant) -> io::Result<()> {
        match event {
            Event::Signal => self.handle_signals(now)?,
            Event::Upgrade => self.upgrade_progress(now),
            // Served after the turn, from what it publishes.
            Event::Endpoints => {}
            Event::Output(slot) => self.read_output(slot),
            Event::Template(generation) => self.read_template(generation as u32, now),
            Event::TemplateOutput(generation) => self.read_template_output(generation as u32),
            Event::Child(slot) => self.read_reports(slot, now),
            Event::SlotSocket(slot, listener) => self.take_orphaned(slot, listener, now),
            Event::Listener(i) => {
                if let Some(l) = self.listeners.get_mut(i) {
                    l.recheck = true;
                }
            }
        }
        Ok(())
    }

    /// Signals set flags in handlers; here is where they take effect.
    fn handle_signals(&mut self, now: Instant) -> io::Result<()> {
        self.wake.signal_pipe.drain();
        if self.wake.signals.take_child_exited() {
            self.reap_children(now)?;
        }
        if self.wake.signals.take_reload() && self.core.shutdown().is_none() {
            notify::reloading();
            self.reload(now);
            if !self.core.rolling() {
                notify::ready();
            }
        }
        if self.wake.signals.take_upgrade() && self.core.shutdown().is_none() {
            self.begin_upgrade(now);
        }
        let spare_change = self.wake.signals.take_spare_change();
        if spare_change != 0 {
            self.adjust_spare(spare_change);
        }
        let quit = self.wake.signals.take_quit();
        let interrupts = self.wake.signals.take_interrupts();
        let terminate = self.wake.signals.take_terminate();
        let stopping = self.core.shutdown().is_some();
        match shutdown::on_stop_signals(interrupts, terminate, quit, stopping) {
            Some(Stop::Now) => {
                info!(quit, interrupts, stopping, "stop signals");
                self.core.on(CoreInput::Stop(Stop::Now), now);
                self.carry_out(now);
            }
            Some(Stop::Graceful) => self.stop_requested(now),
            None => {}
        }
        Ok(())
    }

    /// Graceful stop (`core/stop.rs`).
    fn begin_shutdown(&mut self, now: Instant) {
        self.core.on(CoreInput::Stop(Stop::Graceful), now);
        self.carry_out(now);
    }

    /// Whether the stop is over: every child and template reaped, or the
    /// stop's last moment passed (what is left is logged).
    fn finished(&self, now: Instant) -> bool {
        if !self.core.finished(now) {
            return false;
        }
        if let Some(left) = self.core.left_unreaped() {
            tracing::error!(
                children = ?left.children,
                templates = ?left.templates,
                "stop deadline passed with processes not yet reaped (slot, pid); \
                 exiting anyway: they were sent SIGKILL and get SIGTERM from the \
                 parent-death signal"
            );
        }
        true
    }

    /// Asks the policy what to do and does it.
    fn maintain_pool(&mut self, now: Instant) -> io::Result<Option<ChildStart>> {
        if self.core.shutdown().is_some() {
            return Ok(None);
        }
        self.consider_refork(now);
        if self.core.refork_wants_spare() {
            // A worker to serve while slot 0 becomes the template.
            self.steer_width(now);
            return self.spawn_gated(1, now);
        }
        if let Some(spawn) = self.core.rollout_spawns(now) {
            // The width follows the load while a reload rolls too: frozen,
            // connections waited with idle children left out of it.
            self.steer_width(now);
            self.carry_out(now);
            return self.spawn_gated(spawn, now);
        }
        let mut pool = self.scaling_counts();
        if self.core.config().dispatch.speaks_protocol() {
            pool.cpu = self.cpu_use(now);
        }
        if self.steer_width(now) {
            // Children beyond the width took the waiting connections'
            // place: the pool is counted again before it grows.
            let cpu = pool.cpu;
            pool = self.scaling_counts();
            pool.cpu = cpu;
        }
        let decision = self.core.decide(pool, now);
        match decision {
            Decision::Spawn(n) => {
                if self.core.spawns_held(now) || self.core.replacement_waits_until(now).is_some() {
                    return Ok(None);
                }
                self.core.busy_changed();
                return self.spawn_gated(n, now);
            }
            Decision::Retire(_) => self.carry_out(now),
            _ => match self.core.scaling_said(decision, &pool, now) {
                Some(Ok(news)) => info!("{news}"),
                Some(Err(warning)) => warn!("{warning}"),
                None => {}
            },
        }
        Ok(None)
    }

    /// Connections waiting in the listen backlogs, where the kernel says;
    /// in kernel dispatch, after a takeover, those on busy children's
    /// sockets too (`kernel.rs`).
    fn queued(&self) -> u32 {
        let backlogs: u32 = self.listeners.iter().map(|l| l.listener.queued()).sum();
        backlogs + self.core.queued_behind(Instant::now())
    }

    /// The earliest moment the loop must wake without an event: the
    /// core's answer, once the shell's own timers are armed in it.
    fn next_deadline(&mut self, now: Instant) -> Option<Instant> {
        self.arm_timers(now);
        self.core.next_deadline(now)
    }

    /// Arms in the core each timer a mechanism of the shell keeps
    /// (`core/timers.rs`).
    fn arm_timers(&mut self, now: Instant) {
        let pause = accept_pause(self.listeners.iter().map(|l| l.resume_at), now);
        let armed = [
            (Timer::AcceptPause, pause),
            (Timer::Endpoints, self.endpoints.deadline()),
            (Timer::Watchdog, self.notify.watchdog.map(|w| w.due())),
            (Timer::Drain, self.drain_deadline()),
            (
                Timer::Finishing,
                self.balancer.finishing.map(|f| f.deadline()),
            ),
        ];
        for (timer, at) in armed {
            self.core.arm(timer, at);
        }
    }

    /// Logs the "child states" line when the core says it is due.
    fn log_scoreboard(&mut self, now: Instant) {
        if let Some(line) = self.core.status_line_due(now) {
            info!("child states: {line}");
            notify::status(&line);
        }
    }

    /// In a freshly forked child: keep what the worker needs, close the rest.
    fn into_child(mut self, mut start: ChildStart) -> ChildStart {
        let listeners = std::mem::take(&mut self.listeners);
        start.listener_is_tcp = listeners.iter().map(|l| l.listener.is_tcp()).collect();
        if let Some(kernel) = self.kernel.take() {
            let pool: Vec<Listener> = listeners.into_iter().map(|l| l.listener).collect();
            match kernel.into_seat(start.slot, &pool) {
                Ok(seat) => {
                    start.listeners = seat.own;
                    start.board = Some(seat.board);
                    start.board_map = Some(seat.board_map);
                    start.overflow = pool;
                }
                Err(e) => {
                    tracing::error!(slot = start.slot, "kernel dispatch: {e}");
                    std::process::exit(1);
                }
            }
        } else if start.mode.children_hold_listeners() || self.options.children_take_next {
            start.listeners = listeners.into_iter().map(|l| l.listener).collect();
        }
        // Dropping the rest closes the poll, the signal pipe and every other
        // child's channel, which this child must not hold open.
        drop(self);
        start
    }

    fn register_channel(&self, slot: usize, channel: &Channel) -> io::Result<()> {
        self.wake.watch(channel.as_raw_fd(), Event::Child(slot))
    }

    fn deregister_channel(&self, channel: &Channel) {
        self.wake.forget(channel.as_raw_fd());
    }

    /// Starts watching listeners the supervisor accepts or orders for.
    pub(crate) fn watch_listeners(&mut self, now: Instant) -> io::Result<()> {
        for i in 0..self.listeners.len() {
            self.watch_listener(i, now)?;
        }
        Ok(())
    }

    pub(crate) fn watch_listener(&mut self, i: usize, now: Instant) -> io::Result<()> {
        let l = &mut self.listeners[i];
        if l.watched
            || self.core.shutdown().is_some()
            || !self.core.config().dispatch.parent_watches_listeners()
            || l.resume_at.is_some_and(|t| now < t)
        {
            return Ok(());
        }
        l.resume_at = None;
        self.wake
            .watch(l.listener.as_raw_fd(), Event::Listener(i))?;
        l.watched = true;
        Ok(())
    }

    /// Stops watching a listener: its connections wait in the backlog.
    pub(crate) fn unwatch_listener(&mut self, i: usize) {
        let l = &mut self.listeners[i];
        if l.watched {
            self.wake.forget(l.listener.as_raw_fd());
            l.watched = false;
        }
    }

    pub(crate) fn unwatch_listeners(&mut self) {
        for i in 0..self.listeners.len() {
            self.unwatch_listener(i);
        }
    }

    /// Resumes listeners paused for lack of idle children or descriptors.
    pub(crate) fn rewatch_listeners(&mut self, now: Instant) {
        if self.core.shutdown().is_some() {
            return;
        }
        for i in 0..self.listeners.len() {
            let paused = !self.listeners[i].watched;
            if paused {
                if let Err(e) = self.watch_listener(i, now) {
                    warn!(listener = i, "cannot watch listener again: {e}");
                }
            }
        }
    }
}

/// When the first listener paused after a failed accept resumes, of the
/// listeners' `resumes`: only a moment ahead of `now` (one passed is
/// resumed this turn; waking for it would spin).
fn accept_pause(resumes: impl Iterator<Item = Option<Instant>>, now: Instant) -> Option<Instant> {
    resumes.flatten().filter(|t| *t > now).min()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_accept_pause_is_the_first_resume_ahead() {
        let now = Instant::now();
        let ms = |n| now + Duration::from_millis(n);
        let resumes = [None, Some(ms(30)), Some(now), Some(ms(10))];
        assert_eq!(accept_pause(resumes.into_iter(), now), Some(ms(10)));
        assert_eq!(accept_pause([Some(now), None].into_iter(), now), None);
    }
}
