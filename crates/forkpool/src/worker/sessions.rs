//! The child side for children that serve many connections at once.
//!
//! After the fork, the child starts a [`SessionPool`] (its threads exist
//! only in the child: the supervisor stays single-threaded) and its main
//! thread stays in the back-channel loop:
//! - `Connection`: add the descriptor to the session pool, then count it as
//!   received and report the load;
//! - `Ping`: answer at once (no connection is ever served on this thread);
//! - `Quit`: take no more connections, wait until the open sessions have
//!   ended, stop the pool and exit (the supervisor SIGKILLs a child still
//!   draining after `shutdown_timeout`);
//! - end of file: the supervisor is gone; close every session and exit.
//!
//! Load reports (`L`) come from two places: the session pool's load hook,
//! on whichever thread opened or closed a session, and this thread after
//! each connection it received. One lock orders them, and a connection is
//! counted in `received` only after the pool counts it in `open`, so the
//! supervisor's view (`open + handed - received`) is never below the truth;
//! see `docs/protocol.md`. How many sessions a worker is running right now
//! (`running`) is looked at by this thread, which wakes for it at least
//! every [`RUNNING_LOOK`], and reported when it changed: the workers pay
//! one atomic add a step for it.

use std::os::fd::{AsFd, OwnedFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tracing::{debug, error, warn};

use super::{ChildStart, WorkerInfo};
use crate::channel::{Channel, Incoming};
use crate::protocol::{ChildMessage, ParentMessage};
use crate::sessions::{
    Admission, CapPolicy, LoadHook, Session, SessionConfig, SessionPool, SessionStream,
};
use crate::sys;

/// How often a draining child looks whether its supervisor is still there.
const DRAIN_CHECK: Duration = Duration::from_millis(500);

/// How often, at most, the main thread looks at how many sessions a
/// worker is running and reports a change (`running` in `L`): the
/// back-channel's receive times out after this long.
const RUNNING_LOOK: Duration = Duration::from_millis(100);

/// Runs a forked many-connection child to completion and returns its exit
/// status.
pub(crate) fn run_session_child<S, F>(start: ChildStart, sessions: SessionConfig, context: F) -> i32
where
    S: Session,
    F: FnOnce(&WorkerInfo) -> S::Context,
{
    let info = WorkerInfo {
        slot: start.slot,
        generation: start.generation,
        pid: std::process::id(),
        channel: start.channel,
    };
    let result = SessionChild::<S>::start(&info, sessions, context)
        .and_then(|child| child.obey_orders(&info));
    match result {
        Ok(()) => 0,
        Err(reason) => {
            error!(slot = info.slot, "child stopping: {reason}");
            1
        }
    }
}

struct SessionChild<S: Session> {
    pool: SessionPool<S>,
    reporter: Arc<Reporter>,
}

impl<S: Session> SessionChild<S> {
    /// Builds the sessions' context, starts the pool, says `Ready` and the
    /// first `Load`.
    fn start<F>(info: &WorkerInfo, mut config: SessionConfig, context: F) -> Result<Self, String>
    where
        F: FnOnce(&WorkerInfo) -> S::Context,
    {
        let channel = info
            .channel
            .as_fd()
            .try_clone_to_owned()
            .map(Channel::from_fd)
            .map_err(|e| format!("cannot duplicate the back-channel: {e}"))?;
        let reporter = Arc::new(Reporter {
            channel,
            capacity: u32::try_from(config.max_sessions).unwrap_or(u32::MAX),
            counts: Mutex::new(Counts::default()),
            emptied: Condvar::new(),
        });
        let users_hook = config.on_load.take();
        let hook_reporter = Arc::clone(&reporter);
        config.on_load = Some(LoadHook::new(move |open| {
            if let Some(hook) = &users_hook {
                hook.call(open);
            }
            hook_reporter.open_changed(open);
        }));
        // The supervisor never hands over more than `max_sessions`; should
        // it ever, a refusal is better than blocking this thread, which must
        // keep answering the supervisor.
        config.cap_policy = CapPolicy::Refuse;
        let context = catch_unwind(AssertUnwindSafe(|| context(info)))
            .map_err(|_| "the sessions' context factory panicked".to_string())?;
        let pool = SessionPool::<S>::start(config, context)
            .map_err(|e| format!("cannot start the session pool: {e}"))?;
        let ready = ChildMessage::Ready { pid: info.pid };
        info.channel
            .send_to_parent(ready)
            .map_err(|e| format!("cannot write to the supervisor: {e}"))?;
        reporter.report(&reporter.lock());
        Ok(SessionChild { pool, reporter })
    }

    fn obey_orders(self, info: &WorkerInfo) -> Result<(), String> {
        socket2::SockRef::from(&info.channel)
            .set_read_timeout(Some(RUNNING_LOOK))
            .map_err(|e| format!("cannot set the back-channel's receive timeout: {e}"))?;
        loop {
            let incoming = info
                .channel
                .recv_from_parent()
                .map_err(|e| format!("cannot read from the supervisor: {e}"))?;
            self.reporter.running_now(self.pool.running_sessions());
            match incoming {
                Incoming::Message(ParentMessage::Connection { .. }, Some(fd)) => self.take(fd),
                Incoming::Message(ParentMessage::Ping { seq }, _) => info
                    .channel
                    .send_to_parent(ChildMessage::Pong { seq })
                    .map_err(|e| format!("cannot write to the supervisor: {e}"))?,
                Incoming::Message(ParentMessage::Quit, _) => {
                    debug!(
                        slot = info.slot,
                        "told to quit; waiting for open sessions to end"
                    );
                    self.drain(&info.channel);
                    return Ok(());
                }
                Incoming::Message(ParentMessage::Accept { .. }, _) => {
                    return Err("ordered to accept, but this child only takes connections \
                                handed to it"
                        .into());
                }
                Incoming::Message(ParentMessage::Connection { .. }, None) => {
                    return Err("connection message without a descriptor".into());
                }
                Incoming::Closed => {
                    debug!(slot = info.slot, "supervisor gone, closing every session");
                    return Ok(());
                }
                Incoming::WouldBlock => {}
                Incoming::Malformed(why) => {
                    return Err(format!("malformed message from the supervisor: {why}"));
                }
            }
        }
    }

    /// Adds a handed connection to the pool, then counts it as received,
    /// whatever became of it.
    fn take(&self, fd: OwnedFd) {
        match SessionStream::try_from(fd).and_then(|stream| self.pool.add(stream)) {
            Ok(Admission::Accepted) => {}
            Ok(Admission::Refused) => {
                error!("refused a connection: the session pool is full");
            }
            Err(e) => warn!("cannot take a connection: {e}"),
        }
        self.reporter.received_one();
    }

    /// Waits until every session has ended or the supervisor is gone; the
    /// pool stops when `self` is dropped.
    fn drain(self, channel: &Channel) {
        while !self.reporter.wait_until_empty(DRAIN_CHECK) {
            if supervisor_gone(channel) {
                break;
            }
        }
        self.pool.shutdown();
    }
}

/// Whether the channel has reached end of file. Anything else the
/// supervisor sends after `Quit` is read and dropped.
fn supervisor_gone(channel: &Channel) -> bool {
    while sys::socket::readable_now(channel.as_fd()) {
        match channel.recv_from_parent() {
            Ok(Incoming::Message(..)) | Ok(Incoming::Malformed(_)) => continue,
            Ok(Incoming::WouldBlock) => return false,
            Ok(Incoming::Closed) | Err(_) => return true,
        }
    }
    false
}

/// The counts a load report carries, and the lock that orders reports.
#[derive(Debug, Default)]
struct Counts {
    open: u32,
    received: u32,
    running: u32,
}

struct Reporter {
    /// A duplicate of the child's end of the back-channel.
    channel: Channel,
    capacity: u32,
    counts: Mutex<Counts>,
    /// Signalled when `open` drops to 0.
    emptied: Condvar,
}

impl Reporter {
    /// The session pool's load hook: called, in order, each time the
    /// number of open sessions changes.
    fn open_changed(&self, open: usize) {
        let mut counts = self.lock();
        counts.open = u32::try_from(open).unwrap_or(u32::MAX);
        self.report(&counts);
        if counts.open == 0 {
            self.emptied.notify_all();
        }
    }

    /// The main thread's look at how many sessions a worker runs now:
    /// reported when it changed.
    fn running_now(&self, running: usize) {
        let running = u32::try_from(running).unwrap_or(u32::MAX);
        let mut counts = self.lock();
        if counts.running != running {
            counts.running = running;
            self.report(&counts);
        }
    }

    /// One more connection received from the supervisor.
    fn received_one(&self) {
        let mut counts = self.lock();
        counts.received = counts.received.wrapping_add(1);
        self.report(&counts);
    }

    /// Sends `L` with the counts, under their lock. A failure means the
    /// supervisor is gone, which the main thread sees as end of file.
    fn report(&self, counts: &Counts) {
        let _ = self.channel.send_to_parent(ChildMessage::Load {
            open: counts.open,
            capacity: self.capacity,
            received: counts.received,
            running: counts.running,
        });
    }

    /// Waits up to `timeout` for no session to be open.
    fn wait_until_empty(&self, timeout: Duration) -> bool {
        let counts = self.lock();
        let (counts, _) = self
            .emptied
            .wait_timeout_while(counts, timeout, |c| c.open > 0)
            .unwrap_or_else(PoisonError::into_inner);
        counts.open == 0
    }

    fn lock(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
