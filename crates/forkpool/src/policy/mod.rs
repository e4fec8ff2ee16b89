//! The rules, apart from the mechanism.
//!
//! - `liveness.rs`: which deadline a child must meet next, and when.

pub(crate) mod liveness;
