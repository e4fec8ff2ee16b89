//! One milter conversation, sans I/O: decoded commands in, replies out,
//! the [`Filter`]'s hooks called in between. The driver (the session-pool
//! [`MilterSession`](crate::MilterSession), or a test) does the reading
//! and writing.

use std::fmt;
use std::sync::Arc;

use crate::command::{Command, OptNeg};
use crate::consts::{cmd, VERSION};
use crate::filter::{Context, EomActions, Filter};
use crate::flags::{Actions, Protocol};
use crate::macros::Macros;
use crate::reply::{Negotiated, Reply};
use crate::status::Status;
use crate::wire::WireError;

/// Why a conversation cannot go on. Each ends this conversation only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConversationError {
    /// A packet that does not decode.
    Wire(WireError),
    /// A command before `SMFIC_OPTNEG`.
    NotNegotiated(u8),
    /// The MTA speaks a version older than 2, which had no negotiation.
    Version(u32),
    /// The filter needs modifications the MTA does not offer.
    ActionsRefused {
        /// What the filter asked for.
        wanted: Actions,
        /// What the MTA offered.
        offered: Actions,
    },
}

impl fmt::Display for ConversationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConversationError::Wire(e) => write!(f, "malformed packet: {e}"),
            ConversationError::NotNegotiated(code) => write!(
                f,
                "command '{}' before option negotiation",
                char::from(*code).escape_default()
            ),
            ConversationError::Version(v) => {
                write!(
                    f,
                    "MTA speaks milter protocol version {v}; at least 2 is needed"
                )
            }
            ConversationError::ActionsRefused { wanted, offered } => write!(
                f,
                "the filter needs {wanted:?} but the MTA offers only {offered:?}"
            ),
        }
    }
}

impl std::error::Error for ConversationError {}

impl From<WireError> for ConversationError {
    fn from(e: WireError) -> Self {
        ConversationError::Wire(e)
    }
}

/// What the driver does after a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Send the replies, then wait for the next command.
    Go,
    /// Send the replies, then close the connection (`SMFIC_QUIT`).
    Close,
}

/// The state of one conversation: the filter's own value, the macros, and
/// what was agreed at negotiation.
pub struct Conversation<F: Filter> {
    shared: Arc<F::Shared>,
    filter: F,
    macros: Macros,
    agreed: Option<OptNeg>,
    in_message: bool,
    session_open: bool,
    owes_reply: bool,
}

impl<F: Filter> fmt::Debug for Conversation<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Conversation")
            .field("agreed", &self.agreed)
            .field("in_message", &self.in_message)
            .field("owes_reply", &self.owes_reply)
            .finish_non_exhaustive()
    }
}

/// The no-reply bit of the step a command starts, if it has one.
fn no_reply_bit(code: u8) -> Option<Protocol> {
    Some(match code {
        cmd::CONNECT => Protocol::NR_CONNECT,
        cmd::HELO => Protocol::NR_HELO,
        cmd::MAIL => Protocol::NR_MAIL,
        cmd::RCPT => Protocol::NR_RCPT,
        cmd::DATA => Protocol::NR_DATA,
        cmd::HEADER => Protocol::NR_HEADER,
        cmd::EOH => Protocol::NR_EOH,
        cmd::BODY => Protocol::NR_BODY,
        cmd::UNKNOWN => Protocol::NR_UNKNOWN,
        _ => return None,
    })
}

impl<F: Filter> Conversation<F> {
    /// A new conversation, before negotiation.
    pub fn new(shared: Arc<F::Shared>) -> Self {
        let filter = F::new(&shared);
        Conversation {
            shared,
            filter,
            macros: Macros::default(),
            agreed: None,
            in_message: false,
            session_open: false,
            owes_reply: false,
        }
    }

    /// What was agreed at negotiation, once it happened.
    pub fn agreed(&self) -> Option<&OptNeg> {
        self.agreed.as_ref()
    }

    /// Whether the MTA waits for a reply to the command being handled. Set
    /// before a hook runs and cleared once its reply is out, so after a
    /// hook panicked it says whether the MTA should get a tempfail.
    pub fn owes_reply(&self) -> bool {
        self.owes_reply
    }

    /// The filter's own state.
    pub fn filter(&self) -> &F {
        &self.filter
    }

    /// Whether the MTA will wait for an answer to `command`: not for
    /// macros, abort and quit, nor for a step negotiated as no-reply.
    pub fn expects_reply(&self, command: &Command) -> bool {
        let Some(agreed) = &self.agreed else {
            return matches!(command, Command::OptNeg(_));
        };
        let silent = no_reply_bit(command.code()).is_some_and(|bit| agreed.protocol.contains(bit));
        !silent
            && !matches!(
                command,
                Command::Macros { .. }
                    | Command::Abort
                    | Command::Quit
                    | Command::QuitNewConnection
            )
    }

    /// Handles one command, appending the replies to send to `out`.
    pub fn handle(
        &mut self,
        command: Command,
        out: &mut Vec<Reply>,
    ) -> Result<Flow, ConversationError> {
        let code = command.code();
        let agreed = match (&command, &self.agreed) {
            (Command::OptNeg(offer), _) => {
                out.push(self.negotiate(offer)?);
                return Ok(Flow::Go);
            }
            (_, None) => return Err(ConversationError::NotNegotiated(code)),
            (_, Some(agreed)) => agreed.clone(),
        };
        let silent = no_reply_bit(code).is_some_and(|bit| agreed.protocol.contains(bit));
        self.owes_reply = self.expects_reply(&command);
        let ctx = Context {
            macros: &self.macros,
            actions: agreed.actions,
            protocol: agreed.protocol,
        };
        let f = &mut self.filter;
        let status = match command {
            Command::OptNeg(_) => unreachable!("handled above"),
            Command::Macros { stage, pairs } => {
                self.macros.set(stage, pairs);
                return Ok(Flow::Go);
            }
            Command::Connect { hostname, address } => f.connect(&ctx, &hostname, &address),
            Command::Helo(name) => f.helo(&ctx, &name),
            Command::Mail { sender, args } => {
                self.in_message = true;
                f.mail(&ctx, &sender, &args)
            }
            Command::Rcpt { recipient, args } => f.rcpt(&ctx, &recipient, &args),
            Command::Data => f.data(&ctx),
            Command::Header { name, value } => f.header(&ctx, &name, &value),
            Command::Eoh => f.eoh(&ctx),
            Command::Body(chunk) => match f.body(&ctx, &chunk) {
                Status::Skip if !agreed.protocol.contains(Protocol::SKIP) => Status::Continue,
                status => status,
            },
            Command::Eom(chunk) => {
                // A last chunk may come with the end of message.
                let mut status = Status::Continue;
                if !chunk.is_empty() && !agreed.protocol.contains(Protocol::NO_BODY) {
                    status = f.body(&ctx, &chunk);
                }
                if matches!(status, Status::Continue | Status::Skip) {
                    let mut actions = EomActions::new(agreed.actions);
                    status = f.eom(&ctx, &mut actions);
                    out.extend(actions.into_replies());
                }
                self.in_message = false;
                self.macros.clear_message();
                match status {
                    Status::Skip => Status::Continue,
                    status => status,
                }
            }
            Command::Abort => {
                if self.in_message {
                    f.abort(&ctx);
                }
                self.in_message = false;
                self.macros.clear_message();
                return Ok(Flow::Go);
            }
            Command::Unknown(line) => f.unknown(&ctx, &line),
            Command::Quit => {
                self.end_session();
                return Ok(Flow::Close);
            }
            Command::QuitNewConnection => {
                self.end_session();
                self.filter = F::new(&self.shared);
                self.session_open = true;
                return Ok(Flow::Go);
            }
        };
        if silent {
            if status != Status::Continue {
                tracing::warn!(
                    command = %char::from(code),
                    ?status,
                    "a hook answered a step negotiated as no-reply; nothing was sent"
                );
            }
        } else {
            out.push(match status {
                Status::Skip if code != cmd::BODY => Reply::Continue,
                status => status.to_reply(),
            });
        }
        self.owes_reply = false;
        Ok(Flow::Go)
    }

    /// Ends the SMTP session: the filter's abort (if a message was open)
    /// and close hooks, at most once per session. The driver calls this
    /// when the connection ends, whether or not `SMFIC_QUIT` came first.
    pub fn end_session(&mut self) {
        let agreed = self.agreed.clone().unwrap_or(OptNeg {
            version: VERSION,
            actions: Actions::NONE,
            protocol: Protocol::NONE,
        });
        let ctx = Context {
            macros: &self.macros,
            actions: agreed.actions,
            protocol: agreed.protocol,
        };
        if self.in_message {
            self.filter.abort(&ctx);
            self.in_message = false;
        }
        if self.session_open {
            self.filter.close(&ctx);
        }
        self.session_open = false;
        self.macros.clear();
        self.owes_reply = false;
    }

    fn negotiate(&mut self, offer: &OptNeg) -> Result<Reply, ConversationError> {
        if offer.version < 2 {
            return Err(ConversationError::Version(offer.version));
        }
        let wanted = F::options(&self.shared);
        if !offer.actions.contains(wanted.actions) {
            return Err(ConversationError::ActionsRefused {
                wanted: wanted.actions,
                offered: offer.actions,
            });
        }
        let mut actions = wanted.actions;
        let macros = if offer.actions.contains(Actions::SET_SYMLIST) && !wanted.macros.is_empty() {
            actions |= Actions::SET_SYMLIST;
            wanted
                .macros
                .iter()
                .map(|(stage, names)| (*stage, names.as_bytes().to_vec()))
                .collect()
        } else {
            Vec::new()
        };
        let options = OptNeg {
            version: offer.version.min(VERSION),
            actions,
            protocol: wanted.protocol & offer.protocol,
        };
        self.agreed = Some(options.clone());
        self.session_open = true;
        Ok(Reply::Negotiate(Negotiated { options, macros }))
    }
}
