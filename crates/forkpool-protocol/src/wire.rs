//! The back-channel wire format between the supervisor and each child.
//!
//! The channel is an `AF_UNIX` `SOCK_SEQPACKET` socketpair, so one message is
//! one datagram: there is no framing to get wrong and no partial read. Every
//! message starts with two bytes, the protocol version and a one-letter kind,
//! followed by a fixed-size payload in network byte order. Fixed sizes make a
//! worker in any language a few lines of `struct.pack` away.
//!
//! This module only encodes and decodes; it performs no I/O. Anything that is
//! not exactly one of the messages below decodes to a [`ProtocolError`], never
//! a panic: the supervisor kills a child that sends one and carries on.
//! `docs/protocol.md` is the language-neutral description of the same format.

use std::fmt;

/// The protocol version carried in the first byte of every message.
pub const VERSION: u8 = 1;

/// The largest encoded message, in bytes. A datagram longer than this is
/// malformed whatever it starts with.
pub const MAX_MESSAGE_LEN: usize = 18;

/// A message from a child to the supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildMessage {
    /// The child has started and waits for work. Sent once, first.
    Ready {
        /// The child's process id, so the supervisor can check who speaks.
        pid: u32,
    },
    /// The child has started, and keeps its own record on the scoreboard
    /// (`kernel` dispatch only): `Ready` for a child that serves its own
    /// socket and says idle and busy there instead of in messages. Sent
    /// once, first, in place of `Ready`.
    ReadyOnBoard {
        /// The child's process id, as in `Ready`.
        pid: u32,
    },
    /// `Ready` for a `kernel` dispatch child that serves its own socket but
    /// cannot keep its record on the scoreboard (no shared memory or
    /// atomics): it says busy and idle in messages (`B`, `N`, `I`), and the
    /// parent moves its record for it. Sent once, first, in place of
    /// `Ready`.
    ReadyByMessages {
        /// The child's process id, as in `Ready`.
        pid: u32,
    },
    /// The child finished its connection (or was never busy) and waits again.
    Idle,
    /// The child accepted a connection itself (`order` and `shared` dispatch).
    Busy,
    /// The child finished its connection and, finding another one waiting
    /// in the listener's backlog, accepted it at once (`handoff` dispatch,
    /// forked children): `Idle` and a new connection in one message. It is
    /// still busy; the new connection's busy clock starts now.
    Next,
    /// The child is leaving on purpose (its program asked to be recycled):
    /// its connection, if it had one, is over, and it exits now. The
    /// supervisor sends it nothing more and counts it as retired, not died.
    Leaving,
    /// The child was woken or ordered to accept but found no connection
    /// waiting: a futile wake-up, counted by the supervisor.
    Missed,
    /// The answer to [`ParentMessage::Ping`], carrying the same sequence number.
    Pong {
        /// The sequence number of the ping being answered.
        seq: u32,
    },
    /// A many-connection child's current load, sent whenever it changes.
    ///
    /// `received` lets the supervisor tell which of the connections it
    /// handed out the report already counts: the ones still travelling
    /// (`handed - received`) are added to `open`, so a report that crossed
    /// a handoff never makes a child look emptier than it is.
    Load {
        /// Connections the child holds open now.
        open: u32,
        /// Connections the child is willing to hold at most.
        capacity: u32,
        /// Connections the child has received from the supervisor so far,
        /// a running count that wraps at 2^32.
        received: u32,
        /// Connections a worker thread is running a step of right now (0
        /// from a child that sends the older, 14-byte form without it).
        running: u32,
    },
}

/// A message from the supervisor to a child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParentMessage {
    /// Serve the connection whose descriptor travels with this message as
    /// `SCM_RIGHTS` ancillary data (`handoff` dispatch).
    Connection {
        /// Index of the listener the connection arrived on.
        listener: u16,
    },
    /// Accept one connection from the inherited listener with this index
    /// (`order` dispatch).
    Accept {
        /// Index of the listener to accept from.
        listener: u16,
    },
    /// Liveness check: answer with [`ChildMessage::Pong`] and the same `seq`.
    Ping {
        /// Sequence number to echo back.
        seq: u32,
    },
    /// Finish the current connection, if any, then exit with status 0.
    Quit,
}

/// Why a datagram is not a valid message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    /// A zero-length datagram.
    Empty,
    /// The first byte names a protocol version this side does not speak.
    UnsupportedVersion(u8),
    /// The kind byte is not one this direction of the channel knows.
    UnknownKind(u8),
    /// The kind is known but the datagram has the wrong length for it.
    WrongLength {
        /// The kind byte.
        kind: u8,
        /// The length that kind must have.
        expected: usize,
        /// The length that arrived.
        got: usize,
    },
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolError::Empty => write!(f, "empty message"),
            ProtocolError::UnsupportedVersion(v) => write!(
                f,
                "protocol version {v} is not supported (this supervisor speaks version {VERSION})"
            ),
            ProtocolError::UnknownKind(k) => write!(f, "unknown message kind {}", show_kind(*k)),
            ProtocolError::WrongLength {
                kind,
                expected,
                got,
            } => write!(
                f,
                "message kind {} must be {expected} bytes long, got {got}",
                show_kind(*kind)
            ),
        }
    }
}

impl std::error::Error for ProtocolError {}

fn show_kind(kind: u8) -> String {
    if kind.is_ascii_graphic() {
        format!("'{}'", kind as char)
    } else {
        format!("0x{kind:02x}")
    }
}

/// A buffer large enough for any encoded message.
pub type MessageBuf = [u8; MAX_MESSAGE_LEN];

impl ChildMessage {
    /// Writes the message into `buf` and returns the bytes to send.
    pub fn encode(self, buf: &mut MessageBuf) -> &[u8] {
        buf[0] = VERSION;
        let len = match self {
            ChildMessage::Ready { pid } => put_u32(buf, b'R', pid),
            ChildMessage::ReadyOnBoard { pid } => put_u32(buf, b'K', pid),
            ChildMessage::ReadyByMessages { pid } => put_u32(buf, b'G', pid),
            ChildMessage::Idle => put_bare(buf, b'I'),
            ChildMessage::Busy => put_bare(buf, b'B'),
            ChildMessage::Missed => put_bare(buf, b'M'),
            ChildMessage::Next => put_bare(buf, b'N'),
            ChildMessage::Leaving => put_bare(buf, b'X'),
            ChildMessage::Pong { seq } => put_u32(buf, b'P', seq),
            ChildMessage::Load {
                open,
                capacity,
                received,
                running,
            } => {
                buf[1] = b'L';
                buf[2..6].copy_from_slice(&open.to_be_bytes());
                buf[6..10].copy_from_slice(&capacity.to_be_bytes());
                buf[10..14].copy_from_slice(&received.to_be_bytes());
                buf[14..18].copy_from_slice(&running.to_be_bytes());
                18
            }
        };
        &buf[..len]
    }

    /// Decodes one datagram received from a child.
    pub fn decode(bytes: &[u8]) -> Result<ChildMessage, ProtocolError> {
        let (kind, payload) = split_header(bytes)?;
        let msg = match kind {
            b'R' => ChildMessage::Ready {
                pid: get_u32(kind, payload)?,
            },
            b'K' => ChildMessage::ReadyOnBoard {
                pid: get_u32(kind, payload)?,
            },
            b'G' => ChildMessage::ReadyByMessages {
                pid: get_u32(kind, payload)?,
            },
            b'I' => bare(kind, payload, ChildMessage::Idle)?,
            b'B' => bare(kind, payload, ChildMessage::Busy)?,
            b'M' => bare(kind, payload, ChildMessage::Missed)?,
            b'N' => bare(kind, payload, ChildMessage::Next)?,
            b'X' => bare(kind, payload, ChildMessage::Leaving)?,
            b'P' => ChildMessage::Pong {
                seq: get_u32(kind, payload)?,
            },
            b'L' => {
                // The older form stops after `received`.
                let p: [u8; 16] = match payload.len() {
                    12 => {
                        let mut p = [0; 16];
                        p[..12].copy_from_slice(payload);
                        p
                    }
                    _ => fixed::<16>(kind, payload)?,
                };
                let word = |at: usize| u32::from_be_bytes([p[at], p[at + 1], p[at + 2], p[at + 3]]);
                ChildMessage::Load {
                    open: word(0),
                    capacity: word(4),
                    received: word(8),
                    running: word(12),
                }
            }
            other => return Err(ProtocolError::UnknownKind(other)),
        };
        Ok(msg)
    }
}

impl ParentMessage {
    /// Writes the message into `buf` and returns the bytes to send.
    pub fn encode(self, buf: &mut MessageBuf) -> &[u8] {
        buf[0] = VERSION;
        let len = match self {
            ParentMessage::Connection { listener } => put_u16(buf, b'C', listener),
            ParentMessage::Accept { listener } => put_u16(buf, b'A', listener),
            ParentMessage::Ping { seq } => put_u32(buf, b'p', seq),
            ParentMessage::Quit => put_bare(buf, b'Q'),
        };
        &buf[..len]
    }

    /// Decodes one datagram received from the supervisor.
    pub fn decode(bytes: &[u8]) -> Result<ParentMessage, ProtocolError> {
        let (kind, payload) = split_header(bytes)?;
        let msg = match kind {
            b'C' => ParentMessage::Connection {
                listener: get_u16(kind, payload)?,
            },
            b'A' => ParentMessage::Accept {
                listener: get_u16(kind, payload)?,
            },
            b'p' => ParentMessage::Ping {
                seq: get_u32(kind, payload)?,
            },
            b'Q' => bare(kind, payload, ParentMessage::Quit)?,
            other => return Err(ProtocolError::UnknownKind(other)),
        };
        Ok(msg)
    }

    /// Whether this message carries a file descriptor as ancillary data.
    pub fn carries_fd(self) -> bool {
        matches!(self, ParentMessage::Connection { .. })
    }
}

fn split_header(bytes: &[u8]) -> Result<(u8, &[u8]), ProtocolError> {
    match bytes {
        [] => Err(ProtocolError::Empty),
        [VERSION, kind, payload @ ..] => Ok((*kind, payload)),
        [VERSION] => Err(ProtocolError::WrongLength {
            kind: 0,
            expected: 2,
            got: 1,
        }),
        [version, ..] => Err(ProtocolError::UnsupportedVersion(*version)),
    }
}

fn fixed<const N: usize>(kind: u8, payload: &[u8]) -> Result<[u8; N], ProtocolError> {
    payload.try_into().map_err(|_| ProtocolError::WrongLength {
        kind,
        expected: 2 + N,
        got: 2 + payload.len(),
    })
}

fn bare<T>(kind: u8, payload: &[u8], value: T) -> Result<T, ProtocolError> {
    fixed::<0>(kind, payload).map(|_| value)
}

fn get_u16(kind: u8, payload: &[u8]) -> Result<u16, ProtocolError> {
    fixed::<2>(kind, payload).map(u16::from_be_bytes)
}

fn get_u32(kind: u8, payload: &[u8]) -> Result<u32, ProtocolError> {
    fixed::<4>(kind, payload).map(u32::from_be_bytes)
}

fn put_bare(buf: &mut MessageBuf, kind: u8) -> usize {
    buf[1] = kind;
    2
}

fn put_u16(buf: &mut MessageBuf, kind: u8, value: u16) -> usize {
    buf[1] = kind;
    buf[2..4].copy_from_slice(&value.to_be_bytes());
    4
}

fn put_u32(buf: &mut MessageBuf, kind: u8, value: u32) -> usize {
    buf[1] = kind;
    buf[2..6].copy_from_slice(&value.to_be_bytes());
    6
}

// ---------------------------------------------------------------------
// Templates (`--preload`): protocol version 2
// ---------------------------------------------------------------------

/// Protocol version 2: version 1 plus the template messages. The supervisor
/// announces it (`FORKPOOL_PROTOCOL=2`) only to a template started with
/// `--preload`; every worker forked from that template speaks version 2 on
/// its own channel, with the version byte `0x02` in every message, and may
/// be told [`WorkerOrder::BecomeTemplate`]. Exec'd workers of a pool
/// without `--preload` keep speaking version 1, unchanged.
pub const TEMPLATE_VERSION: u8 = 2;

/// A message from the supervisor to a template, on the template's channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateRequest {
    /// Fork a worker for `slot`. Exactly two descriptors travel with it as
    /// `SCM_RIGHTS` ancillary data: the worker's back-channel, then the
    /// write end of the pipe that becomes its standard error.
    Fork {
        /// The slot the new worker fills (`FORKPOOL_SLOT`).
        slot: u32,
        /// The pool generation it belongs to (`FORKPOOL_GENERATION`).
        generation: u32,
    },
    /// Liveness check: answer with [`TemplateReply::Pong`] and the same `seq`.
    Ping {
        /// Sequence number to echo back.
        seq: u32,
    },
    /// Exit with status 0. Workers already forked are not affected.
    Quit,
}

/// A message from a template (or its short-lived intermediate child) to
/// the supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateReply {
    /// The template has loaded and waits for fork orders. Sent once, first.
    Ready {
        /// The template's process id.
        pid: u32,
    },
    /// The worker for `slot` exists: `pid` is the grandchild, which the
    /// supervisor (a child subreaper) inherits.
    Forked {
        /// The slot from the [`TemplateRequest::Fork`] being answered.
        slot: u32,
        /// The new worker's process id.
        pid: u32,
    },
    /// The worker for `slot` could not be forked.
    ForkFailed {
        /// The slot from the [`TemplateRequest::Fork`] being answered.
        slot: u32,
        /// The `errno` of the failed `fork` (for example 11, `EAGAIN`).
        errno: u32,
    },
    /// The answer to [`TemplateRequest::Ping`].
    Pong {
        /// The sequence number of the ping being answered.
        seq: u32,
    },
}

/// A message from the supervisor to a worker that speaks version 2 (one
/// forked from a template): every version 1 message, plus the refork order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerOrder {
    /// A version 1 message, sent with the version byte `0x02`.
    Parent(ParentMessage),
    /// Become the pool's template (refork). One descriptor travels with it:
    /// the new template channel. The worker reads it only when idle, so its
    /// current connection is finished first.
    BecomeTemplate,
    /// `kernel` dispatch: the answer to a worker's `K`. Its slot's own
    /// listening sockets travel with it, one per pool listener in the
    /// pool's order, then the scoreboard map: `listeners + 1` descriptors.
    Seat {
        /// How many pool listeners (own sockets) come with it.
        listeners: u16,
        /// The worker's share of connections before it leaves (`X`); 0 for
        /// no limit.
        max_requests: u64,
    },
}

impl TemplateRequest {
    /// Writes the message into `buf` and returns the bytes to send.
    pub fn encode(self, buf: &mut MessageBuf) -> &[u8] {
        buf[0] = TEMPLATE_VERSION;
        let len = match self {
            TemplateRequest::Fork { slot, generation } => put_pair(buf, b'F', slot, generation),
            TemplateRequest::Ping { seq } => put_u32(buf, b'p', seq),
            TemplateRequest::Quit => put_bare(buf, b'Q'),
        };
        &buf[..len]
    }

    /// Decodes one datagram received by a template.
    pub fn decode(bytes: &[u8]) -> Result<TemplateRequest, ProtocolError> {
        let (kind, payload) = split_versioned(bytes, TEMPLATE_VERSION)?;
        match kind {
            b'F' => get_pair(kind, payload)
                .map(|(slot, generation)| TemplateRequest::Fork { slot, generation }),
            b'p' => get_u32(kind, payload).map(|seq| TemplateRequest::Ping { seq }),
            b'Q' => bare(kind, payload, TemplateRequest::Quit),
            other => Err(ProtocolError::UnknownKind(other)),
        }
    }

    /// How many descriptors travel with this message.
    pub fn fd_count(self) -> usize {
        match self {
            TemplateRequest::Fork { .. } => 2,
            TemplateRequest::Ping { .. } | TemplateRequest::Quit => 0,
        }
    }
}

impl TemplateReply {
    /// Writes the message into `buf` and returns the bytes to send.
    pub fn encode(self, buf: &mut MessageBuf) -> &[u8] {
        buf[0] = TEMPLATE_VERSION;
        let len = match self {
            TemplateReply::Ready { pid } => put_u32(buf, b'R', pid),
            TemplateReply::Forked { slot, pid } => put_pair(buf, b'W', slot, pid),
            TemplateReply::ForkFailed { slot, errno } => put_pair(buf, b'E', slot, errno),
            TemplateReply::Pong { seq } => put_u32(buf, b'P', seq),
        };
        &buf[..len]
    }

    /// Decodes one datagram received from a template.
    pub fn decode(bytes: &[u8]) -> Result<TemplateReply, ProtocolError> {
        let (kind, payload) = split_versioned(bytes, TEMPLATE_VERSION)?;
        match kind {
            b'R' => get_u32(kind, payload).map(|pid| TemplateReply::Ready { pid }),
            b'W' => get_pair(kind, payload).map(|(slot, pid)| TemplateReply::Forked { slot, pid }),
            b'E' => get_pair(kind, payload)
                .map(|(slot, errno)| TemplateReply::ForkFailed { slot, errno }),
            b'P' => get_u32(kind, payload).map(|seq| TemplateReply::Pong { seq }),
            other => Err(ProtocolError::UnknownKind(other)),
        }
    }
}

impl WorkerOrder {
    /// Writes the message, with the version byte `0x02`, into `buf`.
    pub fn encode(self, buf: &mut MessageBuf) -> &[u8] {
        let len = match self {
            WorkerOrder::Parent(msg) => msg.encode(buf).len(),
            WorkerOrder::BecomeTemplate => put_bare(buf, b'T'),
            WorkerOrder::Seat {
                listeners,
                max_requests,
            } => {
                buf[1] = b'S';
                buf[2..4].copy_from_slice(&listeners.to_be_bytes());
                buf[4..12].copy_from_slice(&max_requests.to_be_bytes());
                12
            }
        };
        buf[0] = TEMPLATE_VERSION;
        &buf[..len]
    }

    /// Decodes one datagram received by a version 2 worker.
    pub fn decode(bytes: &[u8]) -> Result<WorkerOrder, ProtocolError> {
        let (kind, payload) = split_versioned(bytes, TEMPLATE_VERSION)?;
        if kind == b'T' {
            return bare(kind, payload, WorkerOrder::BecomeTemplate);
        }
        if kind == b'S' {
            let p = fixed::<10>(kind, payload)?;
            let mut max = [0u8; 8];
            max.copy_from_slice(&p[2..]);
            return Ok(WorkerOrder::Seat {
                listeners: u16::from_be_bytes([p[0], p[1]]),
                max_requests: u64::from_be_bytes(max),
            });
        }
        ParentMessage::decode(&as_version_1(bytes)).map(WorkerOrder::Parent)
    }

    /// How many descriptors travel with this message.
    pub fn fd_count(self) -> usize {
        match self {
            WorkerOrder::Parent(msg) => usize::from(msg.carries_fd()),
            WorkerOrder::BecomeTemplate => 1,
            WorkerOrder::Seat { listeners, .. } => usize::from(listeners) + 1,
        }
    }
}

/// Encodes a version 1 child message with the version byte `0x02`, as a
/// worker forked from a template sends it.
pub fn encode_child_v2(msg: ChildMessage, buf: &mut MessageBuf) -> &[u8] {
    let len = msg.encode(buf).len();
    buf[0] = TEMPLATE_VERSION;
    &buf[..len]
}

/// Decodes a message from a worker forked from a template: the version 1
/// child messages, each with the version byte `0x02`.
pub fn decode_child_v2(bytes: &[u8]) -> Result<ChildMessage, ProtocolError> {
    split_versioned(bytes, TEMPLATE_VERSION)?;
    ChildMessage::decode(&as_version_1(bytes))
}

/// The same datagram with the version byte `0x01`, for the version 1
/// decoders (the caller has checked the version byte).
fn as_version_1(bytes: &[u8]) -> Vec<u8> {
    let mut v1 = bytes.to_vec();
    v1[0] = VERSION;
    v1
}

fn split_versioned(bytes: &[u8], version: u8) -> Result<(u8, &[u8]), ProtocolError> {
    match bytes {
        [] => Err(ProtocolError::Empty),
        [v, kind, payload @ ..] if *v == version => Ok((*kind, payload)),
        [v] if *v == version => Err(ProtocolError::WrongLength {
            kind: 0,
            expected: 2,
            got: 1,
        }),
        [other, ..] => Err(ProtocolError::UnsupportedVersion(*other)),
    }
}

fn get_pair(kind: u8, payload: &[u8]) -> Result<(u32, u32), ProtocolError> {
    fixed::<8>(kind, payload).map(|p| {
        (
            u32::from_be_bytes([p[0], p[1], p[2], p[3]]),
            u32::from_be_bytes([p[4], p[5], p[6], p[7]]),
        )
    })
}

fn put_pair(buf: &mut MessageBuf, kind: u8, first: u32, second: u32) -> usize {
    buf[1] = kind;
    buf[2..6].copy_from_slice(&first.to_be_bytes());
    buf[6..10].copy_from_slice(&second.to_be_bytes());
    10
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_has_the_documented_bytes() {
        let mut buf = MessageBuf::default();
        let bytes = ChildMessage::Ready { pid: 0x01020304 }.encode(&mut buf);
        assert_eq!(bytes, &[1, b'R', 1, 2, 3, 4]);
    }

    #[test]
    fn ready_on_board_has_the_documented_bytes() {
        let mut buf = MessageBuf::default();
        let bytes = ChildMessage::ReadyOnBoard { pid: 0x01020304 }.encode(&mut buf);
        assert_eq!(bytes, &[1, b'K', 1, 2, 3, 4]);
        assert_eq!(
            ChildMessage::decode(bytes),
            Ok(ChildMessage::ReadyOnBoard { pid: 0x01020304 })
        );
        assert!(ChildMessage::decode(&[1, b'K', 1]).is_err());
    }

    #[test]
    fn ready_by_messages_has_the_documented_bytes() {
        let mut buf = MessageBuf::default();
        let bytes = ChildMessage::ReadyByMessages { pid: 0x01020304 }.encode(&mut buf);
        assert_eq!(bytes, &[1, b'G', 1, 2, 3, 4]);
        assert_eq!(
            ChildMessage::decode(bytes),
            Ok(ChildMessage::ReadyByMessages { pid: 0x01020304 })
        );
        assert!(ChildMessage::decode(&[1, b'G', 1, 2, 3, 4, 5]).is_err());
    }

    #[test]
    fn seat_has_the_documented_bytes() {
        let mut buf = MessageBuf::default();
        let seat = WorkerOrder::Seat {
            listeners: 2,
            max_requests: 1000,
        };
        let bytes = seat.encode(&mut buf);
        assert_eq!(bytes, &[2, b'S', 0, 2, 0, 0, 0, 0, 0, 0, 0x03, 0xe8]);
        assert_eq!(WorkerOrder::decode(bytes), Ok(seat));
        assert_eq!(seat.fd_count(), 3);
        assert!(WorkerOrder::decode(&bytes[..11]).is_err());
    }

    #[test]
    fn connection_has_the_documented_bytes() {
        let mut buf = MessageBuf::default();
        let bytes = ParentMessage::Connection { listener: 2 }.encode(&mut buf);
        assert_eq!(bytes, &[1, b'C', 0, 2]);
    }

    #[test]
    fn wrong_version_is_named() {
        let err = ChildMessage::decode(&[2, b'I']).unwrap_err();
        assert_eq!(err, ProtocolError::UnsupportedVersion(2));
        assert!(err.to_string().contains("version 2"));
    }

    #[test]
    fn trailing_bytes_are_rejected() {
        let err = ChildMessage::decode(&[1, b'I', 0]).unwrap_err();
        assert_eq!(
            err,
            ProtocolError::WrongLength {
                kind: b'I',
                expected: 2,
                got: 3
            }
        );
    }

    #[test]
    fn a_parent_kind_is_unknown_to_the_child_direction() {
        assert_eq!(
            ChildMessage::decode(&[1, b'Q']).unwrap_err(),
            ProtocolError::UnknownKind(b'Q')
        );
    }

    #[test]
    fn fork_has_the_documented_bytes() {
        let mut buf = MessageBuf::default();
        let bytes = TemplateRequest::Fork {
            slot: 3,
            generation: 1,
        }
        .encode(&mut buf);
        assert_eq!(bytes, &[2, b'F', 0, 0, 0, 3, 0, 0, 0, 1]);
    }

    #[test]
    fn a_version_1_message_is_refused_by_the_template_decoders() {
        assert_eq!(
            TemplateRequest::decode(&[1, b'Q']).unwrap_err(),
            ProtocolError::UnsupportedVersion(1)
        );
        assert_eq!(
            WorkerOrder::decode(&[1, b'T']).unwrap_err(),
            ProtocolError::UnsupportedVersion(1)
        );
    }

    #[test]
    fn version_2_workers_speak_version_1_messages_with_byte_2() {
        let mut buf = MessageBuf::default();
        assert_eq!(encode_child_v2(ChildMessage::Idle, &mut buf), &[2, b'I']);
        assert_eq!(decode_child_v2(&[2, b'I']), Ok(ChildMessage::Idle));
        assert_eq!(
            WorkerOrder::decode(&[2, b'Q']),
            Ok(WorkerOrder::Parent(ParentMessage::Quit))
        );
        assert_eq!(
            WorkerOrder::decode(&[2, b'T']),
            Ok(WorkerOrder::BecomeTemplate)
        );
    }
}
