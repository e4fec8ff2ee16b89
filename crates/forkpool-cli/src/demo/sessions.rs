//! `forkpool demo --sessions`: a preforked pool whose children each hold
//! many sessions of a small SMTP-like line protocol
//! ([`line`](super::line): `NOOP`, `WORK <ms>`, `QUIT`).
//!
//! Read this file as an example of [`Pool::run_sessions`]. Three pieces:
//! - a [`Session`] type: here the library's [`LineSession`], wrapped so that
//!   the greeting names the child (`220 forkpool slot 0 pid 4242 ready`);
//! - a context every session of one child shares, built in the child after
//!   the fork from its [`WorkerInfo`] (here just who the child is);
//! - a [`SessionConfig`]: worker threads per child, and `max_sessions`, the
//!   most sessions one child holds.
//!
//! The supervisor hands each new connection to the lowest-numbered child
//! with room for one more session, and starts or retires children to keep
//! between `min_spare` and `max_spare` children's worth of free places.

use std::io;
use std::sync::Arc;

use super::line::LineSession;
use forkpool::sessions::{CloseReason, Session, SessionConfig, SessionStream, Step};
use forkpool::{Pool, PoolError, Totals, WorkerInfo};

/// What every session of one child shares: which child it is.
#[derive(Debug)]
pub struct Child {
    /// The child's slot (0 is the hottest).
    pub slot: usize,
    /// The child's process id.
    pub pid: u32,
}

/// One session: the line protocol, greeting with the child's slot and pid.
#[derive(Debug)]
pub struct DemoSession(LineSession);

impl Session for DemoSession {
    type Context = Child;

    fn open(child: &Arc<Child>, _stream: &SessionStream) -> Self {
        DemoSession(LineSession::with_greeting(greeting(child)))
    }

    fn on_open(&mut self, stream: &mut SessionStream) -> io::Result<Step> {
        self.0.on_open(stream)
    }

    fn step(&mut self, stream: &mut SessionStream) -> io::Result<Step> {
        self.0.step(stream)
    }

    fn on_close(&mut self, stream: &mut SessionStream, reason: &CloseReason) {
        self.0.on_close(stream, reason)
    }

    fn refuse(_child: &Child, stream: &mut SessionStream) {
        LineSession::refuse(&(), stream)
    }
}

/// The first line a client reads: `220 forkpool slot 0 pid 4242 ready`.
pub fn greeting(child: &Child) -> String {
    format!("220 forkpool slot {} pid {} ready", child.slot, child.pid)
}

/// How the demo's children hold sessions.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// Worker threads in each child.
    pub workers: usize,
    /// The most sessions one child holds.
    pub per_child: usize,
}

impl SessionOptions {
    /// The session pool every child runs.
    pub fn config(&self) -> SessionConfig {
        SessionConfig {
            workers: self.workers,
            max_sessions: self.per_child,
            name: "demo".to_string(),
            ..SessionConfig::default()
        }
    }
}

/// Runs `pool` with session children until it is stopped. `keep` is
/// anything the children should share copy-on-write (the preloaded table).
pub fn run<T>(pool: Pool, options: &SessionOptions, keep: T) -> Result<Totals, PoolError> {
    let sessions = options.config();
    pool.run_sessions::<DemoSession, _>(sessions, move |child: &WorkerInfo| {
        std::hint::black_box(&keep);
        Child {
            slot: child.slot,
            pid: child.pid,
        }
    })
}
