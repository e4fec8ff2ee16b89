//! Many long conversations, few threads: libmilter's "pool of workers".
//!
//! # The model
//!
//! A mail filter or a line protocol spends almost all of a connection's life
//! waiting for the peer's next command, and only a few milliseconds working.
//! Giving each connection its own thread keeps a thread (and its stack)
//! asleep per connection. Here instead:
//!
//! - The state of a conversation lives in the user's own struct, a
//!   [`Session`], not on a thread's stack.
//! - One `mio` poll watches the sockets of every waiting session. When a
//!   socket becomes readable, that session is *ready*.
//! - A fixed crew of *worker* threads ([`SessionConfig::workers`]; the pool
//!   has no other thread) runs ready sessions one [`Session::step`] at a
//!   time. A step reads what has arrived, answers, and returns a [`Step`]
//!   saying what next: wait for more input, run again, or close.
//! - The workers take turns at the poll (*leader/followers*): exactly one
//!   free worker, the *poller*, sleeps in it; the other free workers sleep
//!   until it lets go. The poller that wakes for a ready session passes the
//!   poll on to one of them and runs the step itself, so a command costs
//!   one thread wake-up before it is answered, as with a thread per session,
//!   instead of a hop from a dispatcher thread to a worker.
//! - A worker that finishes a step re-arms the session's socket in the poll
//!   itself, so it is watched again at once, with no poll timeout and no
//!   wake-up. A `mio::Waker` interrupts the poller only for what its sleep
//!   cannot see: a connection [added](SessionPool::add) from outside, a new
//!   listener, shutdown, room to accept again. No thread polls on a timer:
//!   an idle pool sleeps until an idle timeout is due.
//!
//! ```text
//!                 ┌──────────── worker 0..N (fixed crew) ─────────────┐
//!   add(stream) ─>│ ledger: parked | ready queue | busy               │
//!   listener ────>│ poll (one at a time) ─ readable ─> step (hook) ─┐ │
//!                 │     ^  followers wait for the poll              │ │
//!                 │     └──── re-arm socket, park ──────────────────┘ │
//!                 └───────────────────────────────────────────────────┘
//! ```
//!
//! Each session is in exactly one place at a time: parked in the ledger
//! (its socket watched), queued as ready, or held by one worker. It moves by
//! value, so two workers can never run it at once. A worker runs one job at
//! a time, so at most `workers` steps run at once; further ready sessions
//! wait in the ledger's ready queue (oldest first), which is bounded by
//! [`SessionConfig::max_sessions`] since a session is queued at most once,
//! or in the kernel until a worker is free to poll. With every worker busy
//! nobody polls: nothing could run anyway, and new connections and idle
//! timeouts wait for the first worker to come free.
//!
//! # Guarantees
//!
//! - [`Session::on_close`] runs exactly once per opened session, whatever
//!   ended it: its own [`Step::Close`], an I/O error, a panic in one of its
//!   hooks, the idle timeout, or shutdown.
//! - A panic in a hook closes that session only; the worker thread catches
//!   it and goes on, so the crew keeps its size.
//! - The number of open sessions never exceeds the cap. What happens to one
//!   more is the [`CapPolicy`]: leave it in the kernel's backlog (or block
//!   [`SessionPool::add`]), or refuse it with a line written by
//!   [`Session::refuse`].
//! - [`SessionPool::open_sessions`] and [`SessionConfig::on_load`] report the
//!   load, for a preforked child to pass on to its supervisor.
//!
//! # Feeding the pool
//!
//! [`SessionPool::add`] takes a connection accepted elsewhere — in a
//! preforked child, one received from the parent. [`SessionPool::serve`]
//! lets the poller accept from a listener itself.
//!
//! # Example
//!
//! An echo service: the session's state is empty, each step echoes what has
//! arrived and waits for more.
//!
//! ```
//! use std::io::{self, Read, Write};
//! use std::net::{TcpListener, TcpStream};
//! use std::sync::Arc;
//!
//! use forkpool_sessions::{Session, SessionConfig, SessionPool, SessionStream, Step};
//!
//! struct Echo;
//!
//! impl Session for Echo {
//!     type Context = ();
//!
//!     fn open(_context: &Arc<()>, _stream: &SessionStream) -> Self {
//!         Echo
//!     }
//!
//!     fn step(&mut self, stream: &mut SessionStream) -> io::Result<Step> {
//!         let mut buf = [0; 4096];
//!         loop {
//!             match stream.read(&mut buf) {
//!                 Ok(0) => return Ok(Step::Close),
//!                 // Short replies fit the socket's buffer; a real protocol
//!                 // keeps what it could not write (as the CLI's line demo does).
//!                 Ok(n) => stream.write_all(&buf[..n])?,
//!                 Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Step::Wait),
//!                 Err(e) => return Err(e),
//!             }
//!         }
//!     }
//! }
//!
//! let pool = SessionPool::<Echo>::start(SessionConfig::default(), ())?;
//! let listener = TcpListener::bind("127.0.0.1:0")?;
//! let addr = listener.local_addr()?;
//! pool.serve(listener)?;
//!
//! let mut client = TcpStream::connect(addr)?;
//! client.write_all(b"hello")?;
//! let mut reply = [0; 5];
//! client.read_exact(&mut reply)?;
//! assert_eq!(&reply, b"hello");
//! pool.shutdown();
//! # Ok::<(), io::Error>(())
//! ```
//!
//! # Differences from the libmilter design
//!
//! The slides' first version started a worker per ready session when none
//! was idle, so the thread count was unbounded; the second bounded it with a
//! semaphore-guarded queue. This pool keeps the bound and adds what the
//! slides left open: a handed-back session is watched again at once instead
//! of after a 200–500 ms poll timeout, and ready sessions beyond the crew
//! wait in one queue rather than a second, blocking one.
//!
//! Where libmilter has one dispatcher thread that hands each ready session
//! to a worker, here the workers take turns being the dispatcher. A
//! dedicated dispatcher costs every command two wake-ups in a row (the
//! dispatcher's, then the worker's) and a third to hand the session back;
//! with 2,000 mostly idle sessions that made the pool's p99 latency worse
//! than a thread per session (`docs/benchmarks/history.md` has the numbers).
//!
//! # This crate
//!
//! Purpose: the session pool on its own, usable in any process; the
//! `forkpool` supervisor runs one in every child of
//! `Pool::run_sessions`. Not goals: forking, supervising or scaling
//! processes (the `forkpool` crate does), or any particular protocol: the
//! `forkpool demo --sessions` line protocol built on it lives in the CLI
//! (`forkpool_cli::demo::line`).

#![deny(missing_docs)]
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod config;
mod load;
mod messages;
mod poller;
mod pool;
mod session;
mod stream;
mod table;
mod workers;

pub use config::{CapPolicy, ConfigError, LoadHook, SessionConfig, MAX_NAME_LEN, MAX_WORKERS};
pub use pool::{Admission, SessionPool};
pub use session::{CloseReason, Session, Step};
pub use stream::{SessionListener, SessionStream};
