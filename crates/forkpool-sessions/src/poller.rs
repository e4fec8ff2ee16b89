//! The one poll over every waiting session, and the ledger behind it, shared
//! by the worker threads that take turns watching it (leader/followers).
//!
//! Whoever holds the poll's lock is *the poller*: the only thread in
//! `epoll_wait`, watching every parked session's socket and the served
//! listeners. The other free workers wait for that lock (*followers*). When
//! the poller's wait ends, it moves what became ready into the ledger's
//! ready queue, takes the oldest job for itself, and lets go of the lock, so
//! that one follower becomes the poller while it runs the step. A command
//! therefore wakes one thread, which answers it; the follower's promotion
//! happens beside the step, not before it.
//!
//! A finished step re-arms its socket in the poll directly (any thread may
//! change a registration), so the poller watches it again at once without
//! being woken. The [`Waker`] interrupts the poller only for what its
//! sleep cannot see: a connection added by the pool handle, a new listener,
//! shutdown, room to accept again, or the last worker leaving.
//!
//! Lock order: the poll, then the ledger. Neither is held while a hook runs,
//! except [`Session::refuse`], which runs with neither.

use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Registry, Token, Waker};
use tracing::{debug, error, info, warn};

use super::config::CapPolicy;
use super::load::{Load, Reserve};
use super::messages::{token_of, Entry, Job, Next, SessionId};
use super::session::{CloseReason, Session};
use super::stream::{SessionListener, SessionStream};
use super::table::Table;
use super::workers::refuse;

/// The token of the waker.
const WAKER: Token = Token(usize::MAX);

/// Listener `i` polls with token `usize::MAX - 1 - i`, far above any session
/// number.
fn listener_token(index: usize) -> Token {
    Token(usize::MAX - 1 - index)
}

fn listener_index(token: Token) -> Option<usize> {
    let index = usize::MAX - 1 - token.0.min(usize::MAX - 1);
    (index < MAX_LISTENERS).then_some(index)
}

/// The most listeners one pool serves.
pub(crate) const MAX_LISTENERS: usize = 64;

/// How long accepting pauses after an error such as running out of
/// descriptors, so the pool slows down instead of spinning.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// How many readiness events one turn at the poll takes in.
const EVENTS_PER_TURN: usize = 256;

/// The settings the poller needs.
pub(crate) struct PollerConfig {
    pub(crate) name: String,
    pub(crate) policy: CapPolicy,
    pub(crate) idle_timeout: Option<Duration>,
}

/// What every thread of one pool shares: the poll, the ledger, the load.
pub(crate) struct Poller<S: Session> {
    pub(crate) name: String,
    /// The lock is the poller's role: its holder waits on the poll, the
    /// other free workers wait for the lock.
    poll: Mutex<Poll>,
    /// The poll's registry, for changing registrations without the lock.
    registry: Registry,
    waker: Waker,
    ledger: Mutex<Ledger<S>>,
    pub(crate) load: Arc<Load>,
    pub(crate) context: Arc<S::Context>,
    policy: CapPolicy,
    idle_timeout: Option<Duration>,
}

/// Everything about the sessions and listeners that changes.
struct Ledger<S> {
    table: Table<S>,
    listeners: Vec<SessionListener>,
    /// Accepting is paused: the pool is full (`Backlog`) or an accept failed.
    accept_paused: bool,
    accept_retry_at: Option<Instant>,
    stopping: bool,
}

/// What a free worker finds in the ledger.
enum Work<S> {
    Job(Job<S>),
    /// Nothing to run yet.
    None,
    /// The pool has stopped and every session is closed: exit.
    Finished,
}

impl<S: Session> Poller<S> {
    pub(crate) fn new(
        config: PollerConfig,
        load: Arc<Load>,
        context: Arc<S::Context>,
    ) -> io::Result<Self> {
        let poll = Poll::new()?;
        let registry = poll.registry().try_clone()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        Ok(Poller {
            name: config.name,
            poll: Mutex::new(poll),
            registry,
            waker,
            ledger: Mutex::new(Ledger {
                table: Table::default(),
                listeners: Vec::new(),
                accept_paused: false,
                accept_retry_at: None,
                stopping: false,
            }),
            load,
            context,
            policy: config.policy,
            idle_timeout: config.idle_timeout,
        })
    }

    /// A worker's wait for its next job: a ready one from the ledger if there
    /// is one, otherwise a turn at the poll (after the current poller's, if
    /// another thread has it). `None` once the pool has stopped and every
    /// session is closed. `events` is the worker's own buffer.
    pub(crate) fn next_job(&self, events: &mut Events) -> Option<Job<S>> {
        loop {
            match self.take_work() {
                Work::Job(job) => return Some(job),
                Work::Finished => return self.finish(),
                Work::None => {}
            }
            // Followers wait here, asleep, for the poller to let go.
            let mut poll = self.poll.lock().unwrap_or_else(PoisonError::into_inner);
            // The last poller may have left ready jobs behind for us.
            let timeout = {
                let mut ledger = self.lock_ledger();
                match ledger.take_work() {
                    Work::Job(job) => return Some(job),
                    Work::Finished => {
                        drop(ledger);
                        drop(poll);
                        return self.finish();
                    }
                    Work::None => ledger.poll_timeout(Instant::now(), self.idle_timeout),
                }
            };
            self.wait(&mut poll, events, timeout);
            let mut refused = Vec::new();
            let job = {
                let mut ledger = self.lock_ledger();
                for event in events.iter() {
                    self.on_ready(&mut ledger, event.token(), &mut refused);
                }
                self.expire_idle_sessions(&mut ledger);
                self.resume_accepting(&mut ledger, &mut refused);
                ledger.table.next_job()
            };
            // A follower takes over the poll while this thread works.
            drop(poll);
            for mut stream in refused {
                refuse::<S>(&self.name, &self.context, &mut stream);
            }
            if let Some(job) = job {
                return Some(job);
            }
        }
    }

    /// A worker is done with a session that stays open: park it (its socket
    /// watched again at once) or queue it to run again.
    pub(crate) fn hand_back(&self, mut entry: Entry<S>, next: Next) {
        // Re-arming reports input the step left unread (edge-triggered
        // epoll would not report it again). It happens before the ledger is
        // locked, so the poller never waits on a system call for the lock; a
        // report that comes before the session is parked finds it busy, and
        // the ledger keeps it (see `Table::park`).
        let armed = match next {
            Next::Wait(interest) => {
                self.registry
                    .reregister(&mut entry.stream, token_of(entry.id), interest)
            }
            Next::Continue => Ok(()),
        };
        let mut ledger = self.lock_ledger();
        let job = match (next, armed) {
            _ if ledger.stopping => Job::Close(entry, CloseReason::Shutdown),
            (Next::Continue, _) => Job::Step(entry),
            (Next::Wait(_), Err(err)) => Job::Close(entry, CloseReason::Failed(err)),
            (Next::Wait(_), Ok(())) => {
                // The poller needs no wake-up for this deadline: see
                // `poll_timeout`.
                let deadline = self.idle_timeout.map(|t| Instant::now() + t);
                ledger.table.park(entry, deadline);
                return;
            }
        };
        ledger.table.make_ready(job);
    }

    /// A worker closed session `id` (or never opened it); its place in the
    /// load is already released.
    pub(crate) fn forget(&self, id: SessionId) {
        let mut ledger = self.lock_ledger();
        ledger.table.forget(id);
        // The poller decides when to accept again, and may be asleep.
        let wake = ledger.accept_paused && !ledger.stopping;
        drop(ledger);
        if wake {
            self.wake();
        }
    }

    /// A connection with a reserved place joins the pool (from
    /// [`SessionPool::add`](super::SessionPool::add)); given back if the pool
    /// is stopping, its place still reserved.
    pub(crate) fn add(&self, stream: SessionStream) -> Result<(), SessionStream> {
        let mut ledger = self.lock_ledger();
        if ledger.stopping {
            return Err(stream);
        }
        self.admit(&mut ledger, stream);
        drop(ledger);
        self.wake();
        Ok(())
    }

    /// Accepts sessions from `listener` too.
    pub(crate) fn listen(&self, mut listener: SessionListener) -> io::Result<()> {
        let mut ledger = self.lock_ledger();
        if ledger.stopping {
            return Err(io::Error::other("the session pool is shutting down"));
        }
        if ledger.listeners.len() >= MAX_LISTENERS {
            return Err(io::Error::other(format!(
                "a session pool serves at most {MAX_LISTENERS} listeners"
            )));
        }
        let token = listener_token(ledger.listeners.len());
        listener.make_nonblocking()?;
        self.registry
            .register(&mut listener, token, Interest::READABLE)?;
        info!(pool = %self.name, %listener, "serving sessions from listener");
        ledger.listeners.push(listener);
        drop(ledger);
        // Connections may be queued already; the poller accepts them.
        self.wake();
        Ok(())
    }

    /// Stops taking sessions and closes them all: parked and queued ones get
    /// a close job, busy ones are closed when their step returns. The workers
    /// exit once the ledger is empty.
    pub(crate) fn shut_down(&self) {
        let mut ledger = self.lock_ledger();
        if ledger.stopping {
            return;
        }
        info!(
            pool = %self.name,
            open = ledger.table.len(),
            ready = ledger.table.ready_len(),
            "session pool shutting down"
        );
        ledger.stopping = true;
        self.load.close();
        for mut listener in ledger.listeners.drain(..) {
            let _ = self.registry.deregister(&mut listener);
        }
        for stream in ledger.table.close_all() {
            drop(stream);
            self.load.release();
        }
        drop(ledger);
        self.wake();
    }

    fn take_work(&self) -> Work<S> {
        self.lock_ledger().take_work()
    }

    /// This worker exits; the poller, if any, must see that too.
    fn finish(&self) -> Option<Job<S>> {
        self.wake();
        None
    }

    /// Sleeps in the poll until a socket is ready, the waker is rung, or
    /// `timeout` passes.
    fn wait(&self, poll: &mut Poll, events: &mut Events, timeout: Option<Duration>) {
        if let Err(err) = poll.poll(events, timeout) {
            events.clear();
            if err.kind() != io::ErrorKind::Interrupted {
                // Nothing sensible is left to do but try again; slow down so
                // a persistent failure cannot spin.
                error!(pool = %self.name, %err, "poll failed");
                std::thread::sleep(ACCEPT_RETRY);
            }
        }
    }

    fn on_ready(&self, ledger: &mut Ledger<S>, token: Token, refused: &mut Vec<SessionStream>) {
        if token == WAKER {
            // Rung so that the ledger is looked at again, which it is after
            // every wait anyway.
        } else if let Some(index) = listener_index(token) {
            if !ledger.accept_paused && !ledger.stopping && index < ledger.listeners.len() {
                self.accept_from(ledger, index, refused);
            }
        } else {
            ledger.table.wake(token.0 as SessionId);
        }
    }

    fn expire_idle_sessions(&self, ledger: &mut Ledger<S>) {
        let expired = ledger.table.expire(Instant::now());
        if expired > 0 {
            debug!(pool = %self.name, expired, "closing idle sessions");
        }
    }

    /// Watches a connection with a reserved place and queues it to be
    /// opened; readiness is ignored until it is.
    fn admit(&self, ledger: &mut Ledger<S>, mut stream: SessionStream) {
        let id = ledger.table.next_id();
        let registered = self
            .registry
            .register(&mut stream, token_of(id), Interest::READABLE);
        if let Err(err) = registered {
            warn!(pool = %self.name, %err, "cannot watch a new connection; closing it");
            drop(stream);
            self.load.release();
            return;
        }
        ledger.table.admit(stream);
    }

    /// Accepts from listener `index` until it would block or the pool is
    /// full (`Backlog`: the rest wait in the kernel's backlog). Connections
    /// to refuse are left in `refused`, for after the locks are let go.
    fn accept_from(&self, ledger: &mut Ledger<S>, index: usize, refused: &mut Vec<SessionStream>) {
        loop {
            let accepted = match self.policy {
                CapPolicy::Backlog => self.accept_within_cap(ledger, index),
                CapPolicy::Refuse => self.accept_or_refuse(ledger, index, refused),
            };
            match accepted {
                Accepted::One => continue,
                Accepted::Drained => return,
                Accepted::Full => {
                    debug!(pool = %self.name, "session cap reached; leaving connections in the backlog");
                    ledger.accept_paused = true;
                    return;
                }
                Accepted::Failed(err) => {
                    warn!(pool = %self.name, %err, retry_in = ?ACCEPT_RETRY, "accept failed; pausing");
                    ledger.accept_paused = true;
                    ledger.accept_retry_at = Some(Instant::now() + ACCEPT_RETRY);
                    return;
                }
            }
        }
    }

    fn accept_within_cap(&self, ledger: &mut Ledger<S>, index: usize) -> Accepted {
        let listener = &ledger.listeners[index];
        let mut outcome = Accepted::Drained;
        let taken = self.load.reserve_with(|| match accept_one(listener) {
            Ok(Some(stream)) => Some(stream),
            Ok(None) => {
                outcome = Accepted::One;
                None
            }
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => None,
            Err(err) => {
                outcome = Accepted::Failed(err);
                None
            }
        });
        match taken {
            Ok(Some(stream)) => {
                self.admit(ledger, stream);
                Accepted::One
            }
            Ok(None) => outcome,
            Err(Reserve::Full) => Accepted::Full,
            Err(_) => Accepted::Drained,
        }
    }

    fn accept_or_refuse(
        &self,
        ledger: &mut Ledger<S>,
        index: usize,
        refused: &mut Vec<SessionStream>,
    ) -> Accepted {
        let stream = match accept_one(&ledger.listeners[index]) {
            Ok(Some(stream)) => stream,
            Ok(None) => return Accepted::One,
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => return Accepted::Drained,
            Err(err) => return Accepted::Failed(err),
        };
        match self.load.try_reserve() {
            Reserve::Taken => self.admit(ledger, stream),
            Reserve::Full | Reserve::Closed => {
                debug!(pool = %self.name, peer = %stream.peer(), "session cap reached; refusing");
                refused.push(stream);
            }
        }
        Accepted::One
    }

    /// Accepting was paused; start again once there is room and any retry
    /// delay has passed.
    fn resume_accepting(&self, ledger: &mut Ledger<S>, refused: &mut Vec<SessionStream>) {
        if !ledger.accept_paused || ledger.stopping {
            return;
        }
        if let Some(at) = ledger.accept_retry_at {
            if Instant::now() < at {
                return;
            }
        }
        if self.policy == CapPolicy::Backlog && !self.load.has_capacity() {
            return;
        }
        ledger.accept_paused = false;
        ledger.accept_retry_at = None;
        // Edge-triggered: nothing new will be reported for connections that
        // were already waiting, so go and get them.
        for index in 0..ledger.listeners.len() {
            if ledger.accept_paused {
                break;
            }
            self.accept_from(ledger, index, refused);
        }
    }

    fn wake(&self) {
        if let Err(err) = self.waker.wake() {
            // The poller looks at the ledger on its next wake-up, which may
            // come later than it should.
            warn!(pool = %self.name, %err, "could not wake the session poller");
        }
    }

    fn lock_ledger(&self) -> MutexGuard<'_, Ledger<S>> {
        // Hooks never run under this lock; a panic in the pool's own code
        // leaves the ledger as consistent as the code that panicked did.
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<S> Ledger<S> {
    fn take_work(&mut self) -> Work<S> {
        match self.table.next_job() {
            Some(job) => Work::Job(job),
            None if self.stopping && self.table.is_empty() => Work::Finished,
            None => Work::None,
        }
    }

    /// How long the poller may sleep: until the soonest idle deadline or
    /// accept retry, or for as long as it takes.
    ///
    /// A session that is not parked now (a worker has it, or it waits for
    /// one) will be parked later than `now`, so its deadline will be more
    /// than `idle_timeout` away: sleeping no longer than that while any
    /// session is open means a park never has to wake the poller. (A session
    /// added from outside wakes it; one accepted was accepted by a poller,
    /// which counts it before its next sleep.)
    fn poll_timeout(&self, now: Instant, idle_timeout: Option<Duration>) -> Option<Duration> {
        let unparked = idle_timeout
            .filter(|_| !self.table.is_empty())
            .map(|t| now + t);
        [self.table.next_deadline(), self.accept_retry_at, unparked]
            .into_iter()
            .flatten()
            .min()
            .map(|at| at.saturating_duration_since(now))
    }
}

/// A worker's buffer for one turn at the poll.
pub(crate) fn events() -> Events {
    Events::with_capacity(EVENTS_PER_TURN)
}

enum Accepted {
    One,
    Drained,
    Full,
    Failed(io::Error),
}

/// Accepts one connection. `Ok(None)`: the attempt failed in a way that
/// concerns only that connection (it was reset while queued); try the next.
fn accept_one(listener: &SessionListener) -> io::Result<Option<SessionStream>> {
    match listener.accept() {
        Ok(stream) => Ok(Some(stream)),
        Err(err)
            if matches!(
                err.kind(),
                io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
            ) =>
        {
            Ok(None)
        }
        Err(err) => Err(err),
    }
}
