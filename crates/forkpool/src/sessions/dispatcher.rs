//! The dispatcher thread: one `mio` poll over every parked session's socket
//! and the served listeners, one loop that moves sessions between the ledger
//! and the workers.
//!
//! It runs no user code except [`Session::refuse`]. It sleeps in `poll`
//! without a timeout unless an idle deadline or an accept retry is due;
//! workers and the pool handle interrupt that sleep through the inbox's
//! waker, so a session handed back is watched again at once.

use std::io;
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token};
use tracing::{debug, error, info, warn};

use super::config::CapPolicy;
use super::load::{Load, Reserve};
use super::messages::{token_of, Entry, Job, Message, Next, SessionId};
use super::session::{CloseReason, Session};
use super::stream::{SessionListener, SessionStream};
use super::table::Table;
use super::workers::refuse;

/// The token of the inbox's waker.
pub(crate) const WAKER: Token = Token(usize::MAX);

/// Listener `i` polls with token `usize::MAX - 1 - i`, far above any session
/// number.
fn listener_token(index: usize) -> Token {
    Token(usize::MAX - 1 - index)
}

fn listener_index(token: Token) -> Option<usize> {
    let index = usize::MAX - 1 - token.0.min(usize::MAX - 1);
    (index < MAX_LISTENERS).then_some(index)
}

const MAX_LISTENERS: usize = 64;

/// How long accepting pauses after an error such as running out of
/// descriptors, so the loop slows down instead of spinning.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

pub(crate) struct Dispatcher<S: Session> {
    pub(crate) name: String,
    pub(crate) poll: Poll,
    pub(crate) inbox: Receiver<Message<S>>,
    pub(crate) jobs: SyncSender<Job<S>>,
    pub(crate) workers: usize,
    pub(crate) load: Arc<Load>,
    pub(crate) context: Arc<S::Context>,
    pub(crate) policy: CapPolicy,
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) table: Table<S>,
    pub(crate) listeners: Vec<SessionListener>,
    /// Jobs sent to workers and not yet reported back.
    pub(crate) in_flight: usize,
    /// Accepting is paused: the pool is full (`Backlog`) or an accept failed.
    pub(crate) accept_paused: bool,
    pub(crate) accept_retry_at: Option<Instant>,
    pub(crate) stopping: bool,
}

impl<S: Session> Dispatcher<S> {
    pub(crate) fn run(mut self) {
        info!(pool = %self.name, workers = self.workers, "session dispatcher started");
        let mut events = Events::with_capacity(1024);
        loop {
            self.wait_for_events(&mut events);
            for event in events.iter() {
                self.on_ready(event.token());
            }
            self.read_inbox();
            self.expire_idle_sessions();
            self.resume_accepting();
            self.feed_workers();
            if self.stopping && self.table.is_empty() && self.in_flight == 0 {
                break;
            }
        }
        info!(pool = %self.name, "session dispatcher stopped");
        // Dropping `self.jobs` here tells the workers to exit.
    }

    /// Sleeps until a socket is ready, a message arrives, or the next
    /// deadline is due. With no deadline it sleeps for as long as it takes.
    fn wait_for_events(&mut self, events: &mut Events) {
        let now = Instant::now();
        let deadline = match (self.table.next_deadline(), self.accept_retry_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let timeout = deadline.map(|at| at.saturating_duration_since(now));
        if let Err(err) = self.poll.poll(events, timeout) {
            events.clear();
            if err.kind() != io::ErrorKind::Interrupted {
                // Nothing sensible is left to do but try again; slow down so
                // a persistent failure cannot spin.
                error!(pool = %self.name, %err, "poll failed");
                std::thread::sleep(ACCEPT_RETRY);
            }
        }
    }

    fn on_ready(&mut self, token: Token) {
        if token == WAKER {
            // The inbox is read after every wake-up anyway.
        } else if let Some(index) = listener_index(token) {
            if !self.accept_paused && index < self.listeners.len() {
                self.accept_from(index);
            }
        } else {
            self.table.wake(token.0 as SessionId);
        }
    }

    fn read_inbox(&mut self) {
        loop {
            match self.inbox.try_recv() {
                Ok(message) => self.on_message(message),
                Err(TryRecvError::Empty) => return,
                // The pool handle is gone without a shutdown message (it
                // always sends one, so this is a bug elsewhere): shut down.
                Err(TryRecvError::Disconnected) => {
                    if !self.stopping {
                        self.begin_shutdown();
                    }
                    return;
                }
            }
        }
    }

    fn on_message(&mut self, message: Message<S>) {
        match message {
            Message::Add(stream) => self.admit(stream),
            Message::Listen(listener) => self.listen(listener),
            Message::Shutdown => self.begin_shutdown(),
            Message::Back(entry, next) => {
                self.in_flight -= 1;
                self.take_back(entry, next);
            }
            Message::Gone(id) => {
                self.in_flight -= 1;
                self.table.forget(id);
            }
        }
    }

    /// A connection with a reserved place joins the pool. Its socket is
    /// watched from now on; readiness is ignored until it is opened.
    fn admit(&mut self, mut stream: SessionStream) {
        if self.stopping {
            debug!(pool = %self.name, "dropping a connection added during shutdown");
            drop(stream);
            self.load.release();
            return;
        }
        let id = self.table.next_id();
        let registered =
            self.poll
                .registry()
                .register(&mut stream, token_of(id), Interest::READABLE);
        if let Err(err) = registered {
            warn!(pool = %self.name, %err, "cannot watch a new connection; closing it");
            drop(stream);
            self.load.release();
            return;
        }
        self.table.admit(stream);
    }

    fn listen(&mut self, mut listener: SessionListener) {
        if self.stopping {
            return;
        }
        if self.listeners.len() >= MAX_LISTENERS {
            error!(pool = %self.name, %listener, "too many listeners (at most {MAX_LISTENERS}); ignoring this one");
            return;
        }
        let token = listener_token(self.listeners.len());
        let ready = listener.make_nonblocking().and_then(|()| {
            self.poll
                .registry()
                .register(&mut listener, token, Interest::READABLE)
        });
        match ready {
            Ok(()) => {
                info!(pool = %self.name, %listener, "serving sessions from listener");
                self.listeners.push(listener);
            }
            Err(err) => error!(pool = %self.name, %listener, %err, "cannot watch listener"),
        }
    }

    /// A worker is done with a session that stays open.
    fn take_back(&mut self, mut entry: Entry<S>, next: Next) {
        if self.stopping {
            self.table
                .make_ready(Job::Close(entry, CloseReason::Shutdown));
            return;
        }
        match next {
            Next::Continue => self.table.make_ready(Job::Step(entry)),
            Next::Wait(interest) => {
                // Re-arming reports readiness that arrived while a worker held
                // the session (those events were ignored) and input the step
                // left unread: with edge-triggered epoll nothing is lost.
                let armed = self.poll.registry().reregister(
                    &mut entry.stream,
                    token_of(entry.id),
                    interest,
                );
                match armed {
                    Ok(()) => {
                        let deadline = self.idle_timeout.map(|t| Instant::now() + t);
                        self.table.park(entry, deadline);
                    }
                    Err(err) => self
                        .table
                        .make_ready(Job::Close(entry, CloseReason::Failed(err))),
                }
            }
        }
    }

    fn expire_idle_sessions(&mut self) {
        let expired = self.table.expire(Instant::now());
        if expired > 0 {
            debug!(pool = %self.name, expired, "closing idle sessions");
        }
    }

    /// Accepts from every listener until each would block or the pool is
    /// full (`Backlog`: the rest wait in the kernel's backlog).
    fn accept_from(&mut self, index: usize) {
        loop {
            let accepted = match self.policy {
                CapPolicy::Backlog => self.accept_within_cap(index),
                CapPolicy::Refuse => self.accept_or_refuse(index),
            };
            match accepted {
                Accepted::One => continue,
                Accepted::Drained => return,
                Accepted::Full => {
                    debug!(pool = %self.name, "session cap reached; leaving connections in the backlog");
                    self.accept_paused = true;
                    return;
                }
                Accepted::Failed(err) => {
                    warn!(pool = %self.name, %err, retry_in = ?ACCEPT_RETRY, "accept failed; pausing");
                    self.accept_paused = true;
                    self.accept_retry_at = Some(Instant::now() + ACCEPT_RETRY);
                    return;
                }
            }
        }
    }

    fn accept_within_cap(&mut self, index: usize) -> Accepted {
        let listener = &self.listeners[index];
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
                self.admit(stream);
                Accepted::One
            }
            Ok(None) => outcome,
            Err(Reserve::Full) => Accepted::Full,
            Err(_) => Accepted::Drained,
        }
    }

    fn accept_or_refuse(&mut self, index: usize) -> Accepted {
        let mut stream = match accept_one(&self.listeners[index]) {
            Ok(Some(stream)) => stream,
            Ok(None) => return Accepted::One,
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => return Accepted::Drained,
            Err(err) => return Accepted::Failed(err),
        };
        match self.load.try_reserve() {
            Reserve::Taken => self.admit(stream),
            Reserve::Full | Reserve::Closed => {
                debug!(pool = %self.name, peer = %stream.peer(), "session cap reached; refusing");
                refuse::<S>(&self.name, &self.context, &mut stream);
            }
        }
        Accepted::One
    }

    /// Accepting was paused; start again once there is room and any retry
    /// delay has passed.
    fn resume_accepting(&mut self) {
        if !self.accept_paused || self.stopping {
            return;
        }
        if let Some(at) = self.accept_retry_at {
            if Instant::now() < at {
                return;
            }
        }
        if self.policy == CapPolicy::Backlog && !self.load.has_capacity() {
            return;
        }
        self.accept_paused = false;
        self.accept_retry_at = None;
        // Edge-triggered: nothing new will be reported for connections that
        // were already waiting, so go and get them.
        for index in 0..self.listeners.len() {
            if self.accept_paused {
                break;
            }
            self.accept_from(index);
        }
    }

    /// Hands ready jobs to workers, never more than there are workers: the
    /// rest wait in the ledger, where timeouts and shutdown still see them.
    fn feed_workers(&mut self) {
        while self.in_flight < self.workers {
            let Some(job) = self.table.next_job() else {
                return;
            };
            let id = job.id();
            match self.jobs.try_send(job) {
                Ok(()) => self.in_flight += 1,
                Err(TrySendError::Full(job)) => {
                    // Cannot happen while `in_flight` is counted right; keep
                    // the job for the next round rather than lose it.
                    error!(pool = %self.name, session = id, "worker queue unexpectedly full");
                    self.table.make_ready(job);
                    return;
                }
                Err(TrySendError::Disconnected(job)) => {
                    error!(pool = %self.name, session = id, "no worker threads left; dropping session");
                    self.table.forget(id);
                    drop(job);
                    self.load.release();
                }
            }
        }
    }

    fn begin_shutdown(&mut self) {
        info!(
            pool = %self.name,
            open = self.table.len(),
            ready = self.table.ready_len(),
            busy = self.in_flight,
            "session pool shutting down"
        );
        self.stopping = true;
        self.load.close();
        for mut listener in self.listeners.drain(..) {
            let _ = self.poll.registry().deregister(&mut listener);
        }
        for stream in self.table.close_all() {
            drop(stream);
            self.load.release();
        }
    }
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
