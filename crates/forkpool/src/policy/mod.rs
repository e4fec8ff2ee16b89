//! The rules, apart from the mechanism.
//!
//! - `dispatch.rs`: which child gets the next connection, and when to look
//!   at the backlog again when none can;
//! - `liveness.rs`: which deadline a child must meet next, and when;
//! - `shutdown.rs`: which stop a burst of stop signals asks for.

pub(crate) mod dispatch;
pub(crate) mod liveness;
pub(crate) mod shutdown;
