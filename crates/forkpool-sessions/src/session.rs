//! The contract between the pool and the code that speaks a protocol.
//!
//! A [`Session`] is the whole state of one conversation, held in the user's
//! own struct. The pool calls it only when something happened on its socket,
//! so no thread waits on its behalf between two commands.

use std::fmt;
use std::io;
use std::sync::Arc;

use super::stream::SessionStream;

/// What a session wants after a call: the pool reads this to decide where
/// the session goes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Park the session until its socket is readable (more input arrived or
    /// the peer closed). This is the usual answer once every complete command
    /// in hand has been answered.
    Wait,
    /// Park the session until its socket is writable: a reply could not be
    /// written in full because the peer is not reading. The pool steps the
    /// session again as soon as the peer makes room.
    WaitWritable,
    /// Run another step soon without waiting for the socket, for example
    /// because several pipelined commands are already buffered. The session
    /// goes to the back of the ready queue, so one chatty peer cannot starve
    /// the others.
    Continue,
    /// The conversation is over: the pool calls [`Session::on_close`] and
    /// closes the socket.
    Close,
}

/// Why a session is being closed; given to [`Session::on_close`].
#[derive(Debug)]
#[non_exhaustive]
pub enum CloseReason {
    /// The session itself returned [`Step::Close`].
    Finished,
    /// A hook returned an error (a reset connection, a broken pipe, ...).
    Failed(io::Error),
    /// A hook panicked; the session's state may be half updated.
    Panicked,
    /// The session waited for its peer longer than the configured idle
    /// timeout.
    IdleTimeout,
    /// The pool is shutting down.
    Shutdown,
}

impl fmt::Display for CloseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CloseReason::Finished => f.write_str("finished"),
            CloseReason::Failed(err) => write!(f, "failed: {err}"),
            CloseReason::Panicked => f.write_str("panicked"),
            CloseReason::IdleTimeout => f.write_str("idle timeout"),
            CloseReason::Shutdown => f.write_str("pool shutdown"),
        }
    }
}

/// One conversation on one connected socket.
///
/// The pool owns each session and hands it to exactly one place at a time:
/// either the ledger, while the poll watches its socket, or a single worker
/// thread, which runs one of the hooks below. Hooks therefore get
/// `&mut self` and never race with each other.
///
/// Every hook except [`Session::refuse`] runs on a worker thread, and a hook
/// that blocks (sleeps, waits on a database) keeps that worker busy: with all
/// workers busy, other ready sessions wait. The socket is non-blocking: a
/// read or write that cannot proceed returns
/// [`io::ErrorKind::WouldBlock`], which a hook should turn into
/// [`Step::Wait`] or [`Step::WaitWritable`]. A hook returning `Err` closes
/// the session.
///
/// Lifecycle: [`open`](Session::open) builds the state, then
/// [`on_open`](Session::on_open), then any number of
/// [`step`](Session::step)s, then [`on_close`](Session::on_close) exactly
/// once, whatever ended the session (its own choice, an error, a panic, the
/// idle timeout or shutdown).
pub trait Session: Send + Sized + 'static {
    /// State shared by every session of one pool (settings, counters). Use
    /// `()` when there is none. The pool keeps it in an [`Arc`]; a session
    /// that needs it later keeps a clone.
    type Context: Send + Sync + 'static;

    /// A new connection was accepted: build its state. Nothing should be
    /// written here; use [`on_open`](Session::on_open) for a greeting.
    fn open(context: &Arc<Self::Context>, stream: &SessionStream) -> Self;

    /// Called once right after [`open`](Session::open), before any input is
    /// awaited: write a greeting, or return [`Step::Close`] to turn the peer
    /// away. The default waits for input.
    fn on_open(&mut self, stream: &mut SessionStream) -> io::Result<Step> {
        let _ = stream;
        Ok(Step::Wait)
    }

    /// The socket is ready (or the session asked to
    /// [`Continue`](Step::Continue)): do one step of work and say what next.
    ///
    /// A step may be called when nothing can be read after all; a read then
    /// returns `WouldBlock` and the step should answer [`Step::Wait`]. A read
    /// of zero bytes means the peer closed its side: answer what is buffered,
    /// then return [`Step::Close`] — waiting for input that can never come
    /// would only make the pool call the step again.
    fn step(&mut self, stream: &mut SessionStream) -> io::Result<Step>;

    /// The session is closing for `reason`; called exactly once per opened
    /// session. The socket is still open, so a farewell (for example on
    /// [`CloseReason::IdleTimeout`]) can be written; errors are ignored
    /// because the socket is closed right after.
    fn on_close(&mut self, stream: &mut SessionStream, reason: &CloseReason) {
        let _ = (stream, reason);
    }

    /// The pool is full and its cap policy is
    /// [`Refuse`](super::CapPolicy::Refuse): tell the peer why before the
    /// connection is closed. No session is built for it.
    ///
    /// Runs on the thread that took the connection (the worker whose turn it
    /// was at the poll, for a served listener; the caller of
    /// [`add`](super::SessionPool::add)), so it must only write a short line
    /// and return. The default writes nothing.
    fn refuse(context: &Self::Context, stream: &mut SessionStream) {
        let _ = (context, stream);
    }
}
