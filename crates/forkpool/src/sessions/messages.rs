//! What travels between the pool's threads.
//!
//! A session moves as a value: the dispatcher hands a [`Job`] to one worker,
//! and the worker hands a [`Message`] back. Whoever holds the [`Entry`] is
//! the only one who can touch the session, so two workers can never run the
//! same session at once.

use std::sync::mpsc::Sender;
use std::sync::Arc;

use mio::{Interest, Token, Waker};

use super::session::CloseReason;
use super::stream::{SessionListener, SessionStream};

/// A session's number within its pool. Numbers are never reused, so an event
/// that arrives late for a closed session cannot reach a newer one.
pub(crate) type SessionId = u64;

/// The poll token of a session's socket.
pub(crate) fn token_of(id: SessionId) -> Token {
    Token(id as usize)
}

/// One open session: its socket and the user's state.
#[derive(Debug)]
pub(crate) struct Entry<S> {
    pub(crate) id: SessionId,
    pub(crate) stream: SessionStream,
    pub(crate) session: S,
}

/// Work for a worker thread.
#[derive(Debug)]
pub(crate) enum Job<S> {
    /// Build the session for a fresh connection and run its `on_open`.
    Open {
        id: SessionId,
        stream: SessionStream,
    },
    /// Run one step.
    Step(Entry<S>),
    /// Run `on_close` and close the socket.
    Close(Entry<S>, CloseReason),
}

impl<S> Job<S> {
    pub(crate) fn id(&self) -> SessionId {
        match self {
            Job::Open { id, .. } => *id,
            Job::Step(entry) | Job::Close(entry, _) => entry.id,
        }
    }
}

/// Where a session that is still open goes after a worker is done with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Park it until its socket shows this readiness.
    Wait(Interest),
    /// Queue it to run again.
    Continue,
}

/// Everything the dispatcher is told.
#[derive(Debug)]
pub(crate) enum Message<S> {
    /// From the pool handle: a connection whose place is already reserved.
    Add(SessionStream),
    /// From the pool handle: accept sessions from this listener too.
    Listen(SessionListener),
    /// From the pool handle: stop taking sessions, close them all, exit.
    Shutdown,
    /// From a worker: the job is done and the session is still open.
    Back(Entry<S>, Next),
    /// From a worker: the job is done and the session is closed (or never
    /// opened); its place is already released.
    Gone(SessionId),
}

/// The dispatcher's mailbox: a channel plus the [`Waker`] that interrupts its
/// poll, so a message is seen at once and the dispatcher never needs a poll
/// timeout to notice one.
pub(crate) struct Inbox<S> {
    tx: Sender<Message<S>>,
    waker: Arc<Waker>,
}

impl<S> Clone for Inbox<S> {
    fn clone(&self) -> Self {
        Inbox {
            tx: self.tx.clone(),
            waker: Arc::clone(&self.waker),
        }
    }
}

impl<S> Inbox<S> {
    pub(crate) fn new(tx: Sender<Message<S>>, waker: Arc<Waker>) -> Self {
        Inbox { tx, waker }
    }

    /// Delivers `message`; gives it back if the dispatcher has exited.
    pub(crate) fn send(&self, message: Message<S>) -> Result<(), Message<S>> {
        self.tx.send(message).map_err(|e| e.0)?;
        if let Err(err) = self.waker.wake() {
            // The message is queued; the dispatcher reads it on its next
            // wake-up, which may come later than it should.
            tracing::warn!(%err, "could not wake the session dispatcher");
        }
        Ok(())
    }
}
