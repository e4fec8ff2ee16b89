//! What the filter sends (`SMFIR_*`), encoded and decoded. A filter
//! encodes these; a test client or load generator decodes them.

use crate::command::OptNeg;
use crate::consts::reply as r;
use crate::flags::{Actions, Protocol, Stage};
use crate::wire::{encode_packet, put_string, Fields, Packet, WireError};

/// The filter's answer to `SMFIC_OPTNEG`: what it wants, and which macros
/// it wants at which stage (`smfi_setsymlist`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// Version, actions and protocol steps.
    pub options: OptNeg,
    /// Per stage, the macro names wanted, space-separated (`{auth_authen} i`).
    pub macros: Vec<(Stage, Vec<u8>)>,
}

/// One packet from the filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `O`: the negotiation reply.
    Negotiate(Negotiated),
    /// `c`: go on.
    Continue,
    /// `a`: accept; no more commands for this message (or connection).
    Accept,
    /// `r`: reject with the MTA's 5xx.
    Reject,
    /// `t`: fail temporarily with the MTA's 4xx.
    Tempfail,
    /// `d`: accept and silently throw away.
    Discard,
    /// `s`: skip the rest of the body (`SMFIP_SKIP`).
    Skip,
    /// `p`: still working; the MTA restarts its timeout.
    Progress,
    /// `4`: 421, end the SMTP session.
    Shutdown,
    /// `f`: make the connection fail.
    ConnectionFail,
    /// `y`: an SMTP reply with code and text (several lines joined with
    /// CRLF, each `ddd-` but the last `ddd `).
    ReplyCode(Vec<u8>),
    /// `h`: add a header at the end.
    AddHeader {
        /// Name.
        name: Vec<u8>,
        /// Value.
        value: Vec<u8>,
    },
    /// `i`: insert a header at `index` (0 is the top).
    InsertHeader {
        /// Position among the headers.
        index: u32,
        /// Name.
        name: Vec<u8>,
        /// Value.
        value: Vec<u8>,
    },
    /// `m`: change the `index`-th (from 1) header called `name`; an empty
    /// value deletes it.
    ChangeHeader {
        /// Which occurrence, from 1.
        index: u32,
        /// Name.
        name: Vec<u8>,
        /// New value.
        value: Vec<u8>,
    },
    /// `e`: change the envelope sender.
    ChangeFrom {
        /// The new sender.
        sender: Vec<u8>,
        /// ESMTP arguments, space-separated.
        args: Option<Vec<u8>>,
    },
    /// `+`: add a recipient.
    AddRcpt(Vec<u8>),
    /// `2`: add a recipient with ESMTP arguments.
    AddRcptPar {
        /// The recipient.
        recipient: Vec<u8>,
        /// ESMTP arguments, space-separated.
        args: Option<Vec<u8>>,
    },
    /// `-`: delete a recipient.
    DeleteRcpt(Vec<u8>),
    /// `b`: a chunk of the new body (chunks sent in order replace the body).
    ReplaceBody(Vec<u8>),
    /// `q`: quarantine the message, with a reason.
    Quarantine(Vec<u8>),
}

impl Reply {
    /// The reply byte.
    pub fn code(&self) -> u8 {
        match self {
            Reply::Negotiate(_) => r::OPTNEG,
            Reply::Continue => r::CONTINUE,
            Reply::Accept => r::ACCEPT,
            Reply::Reject => r::REJECT,
            Reply::Tempfail => r::TEMPFAIL,
            Reply::Discard => r::DISCARD,
            Reply::Skip => r::SKIP,
            Reply::Progress => r::PROGRESS,
            Reply::Shutdown => r::SHUTDOWN,
            Reply::ConnectionFail => r::CONN_FAIL,
            Reply::ReplyCode(_) => r::REPLYCODE,
            Reply::AddHeader { .. } => r::ADDHEADER,
            Reply::InsertHeader { .. } => r::INSHEADER,
            Reply::ChangeHeader { .. } => r::CHGHEADER,
            Reply::ChangeFrom { .. } => r::CHGFROM,
            Reply::AddRcpt(_) => r::ADDRCPT,
            Reply::AddRcptPar { .. } => r::ADDRCPT_PAR,
            Reply::DeleteRcpt(_) => r::DELRCPT,
            Reply::ReplaceBody(_) => r::REPLBODY,
            Reply::Quarantine(_) => r::QUARANTINE,
        }
    }

    /// Whether this reply ends the MTA's wait for the current command
    /// (a modification or progress does not).
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            Reply::Negotiate(_)
                | Reply::Continue
                | Reply::Accept
                | Reply::Reject
                | Reply::Tempfail
                | Reply::Discard
                | Reply::Skip
                | Reply::Shutdown
                | Reply::ConnectionFail
                | Reply::ReplyCode(_)
        )
    }

    /// Appends the packet for this reply to `out` (the filter's side).
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        let mut d = Vec::new();
        match self {
            Reply::Negotiate(neg) => {
                d.extend_from_slice(&neg.options.version.to_be_bytes());
                d.extend_from_slice(&neg.options.actions.bits().to_be_bytes());
                d.extend_from_slice(&neg.options.protocol.bits().to_be_bytes());
                for (stage, names) in &neg.macros {
                    d.extend_from_slice(&stage.code().to_be_bytes());
                    put_string(&mut d, names, "macro list")?;
                }
            }
            Reply::ReplyCode(text) => put_string(&mut d, text, "reply text")?,
            Reply::AddHeader { name, value } => {
                put_string(&mut d, name, "header name")?;
                put_string(&mut d, value, "header value")?;
            }
            Reply::InsertHeader { index, name, value }
            | Reply::ChangeHeader { index, name, value } => {
                d.extend_from_slice(&index.to_be_bytes());
                put_string(&mut d, name, "header name")?;
                put_string(&mut d, value, "header value")?;
            }
            Reply::ChangeFrom { sender: a, args } | Reply::AddRcptPar { recipient: a, args } => {
                put_string(&mut d, a, "address")?;
                if let Some(args) = args {
                    put_string(&mut d, args, "ESMTP arguments")?;
                }
            }
            Reply::AddRcpt(a) | Reply::DeleteRcpt(a) => put_string(&mut d, a, "recipient")?,
            Reply::Quarantine(reason) => put_string(&mut d, reason, "quarantine reason")?,
            Reply::ReplaceBody(chunk) => d.extend_from_slice(chunk),
            Reply::Continue
            | Reply::Accept
            | Reply::Reject
            | Reply::Tempfail
            | Reply::Discard
            | Reply::Skip
            | Reply::Progress
            | Reply::Shutdown
            | Reply::ConnectionFail => {}
        }
        encode_packet(self.code(), &d, out);
        Ok(())
    }

    /// Decodes one packet from a filter (the MTA's side).
    pub fn decode(packet: &Packet) -> Result<Reply, WireError> {
        let code = packet.code;
        let mut f = Fields::new(code, &packet.data);
        let reply = match code {
            r::OPTNEG => {
                let options = OptNeg {
                    version: f.u32("version")?,
                    actions: Actions(f.u32("actions")?),
                    protocol: Protocol(f.u32("protocol")?),
                };
                let mut macros = Vec::new();
                while !f.is_empty() {
                    let stage =
                        Stage::from_code(f.u32("macro stage")?).ok_or(WireError::Invalid {
                            code,
                            what: "unknown macro stage",
                        })?;
                    macros.push((stage, f.string("macro list")?));
                }
                Reply::Negotiate(Negotiated { options, macros })
            }
            r::CONTINUE => Reply::Continue,
            r::ACCEPT => Reply::Accept,
            r::REJECT => Reply::Reject,
            r::TEMPFAIL => Reply::Tempfail,
            r::DISCARD => Reply::Discard,
            r::SKIP => Reply::Skip,
            r::PROGRESS => Reply::Progress,
            r::SHUTDOWN => Reply::Shutdown,
            r::CONN_FAIL => Reply::ConnectionFail,
            r::REPLYCODE => Reply::ReplyCode(f.string("reply text")?),
            r::ADDHEADER => Reply::AddHeader {
                name: f.string("header name")?,
                value: f.string("header value")?,
            },
            r::INSHEADER | r::CHGHEADER => {
                let index = f.u32("index")?;
                let name = f.string("header name")?;
                let value = f.string("header value")?;
                if code == r::INSHEADER {
                    Reply::InsertHeader { index, name, value }
                } else {
                    Reply::ChangeHeader { index, name, value }
                }
            }
            r::CHGFROM | r::ADDRCPT_PAR => {
                let a = f.string("address")?;
                let args = if f.is_empty() {
                    None
                } else {
                    Some(f.string("ESMTP arguments")?)
                };
                if code == r::CHGFROM {
                    Reply::ChangeFrom { sender: a, args }
                } else {
                    Reply::AddRcptPar { recipient: a, args }
                }
            }
            r::ADDRCPT => Reply::AddRcpt(f.string("recipient")?),
            r::DELRCPT => Reply::DeleteRcpt(f.string("recipient")?),
            r::REPLBODY => Reply::ReplaceBody(f.rest()),
            r::QUARANTINE => Reply::Quarantine(f.string("quarantine reason")?),
            other => return Err(WireError::UnknownCode(other)),
        };
        f.end()?;
        Ok(reply)
    }
}
