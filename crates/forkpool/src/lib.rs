//! forkpool: preforked server pools.
//!
//! A parent process (the *supervisor*) owns the listening sockets and a pool
//! of child processes. It grows and shrinks the pool with the load, hands each
//! new connection to the lowest-numbered idle child, replaces children that
//! crash, hang or misbehave, and shuts down without cutting a request short.
//!
//! Where things live:
//! - [`config`]: every knob and its validation;
//! - [`scaling`]: the policy that decides how many children there are (pure);
//! - [`scoreboard`]: which child is in which slot, doing what (plain data);
//! - [`protocol`]: the back-channel wire format (pure codec);
//! - [`sessions`]: many long connections served by a few threads inside one
//!   process (a dispatcher and a fixed crew of workers).
#![deny(missing_docs)]

pub mod config;
pub mod protocol;
pub mod scaling;
pub mod scoreboard;
pub mod sessions;
