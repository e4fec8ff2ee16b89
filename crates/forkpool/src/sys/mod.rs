//! The syscall boundary. Everything above this module is safe Rust; every
//! `unsafe` block in the crate lives here, each with a `SAFETY:` note.

pub mod bpf;
pub mod fds;
pub mod memory_merge;
pub mod process;
pub mod signal;
pub mod socket;
pub mod wait;
