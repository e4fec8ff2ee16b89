//! forkpool: preforked server pools.
//!
//! A parent process (the *supervisor*) owns the listening sockets and a pool
//! of child processes. It grows and shrinks the pool with the load, hands each
//! new connection to the lowest-numbered idle child, replaces children that
//! crash, hang or misbehave, and shuts down without cutting a request short.
//!
//! Where things live:
//! - [`pool`]: the entry point, [`Pool`]: [`Pool::run`] for children that
//!   serve one connection at a time, [`Pool::run_sessions`] for children
//!   that each hold many (a [`sessions::SessionPool`] in every child);
//! - [`config`]: every knob and its validation;
//! - `policy`: the rules as pure functions, tested without processes:
//!   [`scaling`] (**who decides how many children there are**), the
//!   dispatch choice (lowest slot with room), liveness deadlines,
//!   recycling, start back-off, shutdown escalation;
//! - `dispatch`: **where a connection goes**, mechanically (`handoff` passes
//!   the descriptor, `order` tells the child to accept);
//! - `scoreboard`: the one slot table: which child is in which slot, doing
//!   what, with the supervisor's link to it (crate-private);
//! - [`protocol`]: the back-channel wire format (the `forkpool-protocol`
//!   crate holds it, the channel and the exec'd worker's layout);
//! - `supervisor`: the parent's event loop, carrying out the policy;
//! - [`worker`]: the child side;
//! - [`exec`]: children that run another program (`forkpool run -- CMD`);
//! - [`sessions`]: many long connections served by a few threads inside one
//!   process (a fixed crew of workers taking turns at one poll);
//! - [`listener`]: binding sockets and the stream a handler gets;
//! - [`status`]: the supervisor's totals.
#![deny(missing_docs)]
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod config;
pub mod control_path;
mod core;
mod dispatch;
pub mod exec;
pub mod fleet;
pub mod listener;
mod metrics;
pub mod observe;
mod policy;
pub use policy::scaling;
pub mod pool;
pub(crate) mod scoreboard;
pub(crate) mod slot;
pub mod status;
mod supervisor;
#[allow(unsafe_code)]
mod sys;
pub mod worker;

/// The back-channel wire format: [`forkpool_protocol::wire`], under the
/// name this crate has always used.
pub use forkpool_protocol::wire as protocol;
// The channel's I/O is the supervisor's and the worker's business; users
// who speak the protocol themselves use `forkpool_protocol::channel`.
pub(crate) use forkpool_protocol::channel;
/// The session pool every child of [`Pool::run_sessions`] runs: the
/// `forkpool-sessions` crate.
pub use forkpool_sessions as sessions;

pub use config::{DispatchMode, PoolConfig};
pub use exec::WorkerCommand;
pub use listener::{ListenAddr, Listener, Stream};
pub use pool::{Credentials, Pool, PoolError};
pub use status::Totals;
pub use worker::{Connection, ExecWorker, Handler, WorkerInfo};
