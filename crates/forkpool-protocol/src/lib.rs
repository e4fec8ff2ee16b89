//! forkpool-protocol: what a forkpool worker implements, in any language.
//!
//! Purpose: everything a child of a forkpool supervisor and the supervisor
//! agree on, and nothing else:
//! - [`wire`]: the back-channel messages and their exact bytes (a pure
//!   codec, no I/O), version [`wire::VERSION`];
//! - [`channel`]: one end of a back-channel, a `SOCK_SEQPACKET` socket
//!   carrying one message per datagram and, for a connection handoff, the
//!   connection's descriptor (`SCM_RIGHTS`);
//! - [`layout`]: the descriptors and environment variables an exec'd worker
//!   finds (`LISTEN_FDS`, `FORKPOOL_CHANNEL_FD`, ...).
//!
//! `docs/protocol.md` is the language-neutral description of the same; the
//! property tests in `tests/protocol_properties.rs` check the two agree.
//!
//! Not goals: deciding what a message means (the supervisor and the worker
//! do, in the `forkpool` crate), running or scaling children, or serving
//! connections.
#![deny(missing_docs)]
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod channel;
pub mod layout;
#[allow(unsafe_code)]
mod sys;
pub mod wire;

pub use channel::{Channel, Incoming, Malformed};
pub use wire::{ChildMessage, MessageBuf, ParentMessage, ProtocolError};
