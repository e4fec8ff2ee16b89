//! The child side: wait for work, report busy and idle, run the handler.
//!
//! A child speaks the back-channel protocol ([`crate::protocol`]) with its
//! supervisor. Which loop it runs depends on the dispatch mode:
//! - `handoff`: block on the channel; a `Connection` message brings the
//!   connection's descriptor; serve it, report `Idle`. A forked child also
//!   holds the listeners: finishing a connection, it accepts one still
//!   waiting in the backlog itself and reports `Next` instead (see
//!   `take_waiting`).
//! - `order`: block on the channel; an `Accept` order names a listener the
//!   child inherited; accept one connection (report `Busy`) or find none
//!   (report `Missed`).
//! - `shared` / `herd`: wait on the listeners and the channel at once and
//!   accept whatever arrives, reporting `Busy`, `Idle` and `Missed`.
//!
//! In every mode the child answers pings, exits on `Quit` once its current
//! connection is done, and exits when the channel closes (the supervisor is
//! gone). A handler that panics takes its child down with it: the process
//! is the isolation boundary, and the supervisor replaces it.
//!
//! The same loops serve a Rust program that `forkpool run` starts as a
//! separate executable: see [`ExecWorker`]. Children that serve many
//! connections at once run the loop in `worker/sessions.rs` instead.

mod exec_worker;
mod limits;
mod sessions;

pub(crate) use crate::config::SelfLimits;
pub use exec_worker::{ExecWorker, ExecWorkerError};
pub(crate) use sessions::run_session_child;

use std::os::fd::{AsFd, OwnedFd, RawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};

use nix::errno::Errno;
use tracing::{debug, error, warn};

use crate::channel::{Channel, Incoming};
use crate::config::DispatchMode;
use crate::dispatch::kernel::board::Board;
use crate::listener::{Listener, Stream};
use crate::protocol::{self, ChildMessage, ParentMessage, WorkerOrder};
use crate::sys;
use limits::{LimitCheck, Past};

/// Who this child is, for handlers that want to say so (logs, headers).
#[derive(Debug)]
pub struct WorkerInfo {
    /// The child's slot number (0 is the lowest, the hottest).
    pub slot: usize,
    /// The pool generation the child belongs to.
    pub generation: u32,
    /// The child's process id.
    pub pid: u32,
    channel: Channel,
}

impl WorkerInfo {
    /// The child's end of its back-channel. Handlers have no business
    /// writing to it; it exists only with the `test-hooks` feature, for
    /// fault-injection tests that must make a child misbehave on purpose.
    #[cfg(feature = "test-hooks")]
    pub fn channel_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.channel.as_fd()
    }
}

/// One connection for a handler to serve.
#[derive(Debug)]
pub struct Connection<'a> {
    /// The connected client.
    pub stream: Stream,
    /// Index of the listener it arrived on, in the order listeners were added.
    pub listener: usize,
    /// The child serving it.
    pub worker: &'a WorkerInfo,
}

/// Serves connections, one at a time, inside a child process.
///
/// Any `FnMut(Connection)` is a handler. The handler value is created in the
/// supervisor before it forks, so whatever it captured (a loaded model, a
/// parsed rule set) is shared copy-on-write by every child.
pub trait Handler {
    /// Serves one connection; dropping the stream closes it.
    fn handle(&mut self, conn: Connection<'_>);
}

impl<F: FnMut(Connection<'_>)> Handler for F {
    fn handle(&mut self, conn: Connection<'_>) {
        self(conn)
    }
}

/// What a freshly forked child needs to start working.
#[derive(Debug)]
pub(crate) struct ChildStart {
    pub slot: usize,
    pub generation: u32,
    pub channel: Channel,
    pub mode: DispatchMode,
    /// Whether each listener (by index) carries TCP connections; empty
    /// when the child is not told (an exec'd `handoff` worker), in which
    /// case each connection is asked.
    pub listener_is_tcp: Vec<bool>,
    /// The listeners themselves, in modes where children accept (in
    /// `kernel` dispatch, the child's own socket for each).
    pub listeners: Vec<Listener>,
    /// `kernel` dispatch: the scoreboard, where the child says it is idle.
    pub board: Option<Board>,
    /// `kernel` dispatch: the scoreboard map's descriptor, which an exec'd
    /// worker is given to map again (a forked child uses `board`).
    pub board_map: Option<OwnedFd>,
    /// `kernel` dispatch: the pool's listeners (the supervisor's overflow
    /// sockets), which a child finishing a connection takes the next
    /// waiting connection from, as in `handoff`.
    pub overflow: Vec<Listener>,
    /// Connections the child serves before it stops taking the next one
    /// itself and leaves the supervisor to recycle it (0: no limit).
    pub max_requests: u64,
    /// `kernel` dispatch: the memory and lifetime limits it checks itself
    /// after each connection (none in other modes).
    pub limits: SelfLimits,
    /// For an exec'd worker: the write end of the pipe the supervisor
    /// reads the worker's standard error from.
    pub stderr: Option<OwnedFd>,
    /// The pool's listen backlog, which an exec'd worker is told
    /// (`FORKPOOL_BACKLOG`).
    pub backlog: u32,
}

impl ChildStart {
    /// What the child hands to a worker program it `exec`s: everything but
    /// the mapped board, which the program maps again from `board_map`.
    pub(crate) fn into_exec(self) -> crate::exec::WorkerStart {
        crate::exec::WorkerStart {
            slot: self.slot,
            generation: self.generation,
            mode: self.mode,
            listeners: self.listeners,
            channel: self.channel,
            stderr: self.stderr,
            board_map: self.board_map,
            overflow: self.overflow,
            max_requests: self.max_requests,
            limits: self.limits,
            backlog: self.backlog,
        }
    }
}

/// Runs a forked child to completion and returns its exit status.
pub(crate) fn run_child(start: ChildStart, handler: &mut dyn Handler) -> i32 {
    match run_child_speaking(start, handler, protocol::VERSION) {
        ChildEnd::Exit(code) => code,
        // A version 1 channel cannot decode the order to become a template.
        ChildEnd::BecomeTemplate { .. } => 1,
    }
}

/// How a child's loop ended.
#[derive(Debug)]
pub(crate) enum ChildEnd {
    /// Exit with this status.
    Exit(i32),
    /// Version 2 only: the supervisor ordered a refork. The worker channel
    /// is closed; the listeners are kept for the workers the new template
    /// forks.
    BecomeTemplate {
        /// The new template channel that came with the order.
        channel: OwnedFd,
        /// The worker's listeners (none in `handoff` mode).
        listeners: Vec<Listener>,
    },
}

/// Runs a child that speaks back-channel protocol `version` (1, or 2 for a
/// worker forked from a template) until it exits or is told to become the
/// template.
pub(crate) fn run_child_speaking(
    start: ChildStart,
    handler: &mut dyn Handler,
    version: u8,
) -> ChildEnd {
    let mut worker = Worker {
        info: WorkerInfo {
            slot: start.slot,
            generation: start.generation,
            pid: std::process::id(),
            channel: start.channel,
        },
        version,
        mode: start.mode,
        max_requests: start.max_requests,
        served: 0,
        limits: start.limits,
        limit_check: None,
        past_limit: None,
        fd_ceiling: sys::fds::descriptor_ceiling(),
        out_of_descriptors: false,
        listener_is_tcp: start.listener_is_tcp,
        listeners: start.listeners,
        board: start.board,
        overflow: start.overflow,
        by_messages: false,
        handler,
    };
    // Kernel dispatch: `K`, the child keeps its own record on the board;
    // forked by a template, it is sent its sockets and the board then.
    // Asked to (`BY_MESSAGES_VAR`), it takes the messages path instead.
    let pid = worker.info.pid;
    worker.by_messages = start.mode == DispatchMode::Kernel
        && version != protocol::TEMPLATE_VERSION
        && !worker.listeners.is_empty()
        && std::env::var_os(BY_MESSAGES_VAR).is_some_and(|v| v == "1");
    if worker.by_messages {
        worker.board = None;
    }
    let seat_awaited = start.mode == DispatchMode::Kernel
        && worker.board.is_none()
        && !worker.by_messages
        && version == protocol::TEMPLATE_VERSION;
    // Its lifetime counts from here, in this process (after its fork).
    if start.mode == DispatchMode::Kernel {
        worker.limit_check = LimitCheck::start(worker.limits);
    }
    let result = worker.report(match worker.board.is_some() || seat_awaited {
        _ if worker.by_messages => ChildMessage::ReadyByMessages { pid },
        true => ChildMessage::ReadyOnBoard { pid },
        false => ChildMessage::Ready { pid },
    });
    let result = result.and_then(|()| match seat_awaited {
        true => worker.take_seat(),
        false => Ok(true),
    });
    let result = result.and_then(|seated| match start.mode {
        _ if !seated => Ok(None),
        DispatchMode::Handoff | DispatchMode::Order => worker.obey_orders(),
        DispatchMode::Shared => worker.accept_shared(true),
        DispatchMode::Kernel => worker.accept_own(),
        #[cfg(feature = "herd")]
        DispatchMode::Herd => worker.accept_shared(false),
        DispatchMode::None => {
            Err("dispatch 'none' has no back-channel; its workers accept on their own".into())
        }
    });
    match result {
        Ok(None) => ChildEnd::Exit(0),
        Ok(Some(channel)) => ChildEnd::BecomeTemplate {
            channel,
            // A template holds the pool's listeners (in kernel dispatch,
            // the overflow; its own sockets and the board close here).
            listeners: match start.mode {
                DispatchMode::Kernel => worker.overflow,
                _ => worker.listeners,
            },
        },
        Err(reason) => {
            error!(slot = worker.info.slot, "child stopping: {reason}");
            ChildEnd::Exit(1)
        }
    }
}

struct Worker<'h> {
    info: WorkerInfo,
    /// The back-channel protocol version this child speaks.
    version: u8,
    mode: DispatchMode,
    max_requests: u64,
    /// Connections served so far, counted as the supervisor counts them.
    served: u64,
    /// `kernel` dispatch: the limits it checks itself, and the check,
    /// started before its `K` (`None`: no limit, nothing to look at).
    limits: SelfLimits,
    limit_check: Option<LimitCheck>,
    /// The limit it found itself past after a connection: it leaves with
    /// `X` instead of going idle, and waits to be let go.
    past_limit: Option<Past>,
    /// The descriptor whose being open says the table is filling, and the
    /// soft `RLIMIT_NOFILE` (`sys::fds::descriptor_ceiling`).
    fd_ceiling: Option<(RawFd, u64)>,
    /// The child is out of descriptors (or memory): it leaves with `X`
    /// after the connection it serves, or at once when an accept failed.
    out_of_descriptors: bool,
    listener_is_tcp: Vec<bool>,
    listeners: Vec<Listener>,
    /// `kernel` dispatch: the scoreboard.
    board: Option<Board>,
    /// `kernel` dispatch: the supervisor's overflow sockets.
    overflow: Vec<Listener>,
    /// `kernel` dispatch on the messages path (`G`): no board; it says
    /// busy and idle in messages, and waits on the overflow too.
    by_messages: bool,
    handler: &'h mut dyn Handler,
}

/// Set to `1` in a Rust worker's environment, in `kernel` dispatch: the
/// worker takes the messages path (`G`: it says busy and idle in messages
/// and the supervisor keeps its record) instead of keeping its record on
/// the scoreboard itself (`K`). For measuring one against the other and
/// testing the supervisor's side with a worker whose runtime could do
/// either; a runtime without shared memory takes it of necessity.
pub const BY_MESSAGES_VAR: &str = "FORKPOOL_BY_MESSAGES";

/// Why a child stops on its own. `Ok(())` from a loop means a clean stop
/// (quit or supervisor gone).
type Stop = Result<(), String>;

/// How a loop ends without an error: `None` to exit cleanly, or the new
/// template channel of a refork.
type End = Result<Option<OwnedFd>, String>;

enum Next {
    Continue,
    Exit,
    BecomeTemplate(OwnedFd),
}

impl Worker<'_> {
    fn report(&self, msg: ChildMessage) -> Stop {
        let channel = &self.info.channel;
        if self.version == protocol::TEMPLATE_VERSION {
            channel.send_to_parent_v2(msg)
        } else {
            channel.send_to_parent(msg)
        }
        .map_err(|e| format!("cannot write to the supervisor: {e}"))
    }

    /// `handoff` and `order`: every piece of work arrives as a message.
    fn obey_orders(&mut self) -> End {
        loop {
            match self.take_one_message()? {
                Next::Continue => {}
                Next::Exit => return Ok(None),
                Next::BecomeTemplate(fd) => return Ok(Some(fd)),
            }
        }
    }

    /// One message from the supervisor, as a version 2 order when this
    /// child speaks version 2.
    fn receive(&self) -> std::io::Result<Incoming<WorkerOrder>> {
        let channel = &self.info.channel;
        if self.version == protocol::TEMPLATE_VERSION {
            return channel.recv_order();
        }
        Ok(match channel.recv_from_parent()? {
            Incoming::Message(msg, fd) => Incoming::Message(WorkerOrder::Parent(msg), fd),
            Incoming::WouldBlock => Incoming::WouldBlock,
            Incoming::Closed => Incoming::Closed,
            Incoming::Malformed(why) => Incoming::Malformed(why),
        })
    }

    fn take_one_message(&mut self) -> Result<Next, String> {
        let incoming = self
            .receive()
            .map_err(|e| format!("cannot read from the supervisor: {e}"))?;
        let incoming = match incoming {
            Incoming::Message(WorkerOrder::BecomeTemplate, Some(fd)) => {
                debug!(slot = self.info.slot, "told to become the template");
                return Ok(Next::BecomeTemplate(fd));
            }
            Incoming::Message(WorkerOrder::BecomeTemplate, None) => {
                return Err("become-template order without a descriptor".into());
            }
            Incoming::Message(WorkerOrder::Seat { .. }, _) => {
                return Err("sent the slot's sockets (S) a second time".into());
            }
            Incoming::Message(WorkerOrder::Parent(msg), fd) => Incoming::Message(msg, fd),
            Incoming::WouldBlock => Incoming::WouldBlock,
            Incoming::Closed => Incoming::Closed,
            Incoming::Malformed(why) => Incoming::Malformed(why),
        };
        match incoming {
            Incoming::Message(ParentMessage::Connection { listener }, Some(fd)) => {
                self.serve_then_idle(fd, listener)?;
                if self.out_of_descriptors {
                    return Ok(Next::Exit); // it said `X`
                }
            }
            Incoming::Message(ParentMessage::Accept { listener }, _) => {
                self.accept_ordered(listener)?;
                if self.out_of_descriptors {
                    return Ok(Next::Exit); // it said `X`
                }
            }
            Incoming::Message(ParentMessage::Ping { seq }, _) => {
                self.report(ChildMessage::Pong { seq })?;
            }
            Incoming::Message(ParentMessage::Quit, _) => {
                debug!(slot = self.info.slot, "told to quit");
                return Ok(Next::Exit);
            }
            Incoming::Message(ParentMessage::Connection { .. }, None) => {
                return Err("connection message without a descriptor".into());
            }
            Incoming::Closed => {
                debug!(slot = self.info.slot, "supervisor gone, exiting");
                return Ok(Next::Exit);
            }
            Incoming::WouldBlock => {}
            Incoming::Malformed(why) => {
                return Err(format!("malformed message from the supervisor: {why}"));
            }
        }
        Ok(Next::Continue)
    }

    fn accept_ordered(&mut self, listener: u16) -> Stop {
        let index = usize::from(listener);
        let Some(l) = self.listeners.get(index) else {
            return Err(format!("ordered to accept on unknown listener {index}"));
        };
        match sys::socket::accept(l.as_fd()) {
            Ok(fd) => {
                self.report(ChildMessage::Busy)?;
                self.serve_then_idle(fd, listener)
            }
            Err(Errno::EAGAIN | Errno::ECONNABORTED) => self.report(ChildMessage::Missed),
            Err(e) => {
                self.accept_failed(e);
                self.report(ChildMessage::Missed)?;
                self.leave_if_out_of_descriptors()
            }
        }
    }

    /// Says why an accept failed (not for want of a connection); one that
    /// ran out of descriptors or memory makes the child leave: retrying
    /// would fail again at once, the listener still readable.
    fn accept_failed(&mut self, e: Errno) {
        if matches!(
            e,
            Errno::EMFILE | Errno::ENFILE | Errno::ENOBUFS | Errno::ENOMEM
        ) {
            error!(
                slot = self.info.slot,
                "accept failed: {e}: this worker is out of descriptors or memory (does the \
                 handler leak them? else raise ulimit -n / LimitNOFILE); it leaves, the \
                 connection waits for a fresh one"
            );
            self.out_of_descriptors = true;
        } else {
            error!(slot = self.info.slot, "accept failed: {e}");
        }
    }

    /// After an accept failed: `X` when it ran out of descriptors (busy on
    /// the board first, so the kernel queues nothing more here).
    fn leave_if_out_of_descriptors(&mut self) -> Stop {
        if !self.out_of_descriptors {
            return Ok(());
        }
        self.mark_busy();
        self.report(ChildMessage::Leaving)
    }

    /// After a connection: the child leaves once the descriptor at the
    /// start of the reserve below `RLIMIT_NOFILE` is open. Descriptors are
    /// taken lowest first, so the table has filled up to there: a handler
    /// that leaks them would soon fail its own opens, or this child an
    /// accept (docs/protocol.md, "Running out of descriptors").
    fn check_headroom(&mut self) {
        let Some((ceiling, limit)) = self.fd_ceiling else {
            return;
        };
        if self.out_of_descriptors || !sys::fds::is_open(ceiling) {
            return;
        }
        warn!(
            slot = self.info.slot,
            "descriptor {ceiling} is open, with RLIMIT_NOFILE at {limit}: this worker is \
             running out of descriptors (does the handler leak them? else raise ulimit -n / \
             LimitNOFILE); it leaves after this connection and the supervisor starts a fresh one"
        );
        self.out_of_descriptors = true;
    }

    /// `shared` (exclusive wake-ups) and `herd` (everyone wakes): the child
    /// waits on the listeners itself.
    fn accept_shared(&mut self, exclusive: bool) -> End {
        let mut wait = sys::wait::ListenerWait::new(
            self.info.channel.as_fd(),
            self.listeners.iter().map(|l| l.as_fd()),
            exclusive,
        )?;
        let mut woken = Vec::new();
        loop {
            #[cfg(feature = "herd")]
            let sleeps_before = (!exclusive)
                .then(sys::process::voluntary_switches)
                .flatten();
            match wait.wait(&mut woken) {
                Ok(()) => {}
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(format!("epoll_wait failed: {e}")),
            }
            #[cfg(feature = "herd")]
            self.report_futile_sleeps(sleeps_before)?;
            for &what in &woken {
                match what {
                    sys::wait::Woken::Channel => match self.take_one_message()? {
                        Next::Continue => {}
                        Next::Exit => return Ok(None),
                        Next::BecomeTemplate(fd) => return Ok(Some(fd)),
                    },
                    sys::wait::Woken::Listener(i) => self.accept_woken(i)?,
                }
                if self.out_of_descriptors {
                    return Ok(None); // it said `X`
                }
            }
        }
    }

    /// `kernel`: the child waits on its own sockets, where the kernel
    /// queues a connection only after reserving this child on the
    /// scoreboard, and on its channel (pings, quit, and a connection the
    /// supervisor hands on from its overflow). It marks itself idle on
    /// the scoreboard before each wait and busy on each accept; it reports
    /// `B` and `I` as in `shared`.
    fn accept_own(&mut self) -> End {
        if self.board.is_none() && !self.by_messages {
            return Err("kernel dispatch without a scoreboard".into());
        }
        // On the messages path it waits on the overflow too: nothing there
        // is handed to it, and connections land there only when no
        // child had a socket to take them.
        let own = self.listeners.len();
        let overflow = self.overflow.iter().filter(|_| self.by_messages);
        let mut wait = sys::wait::ListenerWait::new(
            self.info.channel.as_fd(),
            self.listeners.iter().chain(overflow).map(|l| l.as_fd()),
            false,
        )?;
        let mut woken = Vec::new();
        // Idle from now on; after each connection `serve_then_idle` says
        // so again. Never at the top of each wait: the supervisor may have
        // claimed this child (idle to busy) for a connection on its way
        // over the channel, and only the child moves busy to idle.
        self.now_idle()?;
        loop {
            match wait.wait(&mut woken) {
                Ok(()) => {}
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(format!("epoll_wait failed: {e}")),
            }
            for &what in &woken {
                match what {
                    // A handed connection comes with the slot already
                    // claimed busy by the supervisor; a quit must see no
                    // more from the kernel.
                    sys::wait::Woken::Channel => match self.take_one_message()? {
                        Next::Continue => {}
                        Next::Exit if self.out_of_descriptors => return Ok(None), // said `X`
                        Next::Exit => {
                            self.mark_busy();
                            self.serve_what_the_kernel_queued()?;
                            return Ok(None);
                        }
                        Next::BecomeTemplate(fd) => {
                            self.mark_busy();
                            return Ok(Some(fd));
                        }
                    },
                    sys::wait::Woken::Listener(i) => {
                        let (from, listener) = match i.checked_sub(own) {
                            Some(o) => (&self.overflow[o], o),
                            None => (&self.listeners[i], i),
                        };
                        match sys::socket::accept(from.as_fd()) {
                            Ok(fd) => {
                                self.mark_busy();
                                if self.by_messages {
                                    self.report(ChildMessage::Busy)?;
                                }
                                if let Some(board) = &self.board {
                                    board.count_taken(self.info.slot);
                                }
                                self.serve_then_idle(fd, listener as u16)?;
                            }
                            // Nothing to accept (a reservation given back,
                            // its connection came after all and went): wait
                            // again.
                            Err(Errno::EAGAIN | Errno::ECONNABORTED | Errno::EPROTO) => {}
                            Err(e) => {
                                self.accept_failed(e);
                                self.leave_if_out_of_descriptors()?;
                            }
                        }
                    }
                }
                if self.out_of_descriptors || self.exhausted() {
                    // Its share served, or past a limit: it leaves on its
                    // own (the scoreboard still says busy, so nothing
                    // more comes). Out of descriptors, it said `X` already.
                    if !self.out_of_descriptors {
                        self.report(ChildMessage::Leaving)?;
                    }
                    if self.past_limit.is_some() {
                        self.await_release();
                    }
                    return Ok(None);
                }
            }
        }
    }

    /// Kernel dispatch, a worker forked by a template: after its `K`, the
    /// supervisor's `S` brings its slot's sockets and the board. The
    /// listeners it inherited become its overflow. False: told to quit (or
    /// the supervisor gone) before that.
    fn take_seat(&mut self) -> Result<bool, String> {
        loop {
            let incoming = self
                .info
                .channel
                .recv_order_with_fds()
                .map_err(|e| format!("cannot read from the supervisor: {e}"))?;
            match incoming {
                Incoming::Message(WorkerOrder::Seat { max_requests, .. }, mut fds) => {
                    let map = fds.pop().ok_or("a seat without the scoreboard")?;
                    let board = Board::open_announced(map.as_fd())
                        .map_err(|e| format!("cannot map the scoreboard: {e}"))?;
                    if self.info.slot >= board.slots() {
                        return Err(format!("slot {} is not on the scoreboard", self.info.slot));
                    }
                    let own = fds
                        .into_iter()
                        .map(Listener::from_inherited)
                        .collect::<std::io::Result<Vec<_>>>()
                        .map_err(|e| format!("a socket of the seat: {e}"))?;
                    self.overflow = std::mem::replace(&mut self.listeners, own);
                    self.board = Some(board);
                    self.max_requests = max_requests;
                    return Ok(true);
                }
                Incoming::Message(WorkerOrder::Parent(ParentMessage::Ping { seq }), _) => {
                    self.report(ChildMessage::Pong { seq })?;
                }
                Incoming::Message(WorkerOrder::Parent(ParentMessage::Quit), _)
                | Incoming::Closed => return Ok(false),
                Incoming::WouldBlock => {}
                Incoming::Message(order, _) => {
                    return Err(format!("expected the slot's sockets (S), got {order:?}"));
                }
                Incoming::Malformed(why) => {
                    return Err(format!("a message it does not understand: {why:?}"));
                }
            }
        }
    }

    /// Whether this child is done: it has served its
    /// `max_requests_per_child`, or (`kernel` dispatch) found itself past
    /// its memory or lifetime limit after its last connection.
    fn exhausted(&self) -> bool {
        crate::policy::recycle::requests_exhausted(self.served, self.max_requests)
            || self.past_limit.is_some()
    }

    /// `kernel` dispatch, after a connection and before the child goes
    /// idle: whether it is past its memory or lifetime limit. Nothing to
    /// do without a limit (or without a board: the supervisor sees every
    /// connection end and looks itself).
    fn check_limits(&mut self) {
        if self.board.is_none() || self.past_limit.is_some() {
            return;
        }
        let Some(check) = &mut self.limit_check else {
            return;
        };
        self.past_limit = check.past();
        if let Some(past) = self.past_limit {
            debug!(
                slot = self.info.slot,
                ?past,
                "past a limit: leaving after this connection"
            );
        }
    }

    /// After its `X` for a limit: reads the channel until `Q` or end of
    /// file (ignoring what the supervisor sent before it read the `X`), so
    /// the supervisor finds the child still there when it looks at its
    /// memory; it closes its end once it has (docs/protocol.md).
    fn await_release(&self) {
        loop {
            if let Err(e) = sys::socket::wait_readable(self.info.channel.as_fd()) {
                debug!(slot = self.info.slot, "waiting to be let go: {e}");
                return;
            }
            match self.receive() {
                Ok(Incoming::Message(WorkerOrder::Parent(ParentMessage::Quit), _))
                | Ok(Incoming::Closed | Incoming::Malformed(_))
                | Err(_) => return,
                Ok(Incoming::Message(..) | Incoming::WouldBlock) => {}
            }
        }
    }

    /// Told to quit, and busy on the scoreboard so the kernel gives it
    /// nothing more: serves what the kernel had already queued on its own
    /// sockets (reserved for it just before), instead of leaving it for
    /// the supervisor to hand on after it has gone.
    fn serve_what_the_kernel_queued(&mut self) -> Stop {
        for i in 0..self.listeners.len() {
            while let Ok(fd) = sys::socket::accept(self.listeners[i].as_fd()) {
                if let Some(board) = &self.board {
                    board.count_taken(self.info.slot);
                }
                if self.by_messages {
                    self.report(ChildMessage::Busy)?;
                }
                let held_open = self.serve(fd, i as u16)?;
                self.served += 1;
                if let Some(board) = &self.board {
                    board.count_served(self.info.slot);
                }
                if self.by_messages {
                    self.report(ChildMessage::Idle)?;
                }
                drop(held_open);
            }
        }
        Ok(())
    }

    /// Kernel dispatch: idle on the scoreboard; if the supervisor holds
    /// connections no idle child took, say `I` so it hands one over.
    fn now_idle(&self) -> Stop {
        match &self.board {
            Some(board) if board.set_idle(self.info.slot) => self.report(ChildMessage::Idle),
            _ => Ok(()),
        }
    }

    fn mark_busy(&self) {
        if let Some(board) = &self.board {
            board.set_busy(self.info.slot);
        }
    }

    /// In the herd, most wake-ups never reach us: the kernel wakes every
    /// child, re-checks the listener, finds it drained by another child and
    /// puts this one back to sleep inside `epoll_wait`. Each such sleep is
    /// one more voluntary context switch during the call, so the herd
    /// reports one `Missed` for each (it exists only to show this cost; the
    /// other modes skip the two `getrusage` reads).
    #[cfg(feature = "herd")]
    fn report_futile_sleeps(&mut self, sleeps_before: Option<u64>) -> Stop {
        if let (Some(before), Some(after)) = (sleeps_before, sys::process::voluntary_switches()) {
            for _ in 1..after.saturating_sub(before) {
                self.report(ChildMessage::Missed)?;
            }
        }
        Ok(())
    }

    fn accept_woken(&mut self, index: usize) -> Stop {
        match sys::socket::accept(self.listeners[index].as_fd()) {
            Ok(fd) => {
                self.report(ChildMessage::Busy)?;
                self.serve_then_idle(fd, index as u16)
            }
            Err(Errno::EAGAIN | Errno::ECONNABORTED) => self.report(ChildMessage::Missed),
            Err(e) => {
                self.accept_failed(e);
                self.report(ChildMessage::Missed)?;
                self.leave_if_out_of_descriptors()
            }
        }
    }

    /// Runs the handler on one connection, then reports `Idle`; or, when
    /// another connection is already waiting, takes it and reports `Next`
    /// instead (see [`Worker::take_waiting`]), as many times as that holds.
    ///
    /// The child keeps its own duplicate of each descriptor until the report
    /// is sent, so the client cannot see the connection close (and come
    /// back with the next request) before the supervisor knows this child
    /// is free again: otherwise a strictly sequential client would hop to
    /// the next slot now and then, and the lowest child would not stay hot.
    fn serve_then_idle(&mut self, fd: OwnedFd, listener: u16) -> Stop {
        let mut fd = fd;
        loop {
            let held_open = self.serve(fd, listener)?;
            self.served += 1;
            self.check_headroom();
            self.check_limits();
            let next = self.take_waiting(listener);
            if self.out_of_descriptors {
                // `X` instead of `I`; in kernel dispatch it stays busy.
                if let Some(board) = &self.board {
                    board.count_served(self.info.slot);
                }
                self.report(ChildMessage::Leaving)?;
                drop(held_open);
                return Ok(());
            }
            if let Some(board) = &self.board {
                // Kernel dispatch: no report; the count and the state on
                // the scoreboard say it, before the client sees the close,
                // so its next connection finds this (hot) child.
                board.count_served(self.info.slot);
                if next.is_some() {
                    board.count_taken(self.info.slot);
                    board.count_next(self.info.slot);
                    board.count_overflow_taken(1);
                } else if !self.exhausted() {
                    self.now_idle()?;
                }
            } else {
                let report = match next {
                    Some(_) => ChildMessage::Next,
                    None => ChildMessage::Idle,
                };
                self.report(report)?;
            }
            drop(held_open);
            match next {
                Some(waiting) => fd = waiting,
                None => return Ok(()),
            }
        }
    }

    /// Runs the handler on one connection and returns a duplicate of its
    /// descriptor, for the caller to close after its report (none when
    /// holding it open would change nothing).
    fn serve(&mut self, fd: OwnedFd, listener: u16) -> Result<Option<OwnedFd>, String> {
        let index = usize::from(listener);
        let tcp = if self.listener_is_tcp.is_empty() {
            // An exec'd handoff worker is not told what its pool listens
            // on; the connection itself says.
            sys::socket::is_inet(fd.as_fd())
        } else {
            *self
                .listener_is_tcp
                .get(index)
                .ok_or_else(|| format!("connection from unknown listener {index}"))?
        };
        // Held open until the child has said it is idle, so a client that
        // waits for the close and connects again finds this (hot) child.
        // In kernel dispatch only when that next connection would go past
        // it to an idle child above: saturated, it would find none anyway,
        // and the duplicate's two system calls are a fifth of the child's.
        let hold = match &self.board {
            Some(board) => board.next_would_pass(self.info.slot),
            None => true,
        };
        let held_open = if hold { fd.try_clone().ok() } else { None };
        let conn = Connection {
            stream: Stream::from_fd(fd, tcp),
            listener: index,
            worker: &self.info,
        };
        let handler = &mut *self.handler;
        if catch_unwind(AssertUnwindSafe(|| handler.handle(conn))).is_err() {
            return Err("the handler panicked; the supervisor will start a fresh child".into());
        }
        Ok(held_open)
    }

    /// `handoff`, forked children: the next connection already waiting in
    /// the backlog of the listener just served, if there is one.
    ///
    /// Handing it over through the supervisor would cost an accept and a
    /// send there and a wake-up here, only to land on this same child: a
    /// connection still in the backlog means the supervisor has not got to
    /// it (it is busy, or no child was idle), and this child, about to say
    /// `Idle`, is the one that is running. A message from the supervisor
    /// (a quit, a ping) goes first: the child then reports `Idle` and reads
    /// it. So does the end of its share of connections
    /// (`max_requests_per_child`): the supervisor recycles it on `Idle`,
    /// and must not learn of the limit only after a connection too many.
    fn take_waiting(&mut self, listener: u16) -> Option<OwnedFd> {
        if self.out_of_descriptors {
            return None;
        }
        let shared = match self.mode {
            DispatchMode::Handoff => &self.listeners,
            DispatchMode::Kernel => &self.overflow,
            _ => return None,
        };
        if self.exhausted() {
            return None;
        }
        if self
            .board
            .as_ref()
            .is_some_and(|b| !b.may_take_next(self.info.slot))
        {
            // Kernel dispatch: the program sent nothing to the overflow
            // that is not taken, so the poll below would find nothing; or
            // this slot is beyond the dispatch width, and leaves what
            // waits there to the children within it.
            return None;
        }
        let l = shared.get(usize::from(listener))?;
        // One poll says both whether the supervisor has something to say
        // and whether a connection waits, so a child that finds the
        // backlog empty (the common case at light load) pays one system
        // call, not a poll and a failed accept. In kernel dispatch it also
        // says whether a connection waits on the child's own socket: one
        // the kernel gave this child (a reservation taken over, its own
        // connection coming after all). That one goes first: the child
        // goes idle and accepts it, else a pool kept busy would feed the
        // child from the overflow for as long as the load lasts, and the
        // connection given to it would wait all that time.
        let own = match self.mode {
            DispatchMode::Kernel => self.listeners.get(usize::from(listener)),
            _ => None,
        };
        let [message, waiting, mine] = match own {
            Some(own) => {
                sys::socket::readable_now_each([self.info.channel.as_fd(), l.as_fd(), own.as_fd()])
            }
            None => {
                let [message, waiting] =
                    sys::socket::readable_now_each([self.info.channel.as_fd(), l.as_fd()]);
                [message, waiting, false]
            }
        };
        if message || !waiting || mine {
            return None;
        }
        match sys::socket::accept(l.as_fd()) {
            Ok(fd) => Some(fd),
            Err(Errno::EAGAIN | Errno::ECONNABORTED | Errno::EPROTO) => None,
            Err(e) => {
                // Out of descriptors: the child leaves (the caller says
                // `X`), and the connection waits for another.
                self.accept_failed(e);
                None
            }
        }
    }
}
