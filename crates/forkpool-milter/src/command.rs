//! What the MTA sends (`SMFIC_*`), decoded and encoded. A filter decodes
//! these; a test client or load generator encodes them.

use crate::consts::{cmd, family};
use crate::flags::{Actions, Protocol};
use crate::wire::{encode_packet, put_string, Fields, Packet, WireError};

/// Both sides' offer at `SMFIC_OPTNEG`: the MTA's (what it can do) in a
/// [`Command::OptNeg`], the filter's (what it wants) in its reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptNeg {
    /// The protocol version.
    pub version: u32,
    /// The modifications offered or wanted.
    pub actions: Actions,
    /// The steps left out and not replied to.
    pub protocol: Protocol,
}

/// The SMTP client's address, as the MTA sends it at connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// No address (`SMFIA_UNKNOWN`), as for mail submitted locally.
    Unknown,
    /// A Unix socket's path (`SMFIA_UNIX`).
    Unix(Vec<u8>),
    /// IPv4 (`SMFIA_INET`): the port and the address as text.
    Inet {
        /// The client's port.
        port: u16,
        /// The address as text (`192.0.2.1`).
        address: Vec<u8>,
    },
    /// IPv6 (`SMFIA_INET6`): the port and the address as text.
    Inet6 {
        /// The client's port.
        port: u16,
        /// The address as text (`2001:db8::1`, sometimes `IPv6:`-prefixed).
        address: Vec<u8>,
    },
}

/// One command from the MTA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `O`: the MTA's offer; the first command of every conversation.
    OptNeg(OptNeg),
    /// `D`: macro values for the command `stage` that follows.
    Macros {
        /// The command byte the macros belong to (`C`, `H`, `M`, ...).
        stage: u8,
        /// Name and value pairs (`{client_addr}`, `i`, ...).
        pairs: Vec<(Vec<u8>, Vec<u8>)>,
    },
    /// `C`: a new SMTP client.
    Connect {
        /// The client's host name (or `[address]`).
        hostname: Vec<u8>,
        /// Its address.
        address: Address,
    },
    /// `H`: HELO or EHLO.
    Helo(Vec<u8>),
    /// `M`: MAIL FROM, with ESMTP arguments.
    Mail {
        /// The sender, as sent (`<a@example.org>`).
        sender: Vec<u8>,
        /// ESMTP arguments (`SIZE=1000`).
        args: Vec<Vec<u8>>,
    },
    /// `R`: RCPT TO, with ESMTP arguments.
    Rcpt {
        /// The recipient, as sent.
        recipient: Vec<u8>,
        /// ESMTP arguments.
        args: Vec<Vec<u8>>,
    },
    /// `T`: DATA.
    Data,
    /// `L`: one header.
    Header {
        /// Its name.
        name: Vec<u8>,
        /// Its value (with the leading space if `SMFIP_HDR_LEADSPC`).
        value: Vec<u8>,
    },
    /// `N`: end of headers.
    Eoh,
    /// `B`: a chunk of the body.
    Body(Vec<u8>),
    /// `E`: end of message, possibly with a last body chunk.
    Eom(Vec<u8>),
    /// `A`: forget the current message; another may follow.
    Abort,
    /// `Q`: the conversation is over.
    Quit,
    /// `K`: this SMTP session is over, a new one follows on this connection.
    QuitNewConnection,
    /// `U`: an SMTP command the MTA does not know.
    Unknown(Vec<u8>),
}

impl Command {
    /// The command byte.
    pub fn code(&self) -> u8 {
        match self {
            Command::OptNeg(_) => cmd::OPTNEG,
            Command::Macros { .. } => cmd::MACRO,
            Command::Connect { .. } => cmd::CONNECT,
            Command::Helo(_) => cmd::HELO,
            Command::Mail { .. } => cmd::MAIL,
            Command::Rcpt { .. } => cmd::RCPT,
            Command::Data => cmd::DATA,
            Command::Header { .. } => cmd::HEADER,
            Command::Eoh => cmd::EOH,
            Command::Body(_) => cmd::BODY,
            Command::Eom(_) => cmd::BODYEOB,
            Command::Abort => cmd::ABORT,
            Command::Quit => cmd::QUIT,
            Command::QuitNewConnection => cmd::QUIT_NC,
            Command::Unknown(_) => cmd::UNKNOWN,
        }
    }

    /// Decodes one packet from the MTA.
    pub fn decode(packet: &Packet) -> Result<Command, WireError> {
        let code = packet.code;
        let mut f = Fields::new(code, &packet.data);
        let command = match code {
            cmd::OPTNEG => {
                // libmilter reads the first 12 bytes and ignores any more.
                let neg = OptNeg {
                    version: f.u32("version")?,
                    actions: Actions(f.u32("actions")?),
                    protocol: Protocol(f.u32("protocol")?),
                };
                f.rest();
                Command::OptNeg(neg)
            }
            cmd::MACRO => {
                let stage = f.byte("stage")?;
                let mut pairs = Vec::new();
                while !f.is_empty() {
                    let name = f.string("macro name")?;
                    let value = f.string("macro value")?;
                    pairs.push((name, value));
                }
                Command::Macros { stage, pairs }
            }
            cmd::CONNECT => {
                let hostname = f.string("hostname")?;
                let address = match f.byte("family")? {
                    family::UNKNOWN => Address::Unknown,
                    fam @ (family::UNIX | family::INET | family::INET6) => {
                        let port = f.u16("port")?;
                        let address = f.string("address")?;
                        match fam {
                            family::UNIX => Address::Unix(address),
                            family::INET => Address::Inet { port, address },
                            _ => Address::Inet6 { port, address },
                        }
                    }
                    _ => {
                        return Err(WireError::Invalid {
                            code,
                            what: "unknown address family",
                        })
                    }
                };
                Command::Connect { hostname, address }
            }
            cmd::HELO => Command::Helo(f.string("HELO name")?),
            cmd::MAIL | cmd::RCPT => {
                let first = f.string("address")?;
                let mut args = Vec::new();
                while !f.is_empty() {
                    args.push(f.string("ESMTP argument")?);
                }
                if code == cmd::MAIL {
                    Command::Mail {
                        sender: first,
                        args,
                    }
                } else {
                    Command::Rcpt {
                        recipient: first,
                        args,
                    }
                }
            }
            cmd::DATA => Command::Data,
            cmd::HEADER => Command::Header {
                name: f.string("header name")?,
                value: f.string("header value")?,
            },
            cmd::EOH => Command::Eoh,
            cmd::BODY => Command::Body(f.rest()),
            cmd::BODYEOB => Command::Eom(f.rest()),
            cmd::ABORT => Command::Abort,
            cmd::QUIT => Command::Quit,
            cmd::QUIT_NC => Command::QuitNewConnection,
            cmd::UNKNOWN => Command::Unknown(f.string("command")?),
            other => return Err(WireError::UnknownCode(other)),
        };
        f.end()?;
        Ok(command)
    }

    /// Appends the packet for this command to `out` (the MTA's side).
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        let mut d = Vec::new();
        match self {
            Command::OptNeg(neg) => {
                d.extend_from_slice(&neg.version.to_be_bytes());
                d.extend_from_slice(&neg.actions.bits().to_be_bytes());
                d.extend_from_slice(&neg.protocol.bits().to_be_bytes());
            }
            Command::Macros { stage, pairs } => {
                d.push(*stage);
                for (name, value) in pairs {
                    put_string(&mut d, name, "macro name")?;
                    put_string(&mut d, value, "macro value")?;
                }
            }
            Command::Connect { hostname, address } => {
                put_string(&mut d, hostname, "hostname")?;
                let (fam, port, addr) = match address {
                    Address::Unknown => (family::UNKNOWN, 0, None),
                    Address::Unix(path) => (family::UNIX, 0, Some(path)),
                    Address::Inet { port, address } => (family::INET, *port, Some(address)),
                    Address::Inet6 { port, address } => (family::INET6, *port, Some(address)),
                };
                d.push(fam);
                if let Some(addr) = addr {
                    d.extend_from_slice(&port.to_be_bytes());
                    put_string(&mut d, addr, "address")?;
                }
            }
            Command::Helo(name) => put_string(&mut d, name, "HELO name")?,
            Command::Mail { sender: a, args } | Command::Rcpt { recipient: a, args } => {
                put_string(&mut d, a, "address")?;
                for arg in args {
                    put_string(&mut d, arg, "ESMTP argument")?;
                }
            }
            Command::Header { name, value } => {
                put_string(&mut d, name, "header name")?;
                put_string(&mut d, value, "header value")?;
            }
            Command::Unknown(line) => put_string(&mut d, line, "command")?,
            Command::Body(chunk) | Command::Eom(chunk) => d.extend_from_slice(chunk),
            Command::Data
            | Command::Eoh
            | Command::Abort
            | Command::Quit
            | Command::QuitNewConnection => {}
        }
        encode_packet(self.code(), &d, out);
        Ok(())
    }
}
