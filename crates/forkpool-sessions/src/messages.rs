//! What moves between the ledger and the workers.
//!
//! A session moves as a value: a worker takes a [`Job`] out of the ledger,
//! and hands the [`Entry`] back with where it goes [`Next`] (or closes it).
//! Whoever holds the entry is the only one who can touch the session, so two
//! workers can never run the same session at once.

use mio::{Interest, Token};

use super::session::CloseReason;
use super::stream::SessionStream;

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
