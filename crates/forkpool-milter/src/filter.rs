//! The filter API: one trait method per stage, as libmilter's
//! `struct smfiDesc` has one callback per stage.

use std::fmt;
use std::sync::Arc;

use crate::command::Address;
use crate::consts::CHUNK_SIZE;
use crate::flags::{Actions, Protocol, Stage};
use crate::macros::Macros;
use crate::reply::Reply;
use crate::status::Status;

/// What a filter asks for at negotiation (`xxfi_flags`, the steps it
/// leaves out or answers with `SMFIS_NOREPLY`, `smfi_setsymlist`).
#[derive(Debug, Clone, Default)]
pub struct FilterOptions {
    /// Modifications it may make at end of message. The conversation ends
    /// if the MTA does not offer them all, as with libmilter.
    pub actions: Actions,
    /// `NO_*` steps it does not want to see, `NR_*` steps it never answers,
    /// `SKIP`, `HEADER_LEADING_SPACE`. Bits the MTA does not offer are
    /// dropped: the step is sent anyway, and answered with continue.
    pub protocol: Protocol,
    /// Macros wanted per stage (space-separated names), sent if the MTA
    /// offers `SMFIF_SETSYMLIST`.
    pub macros: Vec<(Stage, String)>,
}

/// What a hook sees besides its arguments: the macros of this connection
/// and message, and what was negotiated.
#[derive(Debug)]
pub struct Context<'a> {
    /// Macro values (`smfi_getsymval`).
    pub macros: &'a Macros,
    /// The actions agreed with the MTA.
    pub actions: Actions,
    /// The protocol steps agreed with the MTA.
    pub protocol: Protocol,
}

/// A modification the MTA was not asked to allow at negotiation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotNegotiated(pub Actions);

impl fmt::Display for NotNegotiated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} was not negotiated: add it to FilterOptions::actions",
            self.0
        )
    }
}

impl std::error::Error for NotNegotiated {}

/// The modifications made at end of message (libmilter's `smfi_addheader`,
/// `smfi_chgfrom`, `smfi_replacebody`, ...), sent before the final reply.
#[derive(Debug)]
pub struct EomActions {
    allowed: Actions,
    replies: Vec<Reply>,
}

impl EomActions {
    /// An empty list of modifications, allowing `allowed`.
    pub fn new(allowed: Actions) -> EomActions {
        EomActions {
            allowed,
            replies: Vec::new(),
        }
    }

    /// The modifications, in the order they were made.
    pub fn into_replies(self) -> Vec<Reply> {
        self.replies
    }

    fn push(&mut self, needs: Actions, reply: Reply) -> Result<(), NotNegotiated> {
        if !self.allowed.contains(needs) {
            return Err(NotNegotiated(needs));
        }
        self.replies.push(reply);
        Ok(())
    }

    /// Adds a header at the end (`smfi_addheader`).
    pub fn add_header(&mut self, name: &str, value: &str) -> Result<(), NotNegotiated> {
        self.push(
            Actions::ADD_HEADERS,
            Reply::AddHeader {
                name: name.into(),
                value: value.into(),
            },
        )
    }

    /// Inserts a header at `index`, 0 being the top (`smfi_insheader`).
    pub fn insert_header(
        &mut self,
        index: u32,
        name: &str,
        value: &str,
    ) -> Result<(), NotNegotiated> {
        self.push(
            Actions::ADD_HEADERS,
            Reply::InsertHeader {
                index,
                name: name.into(),
                value: value.into(),
            },
        )
    }

    /// Changes the `index`-th header called `name` (from 1); an empty value
    /// deletes it (`smfi_chgheader`).
    pub fn change_header(
        &mut self,
        index: u32,
        name: &str,
        value: &str,
    ) -> Result<(), NotNegotiated> {
        self.push(
            Actions::CHANGE_HEADERS,
            Reply::ChangeHeader {
                index,
                name: name.into(),
                value: value.into(),
            },
        )
    }

    /// Changes the envelope sender (`smfi_chgfrom`).
    pub fn change_from(&mut self, sender: &str, args: Option<&str>) -> Result<(), NotNegotiated> {
        self.push(
            Actions::CHANGE_FROM,
            Reply::ChangeFrom {
                sender: sender.into(),
                args: args.map(Into::into),
            },
        )
    }

    /// Adds a recipient (`smfi_addrcpt`).
    pub fn add_rcpt(&mut self, recipient: &str) -> Result<(), NotNegotiated> {
        self.push(Actions::ADD_RCPT, Reply::AddRcpt(recipient.into()))
    }

    /// Adds a recipient with ESMTP arguments (`smfi_addrcpt_par`).
    pub fn add_rcpt_par(
        &mut self,
        recipient: &str,
        args: Option<&str>,
    ) -> Result<(), NotNegotiated> {
        self.push(
            Actions::ADD_RCPT_PAR,
            Reply::AddRcptPar {
                recipient: recipient.into(),
                args: args.map(Into::into),
            },
        )
    }

    /// Deletes a recipient (`smfi_delrcpt`).
    pub fn delete_rcpt(&mut self, recipient: &str) -> Result<(), NotNegotiated> {
        self.push(Actions::DELETE_RCPT, Reply::DeleteRcpt(recipient.into()))
    }

    /// Replaces the body, sent in chunks of at most 64 KiB
    /// (`smfi_replacebody`; call again to append).
    pub fn replace_body(&mut self, body: &[u8]) -> Result<(), NotNegotiated> {
        if !self.allowed.contains(Actions::CHANGE_BODY) {
            return Err(NotNegotiated(Actions::CHANGE_BODY));
        }
        for chunk in body.chunks(CHUNK_SIZE) {
            self.replies.push(Reply::ReplaceBody(chunk.to_vec()));
        }
        Ok(())
    }

    /// Quarantines the message with a reason (`smfi_quarantine`).
    pub fn quarantine(&mut self, reason: &str) -> Result<(), NotNegotiated> {
        self.push(Actions::QUARANTINE, Reply::Quarantine(reason.into()))
    }
}

/// A mail filter: one value per conversation (the MTA's connection), built
/// by [`Filter::new`] from what every conversation of a process shares.
///
/// Each method is one stage, called when the MTA's command arrives, with
/// `&mut self` as the conversation's own state (libmilter keeps it behind
/// `smfi_getpriv`). Every method has a default that continues, so a filter
/// writes only the stages it cares about; [`Filter::options`] should then
/// leave out the others (`NO_*`) to save the MTA the round trips.
///
/// Hooks run on the session pool's worker threads: one that blocks keeps
/// one worker busy (see the crate docs on deadlines).
pub trait Filter: Send + Sized + 'static {
    /// What every conversation of one process shares: settings, compiled
    /// rules, counters. `()` when nothing.
    type Shared: Send + Sync + 'static;

    /// The state of a new conversation (and of each new SMTP session on
    /// the same connection after `SMFIC_QUIT_NC`).
    fn new(shared: &Arc<Self::Shared>) -> Self;

    /// What to ask for at negotiation.
    fn options(shared: &Self::Shared) -> FilterOptions {
        let _ = shared;
        FilterOptions::default()
    }

    /// `xxfi_connect`.
    fn connect(&mut self, ctx: &Context<'_>, hostname: &[u8], address: &Address) -> Status {
        let _ = (ctx, hostname, address);
        Status::Continue
    }

    /// `xxfi_helo`.
    fn helo(&mut self, ctx: &Context<'_>, name: &[u8]) -> Status {
        let _ = (ctx, name);
        Status::Continue
    }

    /// `xxfi_envfrom`: the sender and its ESMTP arguments.
    fn mail(&mut self, ctx: &Context<'_>, sender: &[u8], args: &[Vec<u8>]) -> Status {
        let _ = (ctx, sender, args);
        Status::Continue
    }

    /// `xxfi_envrcpt`: one recipient and its ESMTP arguments.
    fn rcpt(&mut self, ctx: &Context<'_>, recipient: &[u8], args: &[Vec<u8>]) -> Status {
        let _ = (ctx, recipient, args);
        Status::Continue
    }

    /// `xxfi_data`.
    fn data(&mut self, ctx: &Context<'_>) -> Status {
        let _ = ctx;
        Status::Continue
    }

    /// `xxfi_header`: one header.
    fn header(&mut self, ctx: &Context<'_>, name: &[u8], value: &[u8]) -> Status {
        let _ = (ctx, name, value);
        Status::Continue
    }

    /// `xxfi_eoh`.
    fn eoh(&mut self, ctx: &Context<'_>) -> Status {
        let _ = ctx;
        Status::Continue
    }

    /// `xxfi_body`: one chunk. [`Status::Skip`] skips the rest.
    fn body(&mut self, ctx: &Context<'_>, chunk: &[u8]) -> Status {
        let _ = (ctx, chunk);
        Status::Continue
    }

    /// `xxfi_eom`: the message is complete; make modifications in
    /// `actions`, then answer.
    fn eom(&mut self, ctx: &Context<'_>, actions: &mut EomActions) -> Status {
        let _ = (ctx, actions);
        Status::Continue
    }

    /// `xxfi_abort`: the current message is abandoned; another may follow.
    fn abort(&mut self, ctx: &Context<'_>) {
        let _ = ctx;
    }

    /// `xxfi_close`: the SMTP session is over.
    fn close(&mut self, ctx: &Context<'_>) {
        let _ = ctx;
    }

    /// `xxfi_unknown`: an SMTP command the MTA did not know.
    fn unknown(&mut self, ctx: &Context<'_>, command: &[u8]) -> Status {
        let _ = (ctx, command);
        Status::Continue
    }
}
