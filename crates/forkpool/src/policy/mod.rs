//! The rules, apart from the mechanism.
//!
//! - `scaling.rs`: how many children there should be (public: [`crate::scaling`]);
//! - `dispatch.rs`: which child gets the next connection, and when to look
//!   at the backlog again when none can;
//! - `recycle.rs`: when a child has done enough (connections, memory,
//!   age) and is replaced, one rule for both sides of the fork;
//! - `liveness.rs`: which deadline a child must meet next, and when;
//! - `backoff.rs`: how long to hold spawns back while workers fail at
//!   start-up, what a start is, and how fast workers that had started
//!   are replaced;
//! - `shutdown.rs`: which stop a burst of stop signals asks for;
//! - `rollout.rs`: how a reload rolls from one generation to the next
//!   (the canary first, an old child retired only for a new one ready);
//! - `messages.rs`: which reports a child of each dispatch mode can
//!   honestly send;
//! - `budget.rs`: what one child may make the supervisor do per second
//!   (messages, stderr lines and bytes);
//! - `verification.rs`: whether a template's word about a worker's pid
//!   holds, by what the kernel says;
//! - `reservations.rs`: how long a `kernel` dispatch reservation holds its
//!   child, when it is given back, how often the board is read;
//! - `width.rs`: how many of the children new connections go to, in
//!   `kernel` dispatch, while the busy ones wait for the CPUs.

pub(crate) mod backoff;
pub(crate) mod budget;
pub(crate) mod cpu_wait;
pub(crate) mod dispatch;
pub(crate) mod liveness;
pub(crate) mod messages;
pub(crate) mod recycle;
pub(crate) mod reservations;
pub(crate) mod rollout;
pub mod scaling;
pub(crate) mod shutdown;
pub(crate) mod verification;
pub(crate) mod width;
