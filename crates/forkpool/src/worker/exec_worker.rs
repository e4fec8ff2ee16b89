//! A Rust worker that `forkpool run` starts as its own executable.
//!
//! ```no_run
//! use std::io::Write;
//! use forkpool::worker::ExecWorker;
//!
//! let worker = match ExecWorker::from_env() {
//!     Ok(worker) => worker,
//!     Err(e) => {
//!         eprintln!("{e}");
//!         std::process::exit(2);
//!     }
//! };
//! // Load what the handler needs here, once per worker process.
//! let code = worker.serve(|mut conn: forkpool::Connection<'_>| {
//!     let _ = conn.stream.write_all(b"hello\n");
//! });
//! std::process::exit(code);
//! ```
//!
//! [`ExecWorker::from_env`] reads the layout [`crate::exec`] describes
//! (`FORKPOOL_CHANNEL_FD`, `LISTEN_FDS`, …), takes ownership of the
//! inherited descriptors (and marks them close-on-exec, so programs the
//! handler runs do not inherit them), and [`ExecWorker::serve`] runs the
//! same loops as a forked library child. The environment variables are
//! left in place; `LISTEN_PID` names this process, so a program the
//! handler starts will not take them for its own.

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use forkpool_protocol::layout::{SUPERVISOR_PID_VAR, TEMPLATE_FD_VAR};
use tracing::error;

use super::{run_child_speaking, ChildEnd, ChildStart, Handler, SelfLimits};
use crate::channel::{Channel, Incoming};
use crate::config::DispatchMode;
use crate::dispatch::kernel::board::Board;
use crate::exec::{
    BOARD_FD_VAR, CHANNEL_FD_VAR, DISPATCH_VAR, FIRST_FD, GENERATION_VAR, KERNEL_DISPATCH_VAR,
    LISTEN_FDS_VAR, LISTEN_PID_VAR, MAX_CHILD_LIFETIME_MS_VAR, MAX_CHILD_MEMORY_VAR,
    MAX_REQUESTS_VAR, OVERFLOW_FD_VAR, PROTOCOL_VAR, SLOT_VAR,
};
use crate::listener::Listener;
use crate::protocol::{self, TemplateReply, TemplateRequest};
use crate::sys;
use crate::sys::process::Forked;

/// Set once the inherited descriptors have been claimed: a second claim
/// would make two owners of one descriptor.
static CLAIMED: AtomicBool = AtomicBool::new(false);

/// A worker process started by `forkpool run`, ready to serve; or, under
/// `forkpool run --preload`, the template the workers are forked from.
pub struct ExecWorker {
    role: Role,
    after_fork: Vec<Box<dyn FnMut()>>,
}

/// Why [`ExecWorker::from_env`] could not set up the worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecWorkerError {
    message: String,
}

impl fmt::Display for ExecWorkerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot start as a forkpool worker: {}", self.message)
    }
}

impl std::error::Error for ExecWorkerError {}

fn fail<T>(message: impl Into<String>) -> Result<T, ExecWorkerError> {
    Err(ExecWorkerError {
        message: message.into(),
    })
}

/// How long a forked worker waits to be reparented to the supervisor.
const REPARENT_DEADLINE: Duration = Duration::from_secs(5);

/// What the environment announces, before any descriptor is touched.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Layout {
    mode: DispatchMode,
    generation: u32,
    /// The back-channel, or the template channel: always 3 + listeners.
    channel_fd: RawFd,
    listener_fds: Vec<RawFd>,
    /// `kernel` dispatch: the overflow listeners and the scoreboard map.
    kernel: Option<KernelLayout>,
    /// `kernel` dispatch: the memory and lifetime limits the worker
    /// checks itself (a template passes them on to its workers).
    limits: SelfLimits,
    role: LayoutRole,
}

/// Where a `kernel` dispatch worker finds the overflow and the board.
#[derive(Debug, Clone, PartialEq, Eq)]
struct KernelLayout {
    overflow_fds: Vec<RawFd>,
    board_fd: RawFd,
    /// Connections before it leaves on its own (0: no limit).
    max_requests: u64,
}

/// Whether the program runs as a worker or as a template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LayoutRole {
    /// An exec'd worker for this slot (protocol version 1).
    Worker { slot: usize },
    /// A template (protocol version 2) of the supervisor with this pid.
    Template { supervisor_pid: u32 },
}

/// Reads the layout from `var` (the environment, or a test's map) for the
/// process `pid`.
///
/// One function on purpose: a flat list of variables, each read, checked
/// and given an error that names the fix, in the order later checks need.
fn read_layout(var: impl Fn(&str) -> Option<String>, pid: u32) -> Result<Layout, ExecWorkerError> {
    let required = |name: &str| {
        var(name).ok_or_else(|| ExecWorkerError {
            message: format!(
                "{name} is not set; run this program under `forkpool run ... -- PROGRAM`"
            ),
        })
    };
    let number = |name: &str, text: String| {
        text.trim().parse::<u64>().map_err(|_| ExecWorkerError {
            message: format!("{name}={text:?} is not a number"),
        })
    };
    let mut mode: DispatchMode = required(DISPATCH_VAR)?
        .parse()
        .map_err(|e: String| ExecWorkerError { message: e })?;
    // Kernel dispatch is announced as handoff plus this, for workers that
    // predate it.
    if mode == DispatchMode::Handoff && var(KERNEL_DISPATCH_VAR).as_deref() == Some("1") {
        mode = DispatchMode::Kernel;
    }
    if !mode.speaks_protocol() {
        return fail(
            "the pool runs with --dispatch none, which has no back-channel: \
             accept on the LISTEN_FDS listeners directly instead",
        );
    }
    let template = var(TEMPLATE_FD_VAR).is_some();
    let (speaks, channel_var) = if template {
        (protocol::TEMPLATE_VERSION, TEMPLATE_FD_VAR)
    } else {
        (protocol::VERSION, CHANNEL_FD_VAR)
    };
    let version = required(PROTOCOL_VAR)?;
    if version.trim() != speaks.to_string() {
        let role = if template { "a template" } else { "a worker" };
        return fail(format!(
            "the supervisor speaks back-channel protocol {version}, this program as {role} \
             speaks {speaks}; use matching forkpool versions"
        ));
    }
    let role = if template {
        let supervisor = number(SUPERVISOR_PID_VAR, required(SUPERVISOR_PID_VAR)?)?;
        LayoutRole::Template {
            supervisor_pid: u32::try_from(supervisor).map_err(|_| ExecWorkerError {
                message: format!("{SUPERVISOR_PID_VAR} is out of range"),
            })?,
        }
    } else {
        LayoutRole::Worker {
            slot: number(SLOT_VAR, required(SLOT_VAR)?)? as usize,
        }
    };
    let generation =
        u32::try_from(number(GENERATION_VAR, required(GENERATION_VAR)?)?).map_err(|_| {
            ExecWorkerError {
                message: format!("{GENERATION_VAR} is out of range"),
            }
        })?;
    let channel_fd = number(channel_var, required(channel_var)?)?;
    let listeners = match var(LISTEN_FDS_VAR) {
        None => 0,
        Some(n) => {
            let listen_pid = number(LISTEN_PID_VAR, required(LISTEN_PID_VAR)?)?;
            if listen_pid != u64::from(pid) {
                return fail(format!(
                    "LISTEN_PID is {listen_pid} but this process is {pid}: the listeners were \
                     passed to another process (a shell wrapper that forks instead of `exec`ing?)"
                ));
            }
            number(LISTEN_FDS_VAR, n)?
        }
    };
    if mode.children_hold_listeners() && listeners == 0 {
        return fail(format!(
            "dispatch '{mode}' needs the listeners, but LISTEN_FDS is not set"
        ));
    }
    let expected = u64::from(FIRST_FD as u32) + listeners;
    if channel_fd != expected {
        return fail(format!(
            "{channel_var} is {channel_fd}, but with {listeners} listener(s) it must be {expected}"
        ));
    }
    let kernel = match (mode, &role) {
        (DispatchMode::Kernel, LayoutRole::Worker { .. }) => {
            let overflow = number(OVERFLOW_FD_VAR, required(OVERFLOW_FD_VAR)?)?;
            let board = number(BOARD_FD_VAR, required(BOARD_FD_VAR)?)?;
            if overflow != expected + 1 || board != overflow + listeners {
                return fail(format!(
                    "{OVERFLOW_FD_VAR}={overflow} and {BOARD_FD_VAR}={board} do not follow the \
                     channel {expected} and {listeners} listener(s); use matching forkpool versions"
                ));
            }
            Some(KernelLayout {
                overflow_fds: (0..listeners as RawFd)
                    .map(|i| overflow as RawFd + i)
                    .collect(),
                board_fd: board as RawFd,
                max_requests: var(MAX_REQUESTS_VAR)
                    .map(|n| number(MAX_REQUESTS_VAR, n))
                    .transpose()?
                    .unwrap_or(0),
            })
        }
        _ => None,
    };
    let limits = match mode {
        DispatchMode::Kernel => read_self_limits(&var)?,
        _ => SelfLimits::default(),
    };
    Ok(Layout {
        mode,
        generation,
        channel_fd: channel_fd as RawFd,
        listener_fds: (0..listeners as RawFd).map(|i| FIRST_FD + i).collect(),
        kernel,
        limits,
        role,
    })
}

/// `FORKPOOL_MAX_CHILD_MEMORY` and `FORKPOOL_MAX_CHILD_LIFETIME_MS` from
/// `var`: absent or 0, no limit.
fn read_self_limits(var: impl Fn(&str) -> Option<String>) -> Result<SelfLimits, ExecWorkerError> {
    let number = |name: &str| -> Result<u64, ExecWorkerError> {
        let Some(text) = var(name) else {
            return Ok(0);
        };
        text.trim().parse::<u64>().map_err(|_| ExecWorkerError {
            message: format!("{name}={text:?} is not a number"),
        })
    };
    Ok(SelfLimits {
        max_memory: number(MAX_CHILD_MEMORY_VAR)?,
        lifetime: Duration::from_millis(number(MAX_CHILD_LIFETIME_MS_VAR)?),
    })
}

impl ExecWorker {
    /// Reads the environment `forkpool run` set up and takes the inherited
    /// back-channel (or template channel) and listeners. Call it once,
    /// early, before anything else in the program opens descriptors it
    /// might confuse with them.
    pub fn from_env() -> Result<ExecWorker, ExecWorkerError> {
        let layout = read_layout(|name| std::env::var(name).ok(), std::process::id())?;
        if CLAIMED.swap(true, Ordering::SeqCst) {
            return fail("ExecWorker::from_env was already called in this process");
        }
        let io_error = |what: String| {
            move |e: std::io::Error| ExecWorkerError {
                message: format!("{what}: {e}"),
            }
        };
        let mut listeners = Vec::with_capacity(layout.listener_fds.len());
        for fd in &layout.listener_fds {
            let owned =
                sys::fds::take_inherited(*fd).map_err(io_error(format!("listener {fd}")))?;
            let listener =
                Listener::from_inherited(owned).map_err(io_error(format!("listener {fd}")))?;
            listeners.push(listener);
        }
        let channel_fd = layout.channel_fd;
        let channel = sys::fds::take_inherited(channel_fd)
            .map_err(io_error(format!("back-channel {channel_fd}")))?;
        let kind = socket2::SockRef::from(&channel).r#type();
        if !matches!(kind, Ok(t) if t == socket2::Type::SEQPACKET) {
            return fail(format!(
                "back-channel {channel_fd} is not a SOCK_SEQPACKET socket"
            ));
        }
        // The child's end is ours alone (the supervisor holds the other
        // end), so setting it blocking affects nobody else.
        sys::socket::set_nonblocking(channel.as_fd(), false)
            .map_err(io_error(format!("back-channel {channel_fd}")))?;
        let channel = Channel::from_fd(channel);
        let role = match layout.role {
            LayoutRole::Worker { slot } => {
                let mut start =
                    worker_start(slot, layout.generation, channel, layout.mode, listeners);
                if let Some(kernel) = &layout.kernel {
                    take_board(&mut start, kernel)?;
                }
                start.limits = layout.limits;
                Role::Worker {
                    start,
                    version: protocol::VERSION,
                }
            }
            LayoutRole::Template { supervisor_pid } => Role::Template(Template {
                channel,
                listeners,
                mode: layout.mode,
                generation: layout.generation,
                supervisor: supervisor_pid as i32,
                limits: layout.limits,
            }),
        };
        Ok(ExecWorker {
            role,
            after_fork: Vec::new(),
        })
    }

    /// Adds a hook that runs once in every worker process before it says
    /// `Ready`: in an exec'd worker, and in each worker forked from a
    /// template (`--preload`) once it is set up, so state that must not be
    /// shared between workers is made fresh there: reseed random number
    /// generators, reopen database connections and log files. Hooks run in
    /// the order they were added. A template itself, and a worker that
    /// becomes the template (refork), does not run them.
    pub fn after_fork(mut self, hook: impl FnMut() + 'static) -> ExecWorker {
        self.after_fork.push(Box::new(hook));
        self
    }

    /// Whether this process was started as a template (`forkpool run
    /// --preload`): [`ExecWorker::serve`] then waits for fork orders, and
    /// each forked worker serves.
    pub fn is_template(&self) -> bool {
        matches!(self.role, Role::Template(_))
    }

    /// The worker's slot number. A template has no slot: 0 (a handler
    /// reads its worker's slot from [`Connection::worker`](crate::Connection)).
    pub fn slot(&self) -> usize {
        match &self.role {
            Role::Worker { start, .. } => start.slot,
            Role::Template(_) => 0,
        }
    }

    /// The pool generation the worker (or template) belongs to.
    pub fn generation(&self) -> u32 {
        match &self.role {
            Role::Worker { start, .. } => start.generation,
            Role::Template(t) => t.generation,
        }
    }

    /// The pool's dispatch mode.
    pub fn dispatch(&self) -> DispatchMode {
        match &self.role {
            Role::Worker { start, .. } => start.mode,
            Role::Template(t) => t.mode,
        }
    }

    /// The listeners this worker holds (none in `handoff` mode).
    pub fn listeners(&self) -> &[Listener] {
        match &self.role {
            Role::Worker { start, .. } => &start.listeners,
            Role::Template(t) => &t.listeners,
        }
    }

    /// Says `Ready`, then serves connections with `handler` until the
    /// supervisor says quit or goes away, and returns the exit status to
    /// end the process with: 0 after a clean stop, 1 after a protocol or
    /// channel error (logged with `tracing`) or a handler panic.
    ///
    /// In a template (`--preload`) it says `Ready` as the template and
    /// forks a worker for each fork order, as `docs/protocol.md`
    /// ("Templates") describes; the forked worker closes every descriptor
    /// it does not own, runs the `after_fork` hooks and serves with
    /// `handler`, which it shares copy-on-write with the template. A value
    /// in the program that wraps a descriptor opened before `serve` (a
    /// file, a socket) is dead in a forked worker: do not use it there,
    /// reopen it in an `after_fork` hook. Told to become the template
    /// (refork), a worker turns into the template and keeps the state its
    /// handler warmed.
    pub fn serve<H: Handler>(self, mut handler: H) -> i32 {
        let ExecWorker {
            mut role,
            mut after_fork,
        } = self;
        loop {
            role = match role {
                Role::Worker { start, version } => {
                    for hook in &mut after_fork {
                        hook();
                    }
                    let mode = start.mode;
                    let generation = start.generation;
                    match run_child_speaking(start, &mut handler, version) {
                        ChildEnd::Exit(code) => return code,
                        ChildEnd::BecomeTemplate { channel, listeners } => {
                            match become_template(channel, listeners, mode, generation) {
                                Ok(template) => Role::Template(template),
                                Err(e) => {
                                    error!("cannot become the template: {e}");
                                    return 1;
                                }
                            }
                        }
                    }
                }
                Role::Template(template) => match template.run() {
                    Ok(Some(start)) => Role::Worker {
                        start,
                        version: protocol::TEMPLATE_VERSION,
                    },
                    Ok(None) => return 0,
                    Err(e) => {
                        error!("template stopping: {e}");
                        return 1;
                    }
                },
            };
        }
    }
}

impl fmt::Debug for ExecWorker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecWorker")
            .field("role", &self.role)
            .field("after_fork_hooks", &self.after_fork.len())
            .finish()
    }
}

/// `kernel` dispatch: takes the overflow listeners and maps the
/// scoreboard, checking it is one and that this worker's slot is on it.
fn take_board(start: &mut ChildStart, kernel: &KernelLayout) -> Result<(), ExecWorkerError> {
    let error = |what: String| {
        move |e: std::io::Error| ExecWorkerError {
            message: format!("{what}: {e}"),
        }
    };
    for fd in &kernel.overflow_fds {
        let owned = sys::fds::take_inherited(*fd).map_err(error(format!("overflow {fd}")))?;
        let listener = Listener::from_inherited(owned).map_err(error(format!("overflow {fd}")))?;
        start.overflow.push(listener);
    }
    let fd = kernel.board_fd;
    let map = sys::fds::take_inherited(fd).map_err(error(format!("scoreboard {fd}")))?;
    let board = Board::open_announced(map.as_fd()).map_err(error(format!("scoreboard {fd}")))?;
    if start.slot >= board.slots() {
        return fail(format!(
            "the scoreboard has {} slots, but this worker is slot {}",
            board.slots(),
            start.slot
        ));
    }
    start.board = Some(board);
    start.max_requests = kernel.max_requests;
    Ok(())
}

fn worker_start(
    slot: usize,
    generation: u32,
    channel: Channel,
    mode: DispatchMode,
    listeners: Vec<Listener>,
) -> ChildStart {
    ChildStart {
        slot,
        generation,
        channel,
        mode,
        listener_is_tcp: listeners.iter().map(Listener::is_tcp).collect(),
        listeners,
        board: None,
        board_map: None,
        overflow: Vec::new(),
        max_requests: 0,
        limits: SelfLimits::default(),
        stderr: None,
        // Only an exec'd process is told the backlog.
        backlog: 0,
    }
}

/// What this process is now.
#[derive(Debug)]
enum Role {
    /// A worker speaking protocol `version`.
    Worker { start: ChildStart, version: u8 },
    /// A template waiting for fork orders.
    Template(Template),
}

/// A template: its channel to the supervisor and what its workers inherit.
#[derive(Debug)]
struct Template {
    channel: Channel,
    listeners: Vec<Listener>,
    mode: DispatchMode,
    generation: u32,
    supervisor: i32,
    /// The limits its workers check themselves (`kernel` dispatch): the
    /// ones in its environment, which its workers inherit.
    limits: SelfLimits,
}

/// Which process this is after a fork order.
enum Side {
    /// Still the template.
    Template,
    /// The new worker; `middle` is the pid of the intermediate process.
    Worker { middle: i32 },
}

impl Template {
    /// Says `Ready` and obeys orders. Returns `None` to exit with status
    /// 0 (quit, or the supervisor gone), or, in a newly forked worker, what
    /// it starts with.
    fn run(self) -> Result<Option<ChildStart>, String> {
        // The kernel reaps each intermediate as it exits, so the template
        // takes the next order at once instead of waiting for it.
        sys::process::reap_children_automatically(true)
            .map_err(|e| format!("cannot ignore SIGCHLD: {e}"))?;
        let served = self.obey();
        if !matches!(served, Ok(Some(_))) {
            let _ = sys::process::reap_children_automatically(false);
        }
        served
    }

    /// Says `Ready` and answers orders (see [`Template::run`]).
    fn obey(self) -> Result<Option<ChildStart>, String> {
        let reply = |r: TemplateReply| {
            self.channel
                .send_template_reply(r)
                .map_err(|e| format!("cannot write to the supervisor: {e}"))
        };
        reply(TemplateReply::Ready {
            pid: std::process::id(),
        })?;
        loop {
            let incoming = self
                .channel
                .recv_template_request()
                .map_err(|e| format!("cannot read from the supervisor: {e}"))?;
            match incoming {
                Incoming::Message(TemplateRequest::Ping { seq }, _) => {
                    reply(TemplateReply::Pong { seq })?;
                }
                Incoming::Message(TemplateRequest::Quit, _) => return Ok(None),
                Incoming::Closed => return Ok(None),
                Incoming::WouldBlock => {}
                Incoming::Malformed(why) => {
                    return Err(format!("malformed message from the supervisor: {why}"));
                }
                Incoming::Message(TemplateRequest::Fork { slot, generation }, fds) => {
                    let [channel, stderr]: [OwnedFd; 2] = fds
                        .try_into()
                        .map_err(|_| "a fork order without its two descriptors".to_string())?;
                    if let Side::Worker { middle } = self.fork(slot)? {
                        return self
                            .into_worker(middle, slot, generation, channel, stderr)
                            .map(Some);
                    }
                }
            }
        }
    }

    /// The double fork of one fork order. The template gets `Side::Template`
    /// once the intermediate is forked (the caller then drops its
    /// copies of the two descriptors); the intermediate never returns.
    fn fork(&self, slot: u32) -> Result<Side, String> {
        let failed = |e: std::io::Error| TemplateReply::ForkFailed {
            slot,
            errno: e.raw_os_error().unwrap_or(0) as u32,
        };
        let threads = sys::process::thread_count().unwrap_or(1);
        if threads != 1 {
            return Err(format!(
                "the template has {threads} threads; forking a multi-threaded process is \
                 unsafe: start threads in the workers (an after_fork hook), not before serve"
            ));
        }
        match sys::process::fork() {
            Err(e) => {
                let _ = self.channel.send_template_reply(failed(e));
                Ok(Side::Template)
            }
            // The kernel reaps the intermediate (see `run`).
            Ok(Forked::Parent(_)) => Ok(Side::Template),
            Ok(Forked::Child) => {
                let middle = std::process::id() as i32;
                let answer = match fork_worker_from_intermediate() {
                    Err(e) => failed(e),
                    Ok(Some(pid)) => TemplateReply::Forked {
                        slot,
                        pid: pid as u32,
                    },
                    Ok(None) => return Ok(Side::Worker { middle }),
                };
                let sent = self.channel.send_template_reply(answer);
                sys::process::exit_now(i32::from(sent.is_err()));
            }
        }
    }

    /// In the newly forked worker: the steps of `docs/protocol.md` ("What
    /// the forked worker does"), up to the `after_fork` hooks.
    fn into_worker(
        self,
        middle: i32,
        slot: u32,
        generation: u32,
        channel: OwnedFd,
        stderr: OwnedFd,
    ) -> Result<ChildStart, String> {
        // The worker's children are its own to wait for.
        sys::process::reap_children_automatically(false)
            .map_err(|e| format!("cannot restore SIGCHLD: {e}"))?;
        let target = FIRST_FD + self.listeners.len() as RawFd;
        // 1. Close everything that is not ours; the template channel is
        // forgotten first, as it is closed by number.
        let _ = OwnedFd::from(self.channel).into_raw_fd();
        let mut keep: Vec<RawFd> = vec![0, 1, 2, channel.as_raw_fd(), stderr.as_raw_fd()];
        keep.extend(self.listeners.iter().map(|l| l.as_fd().as_raw_fd()));
        sys::fds::close_all_except(&keep).map_err(|e| format!("closing descriptors: {e}"))?;
        // 2. The channel to 3+n, the stderr pipe to 2.
        let channel = sys::fds::move_to(channel, target)
            .map_err(|e| format!("moving the channel to {target}: {e}"))?;
        let _ = sys::fds::move_to(stderr, 2)
            .map_err(|e| format!("moving the stderr pipe to 2: {e}"))?
            .into_raw_fd();
        sys::fds::set_cloexec(channel.as_fd(), true)
            .map_err(|e| format!("back-channel {target}: {e}"))?;
        // Our end alone (the supervisor holds the other): it may have been
        // passed non-blocking, and the worker loop reads blocking.
        sys::socket::set_nonblocking(channel.as_fd(), false)
            .map_err(|e| format!("back-channel {target}: {e}"))?;
        // 3. The environment of an exec'd worker.
        std::env::set_var(CHANNEL_FD_VAR, target.to_string());
        std::env::set_var(SLOT_VAR, slot.to_string());
        std::env::set_var(GENERATION_VAR, generation.to_string());
        std::env::remove_var(TEMPLATE_FD_VAR);
        if std::env::var_os(LISTEN_FDS_VAR).is_some() {
            std::env::set_var(LISTEN_PID_VAR, std::process::id().to_string());
        }
        // 4. Reparented to the supervisor, then the parent-death signal.
        if !sys::process::wait_reparented(middle, Instant::now() + REPARENT_DEADLINE) {
            return Err(format!(
                "not reparented to the supervisor within {REPARENT_DEADLINE:?} \
                 (the intermediate process {middle} did not go away)"
            ));
        }
        let armed = sys::process::arm_parent_death(self.supervisor)
            .map_err(|e| format!("cannot set the parent-death signal: {e}"))?;
        if !armed {
            return Err(format!(
                "the parent is not the supervisor {} (it died, or is not a subreaper)",
                self.supervisor
            ));
        }
        let mut start = worker_start(
            slot as usize,
            generation,
            Channel::from_fd(channel),
            self.mode,
            self.listeners,
        );
        start.limits = self.limits;
        Ok(start)
    }
}

/// Refork: the worker's channel is closed; the new template channel moves
/// to where it was and the environment says "template".
fn become_template(
    channel: OwnedFd,
    listeners: Vec<Listener>,
    mode: DispatchMode,
    generation: u32,
) -> Result<Template, String> {
    let supervisor = std::env::var(SUPERVISOR_PID_VAR)
        .ok()
        .and_then(|pid| pid.trim().parse::<i32>().ok())
        .ok_or_else(|| format!("{SUPERVISOR_PID_VAR} is not set"))?;
    let target = FIRST_FD + listeners.len() as RawFd;
    let channel = sys::fds::move_to(channel, target)
        .map_err(|e| format!("moving the template channel to {target}: {e}"))?;
    sys::fds::set_cloexec(channel.as_fd(), true)
        .map_err(|e| format!("template channel {target}: {e}"))?;
    sys::socket::set_nonblocking(channel.as_fd(), false)
        .map_err(|e| format!("template channel {target}: {e}"))?;
    std::env::set_var(TEMPLATE_FD_VAR, target.to_string());
    std::env::remove_var(CHANNEL_FD_VAR);
    std::env::remove_var(SLOT_VAR);
    // The workers it forks inherit its environment, limits included.
    let limits = match mode {
        DispatchMode::Kernel => {
            read_self_limits(|name| std::env::var(name).ok()).map_err(|e| e.message)?
        }
        _ => SelfLimits::default(),
    };
    Ok(Template {
        channel: Channel::from_fd(channel),
        listeners,
        mode,
        generation,
        supervisor,
        limits,
    })
}

/// The intermediate's half of the double fork: SIGCHLD back to its
/// default, then the worker's fork; `Some(pid)` in the intermediate,
/// `None` in the worker. The template ignores SIGCHLD (see
/// [`Template::run`]) and the intermediate inherits that: left so, a
/// worker that died before the intermediate exits would be reaped by the
/// kernel, never by the supervisor, whose slot would wait for a reap that
/// never comes (docs/protocol.md, "The double fork").
fn fork_worker_from_intermediate() -> std::io::Result<Option<i32>> {
    sys::process::reap_children_automatically(false)?;
    match sys::process::fork()? {
        Forked::Parent(pid) => Ok(Some(pid)),
        Forked::Child => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Set for the copy of this test binary that plays the intermediate.
    const AS_INTERMEDIATE: &str = "FORKPOOL_TEST_AS_INTERMEDIATE";

    /// The intermediate restores SIGCHLD before it forks the worker: a
    /// worker that dies while the intermediate still lives stays a zombie
    /// for its parent to reap, instead of being reaped by the kernel
    /// behind the supervisor's back (issue 24, item 5). Played by a copy
    /// of this test binary: ignoring SIGCHLD here would break every other
    /// test's waits.
    #[test]
    fn the_intermediate_restores_sigchld_so_a_dead_worker_is_left_to_reap() {
        if std::env::var_os(AS_INTERMEDIATE).is_some() {
            // SIGCHLD as the template leaves it.
            sys::process::reap_children_automatically(true).unwrap();
            let Some(worker) = fork_worker_from_intermediate().unwrap() else {
                // The worker dies at once, before its parent exits.
                sys::process::exit_now(7);
            };
            let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(worker), None);
            // ECHILD when the kernel reaped it.
            assert!(
                matches!(status, Ok(nix::sys::wait::WaitStatus::Exited(_, 7))),
                "the worker was not left to reap: {status:?}"
            );
            return;
        }
        let name = "worker::exec_worker::tests::\
                    the_intermediate_restores_sigchld_so_a_dead_worker_is_left_to_reap";
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--test-threads=1", "--nocapture"])
            .env(AS_INTERMEDIATE, "1")
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(said.contains("1 passed"), "the test did not run: {said}");
    }

    fn layout(vars: &[(&str, &str)], pid: u32) -> Result<Layout, ExecWorkerError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        read_layout(|name| map.get(name).cloned(), pid)
    }

    const BASE: [(&str, &str); 4] = [
        ("FORKPOOL_PROTOCOL", "1"),
        ("FORKPOOL_SLOT", "4"),
        ("FORKPOOL_GENERATION", "2"),
        ("FORKPOOL_DISPATCH", "order"),
    ];

    fn with(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
        BASE.iter().chain(extra).copied().collect()
    }

    #[test]
    fn order_worker_with_two_listeners() {
        let vars = with(&[
            ("LISTEN_FDS", "2"),
            ("LISTEN_PID", "77"),
            ("FORKPOOL_CHANNEL_FD", "5"),
        ]);
        assert_eq!(
            layout(&vars, 77).unwrap(),
            Layout {
                mode: DispatchMode::Order,
                generation: 2,
                channel_fd: 5,
                listener_fds: vec![3, 4],
                kernel: None,
                limits: SelfLimits::default(),
                role: LayoutRole::Worker { slot: 4 },
            }
        );
    }

    #[test]
    fn a_kernel_worker_finds_the_overflow_and_the_board_after_the_channel() {
        let mut vars = with(&[
            ("LISTEN_FDS", "2"),
            ("LISTEN_PID", "77"),
            ("FORKPOOL_CHANNEL_FD", "5"),
            ("FORKPOOL_OVERFLOW_FD", "6"),
            ("FORKPOOL_BOARD_FD", "8"),
            ("FORKPOOL_MAX_REQUESTS", "1234"),
        ]);
        vars[3] = ("FORKPOOL_DISPATCH", "handoff");
        vars.push(("FORKPOOL_KERNEL_DISPATCH", "1"));
        let got = layout(&vars, 77).unwrap();
        assert_eq!(got.mode, DispatchMode::Kernel);
        assert_eq!(
            got.kernel,
            Some(KernelLayout {
                overflow_fds: vec![6, 7],
                board_fd: 8,
                max_requests: 1234,
            })
        );
        // No limit said, none checked.
        assert_eq!(got.limits, SelfLimits::default());
        let mut limited = vars.clone();
        limited.push(("FORKPOOL_MAX_CHILD_MEMORY", "67108864"));
        limited.push(("FORKPOOL_MAX_CHILD_LIFETIME_MS", "1500"));
        assert_eq!(
            layout(&limited, 77).unwrap().limits,
            SelfLimits {
                max_memory: 64 << 20,
                lifetime: Duration::from_millis(1500),
            }
        );
        let wrong: Vec<_> = limited
            .iter()
            .map(|&(k, v)| match k {
                "FORKPOOL_MAX_CHILD_MEMORY" => (k, "lots"),
                _ => (k, v),
            })
            .collect();
        let why = layout(&wrong, 77).unwrap_err().to_string();
        assert!(why.contains("FORKPOOL_MAX_CHILD_MEMORY"), "{why}");
        // A board that is not after the overflow is a version mismatch.
        let bad: Vec<_> = vars
            .iter()
            .map(|&(k, v)| {
                if k == "FORKPOOL_BOARD_FD" {
                    (k, "9")
                } else {
                    (k, v)
                }
            })
            .collect();
        let why = layout(&bad, 77).unwrap_err().to_string();
        assert!(why.contains("FORKPOOL_BOARD_FD=9"), "{why}");
    }

    #[test]
    fn handoff_worker_has_only_the_channel() {
        let mut vars = with(&[("FORKPOOL_CHANNEL_FD", "3")]);
        vars[3] = ("FORKPOOL_DISPATCH", "handoff");
        let got = layout(&vars, 1).unwrap();
        assert_eq!(got.channel_fd, 3);
        assert!(got.listener_fds.is_empty());
    }

    #[test]
    fn listeners_meant_for_another_pid_are_refused() {
        let vars = with(&[
            ("LISTEN_FDS", "1"),
            ("LISTEN_PID", "77"),
            ("FORKPOOL_CHANNEL_FD", "4"),
        ]);
        let err = layout(&vars, 78).unwrap_err().to_string();
        assert!(
            err.contains("LISTEN_PID is 77 but this process is 78"),
            "{err}"
        );
    }

    #[test]
    fn missing_or_inconsistent_variables_name_the_fix() {
        let err = layout(&[], 1).unwrap_err().to_string();
        assert!(err.contains("FORKPOOL_DISPATCH is not set"), "{err}");
        assert!(err.contains("forkpool run"), "{err}");

        let vars = with(&[("FORKPOOL_CHANNEL_FD", "3")]);
        let err = layout(&vars, 1).unwrap_err().to_string();
        assert!(err.contains("needs the listeners"), "{err}");

        let vars = with(&[
            ("LISTEN_FDS", "1"),
            ("LISTEN_PID", "1"),
            ("FORKPOOL_CHANNEL_FD", "3"),
        ]);
        let err = layout(&vars, 1).unwrap_err().to_string();
        assert!(err.contains("it must be 4"), "{err}");

        let mut vars = with(&[("FORKPOOL_CHANNEL_FD", "3")]);
        vars[0] = ("FORKPOOL_PROTOCOL", "2");
        let err = layout(&vars, 1).unwrap_err().to_string();
        assert!(err.contains("protocol 2"), "{err}");
    }

    const TEMPLATE: [(&str, &str); 5] = [
        ("FORKPOOL_PROTOCOL", "2"),
        ("FORKPOOL_TEMPLATE_FD", "4"),
        ("FORKPOOL_SUPERVISOR_PID", "900"),
        ("FORKPOOL_GENERATION", "3"),
        ("FORKPOOL_DISPATCH", "order"),
    ];

    #[test]
    fn a_kernel_template_passes_its_limits_on() {
        let mut vars = TEMPLATE.to_vec();
        vars.retain(|&(k, _)| k != "FORKPOOL_DISPATCH");
        vars.extend([
            ("LISTEN_FDS", "1"),
            ("LISTEN_PID", "77"),
            ("FORKPOOL_DISPATCH", "handoff"),
            ("FORKPOOL_KERNEL_DISPATCH", "1"),
            ("FORKPOOL_MAX_CHILD_LIFETIME_MS", "60000"),
        ]);
        let got = layout(&vars, 77).unwrap();
        assert_eq!(got.kernel, None, "a template gets no board of its own");
        assert_eq!(
            got.limits,
            SelfLimits {
                max_memory: 0,
                lifetime: Duration::from_secs(60),
            }
        );
    }

    #[test]
    fn a_template_is_found_by_its_template_fd() {
        let mut vars = TEMPLATE.to_vec();
        vars.extend([("LISTEN_FDS", "1"), ("LISTEN_PID", "77")]);
        assert_eq!(
            layout(&vars, 77).unwrap(),
            Layout {
                mode: DispatchMode::Order,
                generation: 3,
                channel_fd: 4,
                listener_fds: vec![3],
                kernel: None,
                limits: SelfLimits::default(),
                role: LayoutRole::Template {
                    supervisor_pid: 900
                },
            }
        );
    }

    #[test]
    fn a_template_needs_version_2_and_the_supervisor_pid() {
        let mut vars = TEMPLATE.to_vec();
        vars.extend([("LISTEN_FDS", "1"), ("LISTEN_PID", "1")]);
        let mut v1 = vars.clone();
        v1[0] = ("FORKPOOL_PROTOCOL", "1");
        let err = layout(&v1, 1).unwrap_err().to_string();
        assert!(err.contains("as a template speaks 2"), "{err}");

        let no_pid: Vec<_> = vars
            .iter()
            .copied()
            .filter(|(k, _)| *k != "FORKPOOL_SUPERVISOR_PID")
            .collect();
        let err = layout(&no_pid, 1).unwrap_err().to_string();
        assert!(err.contains("FORKPOOL_SUPERVISOR_PID is not set"), "{err}");

        let mut misplaced = vars.clone();
        misplaced[1] = ("FORKPOOL_TEMPLATE_FD", "3");
        let err = layout(&misplaced, 1).unwrap_err().to_string();
        assert!(
            err.contains("FORKPOOL_TEMPLATE_FD is 3, but with 1 listener(s) it must be 4"),
            "{err}"
        );
    }

    #[test]
    fn dispatch_none_has_no_worker_side() {
        let mut vars = with(&[("LISTEN_FDS", "1"), ("LISTEN_PID", "1")]);
        vars[3] = ("FORKPOOL_DISPATCH", "none");
        let err = layout(&vars, 1).unwrap_err().to_string();
        assert!(err.contains("no back-channel"), "{err}");
    }
}
