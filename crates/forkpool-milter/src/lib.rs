//! Mail filters (milters) for Postfix and Sendmail, on forkpool's session
//! pool.
//!
//! # The protocol, sans I/O
//!
//! The milter protocol (version 6, as libmilter 8.14+ and Postfix 2.6+
//! speak it) is a stream of packets: a 4-byte big-endian length, a command
//! byte, and data. This crate's protocol layer does no I/O:
//!
//! - [`Decoder`] splits bytes into [`Packet`]s, holding at most one partial
//!   packet and refusing any longer than its bound;
//! - [`Command`] is every command the MTA sends, [`Reply`] every reply and
//!   modification a filter sends; both decode and encode, so the same
//!   types serve a filter and a client (a test, a load generator);
//! - [`Conversation`] is one conversation's state machine: it negotiates
//!   ([`FilterOptions`]), keeps the [`Macros`], calls the [`Filter`]'s hooks
//!   and answers, sending nothing for the steps negotiated as no-reply.
//!
//! [`client`] does the MTA's side over a blocking stream.
//!
//! Every malformed packet is a typed error ([`WireError`],
//! [`ConversationError`]) that ends its own conversation and nothing else.
//!
//! # Filters
//!
//! A [`Filter`] has one method per stage, as libmilter's `smfiDesc` has one
//! callback per stage; `&mut self` is the conversation's own state (where
//! libmilter keeps `smfi_setpriv`), and the [`Context`] holds the macros.
//! Each returns a [`Status`]; at end of message, [`EomActions`] collects the
//! modifications.
//!
//! ```
//! use std::sync::Arc;
//! use forkpool_milter::{Actions, Context, EomActions, Filter, FilterOptions, Status};
//!
//! /// Adds `X-Seen: yes` to every message.
//! struct Seen;
//!
//! impl Filter for Seen {
//!     type Shared = ();
//!     fn new(_: &Arc<()>) -> Self {
//!         Seen
//!     }
//!     fn options(_: &()) -> FilterOptions {
//!         FilterOptions { actions: Actions::ADD_HEADERS, ..FilterOptions::default() }
//!     }
//!     fn eom(&mut self, _ctx: &Context<'_>, actions: &mut EomActions) -> Status {
//!         actions.add_header("X-Seen", "yes").expect("negotiated above");
//!         Status::Continue
//!     }
//! }
//! ```
//!
//! # On the session pool
//!
//! [`MilterSession`] is a `forkpool_sessions::Session`: a conversation
//! parked in the pool's poll between commands, each command run by one of
//! a fixed crew of threads. `forkpool::Pool::run_sessions::<MilterSession<F>, _>`
//! runs it in preforked children (`forkpool milter` does; see
//! `docs/milter.md`).
//!
//! - **A hook that panics** closes its own conversation: the pool catches
//!   the panic, [`MilterSession`] sends the MTA a tempfail for the command it
//!   was waiting on, and closes; the MTA applies `milter_default_action` to
//!   the rest of that SMTP session. Other conversations go on.
//! - **A hook that hangs** cannot be stopped: a thread cannot be killed
//!   safely, so it keeps one worker of its child. With a step deadline
//!   ([`MilterContext::with_step_deadline`], `forkpool milter
//!   --step-timeout`), a [`Watchdog`] thread tempfails that conversation
//!   and closes its socket when the deadline passes, so the MTA learns at
//!   once rather than at its own timeout (Postfix's
//!   `milter_command_timeout`, 30 s, or `milter_content_timeout`, 300 s at
//!   end of message); when the hook returns at last, its replies are
//!   dropped. The child's other conversations run on its other workers. A
//!   child whose workers have all hung serves nobody until it is recycled;
//!   run enough workers and keep blocking calls (DNS, a content scanner)
//!   under their own timeouts.
//! - **An idle conversation** is closed after the session pool's
//!   `idle_timeout` (`forkpool milter --idle-timeout`).
//!
//! # Why not build on a milter crate
//!
//! `indymilter` is the well-kept Rust milter library, but it is
//! GPL-3.0-or-later (this workspace is MIT or Apache-2.0), its codec is
//! private to the crate and its conversations run as tokio tasks: neither
//! its parser nor its state machine can be called on bytes in hand from a
//! session pool's worker. The protocol is small (fifteen commands, twenty
//! replies), so it is written here, from libmilter's documented constants
//! (`mfdef.h`, `mfapi.h`).

#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod client;
pub mod command;
pub mod consts;
pub mod conversation;
pub mod filter;
pub mod flags;
pub mod macros;
pub mod reply;
pub mod session;
pub mod status;
pub mod watchdog;
pub mod wire;

pub use command::{Address, Command, OptNeg};
pub use conversation::{Conversation, ConversationError, Flow};
pub use filter::{Context, EomActions, Filter, FilterOptions, NotNegotiated};
pub use flags::{Actions, Protocol, Stage};
pub use macros::Macros;
pub use reply::{Negotiated, Reply};
pub use session::{MilterContext, MilterSession};
pub use status::{ReplyError, ReplyText, Status};
pub use watchdog::Watchdog;
pub use wire::{Decoder, Packet, WireError};
