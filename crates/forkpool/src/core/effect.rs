//! What the core asks the shell to do. The core names a child by its slot
//! (its identity in the core), never by a raw pid: the shell signals a
//! child only through what it holds for that slot (a pidfd, or the pid the
//! kernel vouched for).

use std::time::Duration;

use crate::protocol::{ParentMessage, TemplateRequest};
use crate::status::KillReason;

/// One thing for the shell to carry out.
#[derive(Debug)]
pub(crate) enum Effect<L> {
    /// Send `msg` to the child in `slot`. A failure comes back as
    /// [`super::Input::SendFailed`].
    Send {
        /// The child.
        slot: usize,
        /// What to send (a quit or a ping).
        msg: ParentMessage,
    },
    /// Send SIGTERM to the child in `slot` alone (children that speak no
    /// protocol are told to quit this way).
    Terminate {
        /// The child.
        slot: usize,
    },
    /// SIGKILL the child in `slot` and its process group.
    Kill {
        /// The child.
        slot: usize,
    },
    /// The worker in `slot`, whose pid the kernel never confirmed, missed a
    /// deadline or must go: nothing may be signalled; its template answers
    /// for it (`supervisor/verify.rs`).
    GiveUpUnverified {
        /// The slot.
        slot: usize,
        /// What it did, for the log.
        detail: String,
    },
    /// Stop reading the channel of the child in `slot`.
    StopReading {
        /// The child.
        slot: usize,
    },
    /// The worker in `slot`, forked by a template, said `Ready`: give it a
    /// process group of its own.
    OwnGroup {
        /// The child.
        slot: usize,
    },
    /// `kernel` dispatch: the worker in `slot`, forked by a template, said
    /// `K`: send it its slot's sockets and the scoreboard (`S`).
    Seat {
        /// The child.
        slot: usize,
    },
    /// A child has room again: connections parked for want of one go
    /// first.
    Room,
    /// Kernel dispatch: the child in `slot` took the messages path (`G`)
    /// and said it is idle (`idle`) or busy: the shell stores that in its
    /// record on the scoreboard, as a `K` child would itself.
    MarkBoard {
        /// The child.
        slot: usize,
        /// Idle (else busy).
        idle: bool,
    },
    /// An accept order on `listener` was answered: one fewer is out, and
    /// the listener is looked at again this turn.
    OrderAnswered {
        /// The listener.
        listener: usize,
    },
    /// An accept order on `listener` will never be answered (its child was
    /// killed): one fewer is out.
    OrderDropped {
        /// The listener.
        listener: usize,
    },
    /// The child in `slot` ended a connection (for the service-time and
    /// CPU figures): `took` is how long, when it served one at a time.
    ConnectionEnded {
        /// The child.
        slot: usize,
        /// Its pid.
        pid: i32,
        /// How long the connection took.
        took: Option<Duration>,
    },
    /// The child in `slot` finished connections: recycle it if it is past
    /// a limit.
    Served {
        /// The child.
        slot: usize,
    },
    /// The child in `slot` held one connection past `busy_timeout`: take
    /// its stack if the pool captures slow requests, then kill it (the
    /// shell calls back [`super::Core::kill`]).
    BusyTooLong {
        /// The child.
        slot: usize,
        /// Why, for the totals.
        reason: KillReason,
        /// Why, for the log.
        detail: String,
    },
    /// A child killed for sitting on its accept order had been ordered on
    /// this listener: the connection is still in the backlog; order
    /// another child at once.
    Redispatch {
        /// The listener.
        listener: usize,
    },
    /// A child has been reaped and its slot freed; the shell closes what
    /// it held for it.
    Gone(Gone<L>),
    /// A process the core does not know was reaped: kept as an orphan a
    /// template's `W` may yet name.
    Stranger {
        /// Its pid.
        pid: i32,
        /// How it ended.
        status: crate::sys::process::ExitStatus,
    },
    /// A binary upgrade's new supervisor exited before it was ready: the
    /// upgrade failed (counted), and this supervisor keeps serving.
    SuccessorGone {
        /// Its pid.
        pid: i32,
        /// How it ended.
        status: crate::sys::process::ExitStatus,
    },
    /// A stop began: stop accepting, close the parked connections, tell
    /// systemd.
    StopListening,
    /// The worker in `slot` was never verified and its slot is freed: the
    /// shell closes what it held for it (no process to signal or reap).
    Abandoned(Abandoned<L>),
    /// Send `request` to the template of `generation`. A failure comes
    /// back as [`super::Input::TemplateSendFailed`].
    SendTemplate {
        /// The template.
        generation: u32,
        /// What to send (a ping or a quit).
        request: TemplateRequest,
    },
    /// SIGKILL the template of `generation` and its process group.
    KillTemplate {
        /// The template.
        generation: u32,
    },
    /// The dispatch mode may have changed (a reload began, or failed and
    /// the serving configuration came back): the shell stops watching the
    /// listeners if it watched them (`was_watching`) and the mode now in
    /// force does not, and watches them if it does.
    Rewatch {
        /// Whether the mode before watched the listeners.
        was_watching: bool,
    },
    /// Tell systemd this status (with `READY=1`): a reload's end.
    Status(String),
    /// A reload failed for a start that no reaped child's stderr explains
    /// (a worker of the new generation vanished unreaped): the shell logs
    /// it and tells systemd.
    ReloadFailed(ReloadFailed),
    /// The worker that was in a slot (`link`: what the shell kept for it)
    /// is now the template of `generation` (a refork): the shell stops
    /// reading it as a worker and talks to it as the template.
    BecameTemplate {
        /// The new generation.
        generation: u32,
        /// Its pid.
        pid: i32,
        /// What the shell kept for it as a worker.
        link: L,
    },
    /// The template of `generation`, `pid`, has been reaped: the shell
    /// closes its ends and sweeps its process group; when it ended unasked
    /// (`failure`), the shell logs how, and why the reload failed or when
    /// a new template is started.
    TemplateGone {
        /// Its generation.
        generation: u32,
        /// Its pid.
        pid: i32,
        /// How it failed, when it ended unasked.
        failure: Option<TemplateFailure>,
    },
}

/// How a template ended unasked.
#[derive(Debug)]
pub(crate) struct TemplateFailure {
    /// How, for the log.
    pub how: String,
    /// Whether it had said `R`.
    pub was_ready: bool,
    /// The reload its end failed, if it was the new generation's template
    /// and never said `R`.
    pub reload_failed: Option<ReloadFailed>,
    /// Otherwise, how long until a new template is started.
    pub retry_in: Option<Duration>,
}

/// A reload abandoned because its new generation did not start: the
/// serving generation keeps serving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReloadFailed {
    /// The generation that did not start.
    pub failed: u32,
    /// The generation that keeps serving.
    pub serving: u32,
    /// How its child (or template) failed, for the log.
    pub how: String,
}

/// A worker never verified whose slot the core freed.
#[derive(Debug)]
pub(crate) struct Abandoned<L> {
    /// Its slot.
    pub slot: usize,
    /// What the shell kept for it.
    pub link: L,
}

/// A child reaped, its slot freed: what the shell needs to let it go.
#[derive(Debug)]
pub(crate) struct Gone<L> {
    /// The slot it had.
    pub slot: usize,
    /// Its pid.
    pub pid: i32,
    /// Whether the kernel had vouched for its pid (only then is its
    /// process group swept).
    pub verified: bool,
    /// The reload its failed start abandoned, if it did.
    pub reload_failed: Option<ReloadFailed>,
    /// What the shell kept for it.
    pub link: L,
}
