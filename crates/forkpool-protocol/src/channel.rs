//! One end of a back-channel: the [`wire`](crate::wire) codec over a
//! `SOCK_SEQPACKET` socket. Thin I/O only; what a message means is decided
//! by the supervisor and the worker.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use crate::sys::fdpass::{self, Received};
use crate::wire::{
    decode_child_v2, encode_child_v2, ChildMessage, MessageBuf, ParentMessage, ProtocolError,
    TemplateReply, TemplateRequest, WorkerOrder, MAX_MESSAGE_LEN,
};

/// What arrived on a channel. `F` holds the descriptors that came with a
/// message: at most one for the version 1 messages and a worker's orders,
/// a list for a template's orders (a fork order carries two).
#[derive(Debug)]
pub enum Incoming<M, F = Option<OwnedFd>> {
    /// A well-formed message, with the descriptors that came with it.
    Message(M, F),
    /// Nothing is waiting (non-blocking channels only).
    WouldBlock,
    /// The other side closed its end.
    Closed,
    /// A datagram that is not a valid message.
    Malformed(Malformed),
}

/// Why a datagram was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Malformed {
    /// It did not decode.
    Protocol(ProtocolError),
    /// It was longer than any message.
    Oversized,
    /// It carried a file descriptor it should not have.
    UnexpectedFd,
    /// Its ancillary data was cut short (`MSG_CTRUNC`): more descriptors
    /// than a message can carry.
    TruncatedControl,
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Malformed::Protocol(e) => write!(f, "{e}"),
            Malformed::Oversized => write!(f, "message longer than {MAX_MESSAGE_LEN} bytes"),
            Malformed::UnexpectedFd => write!(f, "message carried a file descriptor"),
            Malformed::TruncatedControl => {
                write!(
                    f,
                    "message carried more ancillary data than fits (MSG_CTRUNC)"
                )
            }
        }
    }
}

/// One end of a back-channel.
#[derive(Debug)]
pub struct Channel {
    fd: OwnedFd,
}

impl Channel {
    /// A connected pair: (supervisor's end, child's end). The supervisor's end
    /// is non-blocking; the child's end is blocking.
    pub fn pair() -> io::Result<(Channel, Channel)> {
        let (parent, child) = fdpass::seqpacket_pair()?;
        crate::sys::socket::set_nonblocking(child.as_fd(), false)?;
        Ok((Channel { fd: parent }, Channel { fd: child }))
    }

    /// Wraps an inherited descriptor (an exec'd worker's end).
    pub fn from_fd(fd: OwnedFd) -> Channel {
        Channel { fd }
    }

    /// Supervisor side: sends `msg`, with `fd` for a connection handoff.
    pub fn send_to_child(&self, msg: ParentMessage, fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
        let mut buf = MessageBuf::default();
        fdpass::send(self.fd.as_fd(), msg.encode(&mut buf), fd)
    }

    /// Child side: sends `msg`.
    pub fn send_to_parent(&self, msg: ChildMessage) -> io::Result<()> {
        let mut buf = MessageBuf::default();
        fdpass::send(self.fd.as_fd(), msg.encode(&mut buf), None)
    }

    /// Supervisor side: receives one message from the child. Children never
    /// send descriptors; one that does has sent a malformed message, and the
    /// descriptors are closed here.
    pub fn recv_from_child(&self) -> io::Result<Incoming<ChildMessage>> {
        self.recv_without_fds(ChildMessage::decode)
    }

    /// Child side: receives one message from the supervisor. Only a
    /// connection handoff may carry a descriptor, exactly one, and it must.
    pub fn recv_from_parent(&self) -> io::Result<Incoming<ParentMessage>> {
        Ok(match self.recv_raw()? {
            Raw::Bytes(buf, n, mut fds, _) => match ParentMessage::decode(&buf[..n]) {
                Ok(msg) if fds.len() != usize::from(msg.carries_fd()) => {
                    Incoming::Malformed(Malformed::UnexpectedFd)
                }
                Ok(msg) => Incoming::Message(msg, fds.pop()),
                Err(e) => Incoming::Malformed(Malformed::Protocol(e)),
            },
            Raw::Other(other) => other,
        })
    }

    /// Worker side, version 2 (a worker forked from a template): sends
    /// `msg` with the version byte `0x02`.
    pub fn send_to_parent_v2(&self, msg: ChildMessage) -> io::Result<()> {
        let mut buf = MessageBuf::default();
        fdpass::send(self.fd.as_fd(), encode_child_v2(msg, &mut buf), None)
    }

    /// Supervisor side, version 2: receives one message from a worker
    /// forked from a template (version byte `0x02`). As in
    /// [`Channel::recv_from_child`], a descriptor makes it malformed.
    pub fn recv_from_child_v2(&self) -> io::Result<Incoming<ChildMessage>> {
        self.recv_without_fds(decode_child_v2)
    }

    /// Supervisor side: from now on, every message received on this end
    /// carries its sender's pid as the kernel knows it (`SO_PASSCRED`),
    /// read with [`Channel::recv_from_child_v2_sent_by`]. Set it before the
    /// other end is handed to anyone.
    pub fn pass_credentials(&self) -> io::Result<()> {
        fdpass::pass_credentials(self.fd.as_fd())
    }

    /// Supervisor side, version 2, like [`Channel::recv_from_child_v2`],
    /// with the pid of the process that sent the message as the kernel
    /// vouches for it (`None` unless [`Channel::pass_credentials`] was
    /// set, or for anything but a message).
    pub fn recv_from_child_v2_sent_by(&self) -> io::Result<(Incoming<ChildMessage>, Option<i32>)> {
        self.recv_without_fds_sent_by(decode_child_v2)
    }

    /// Supervisor side: receives one reply from a template (or its
    /// intermediate child). Templates never send descriptors; one that
    /// does has sent a malformed message, and they are closed here.
    pub fn recv_template_reply(&self) -> io::Result<Incoming<TemplateReply>> {
        self.recv_without_fds(TemplateReply::decode)
    }

    /// Receives one message that must come without descriptors, decoded
    /// with `decode`; descriptors that came anyway are closed here.
    fn recv_without_fds<M>(
        &self,
        decode: impl Fn(&[u8]) -> Result<M, ProtocolError>,
    ) -> io::Result<Incoming<M>> {
        Ok(self.recv_without_fds_sent_by(decode)?.0)
    }

    /// [`Channel::recv_without_fds`], with the sender's pid if the kernel
    /// attached it.
    fn recv_without_fds_sent_by<M>(
        &self,
        decode: impl Fn(&[u8]) -> Result<M, ProtocolError>,
    ) -> io::Result<(Incoming<M>, Option<i32>)> {
        Ok(match self.recv_raw()? {
            Raw::Bytes(_, _, fds, sender) if !fds.is_empty() => {
                (Incoming::Malformed(Malformed::UnexpectedFd), sender)
            }
            Raw::Bytes(buf, n, _, sender) => match decode(&buf[..n]) {
                Ok(msg) => (Incoming::Message(msg, None), sender),
                Err(e) => (Incoming::Malformed(Malformed::Protocol(e)), sender),
            },
            Raw::Other(other) => (other, None),
        })
    }

    /// Supervisor side, version 2: sends `order` to a worker forked from a
    /// template, with its descriptor (a connection, or the new template
    /// channel of [`WorkerOrder::BecomeTemplate`]).
    pub fn send_order(&self, order: WorkerOrder, fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
        let mut buf = MessageBuf::default();
        fdpass::send(self.fd.as_fd(), order.encode(&mut buf), fd)
    }

    /// Worker side, version 2: receives one order. A connection handoff and
    /// [`WorkerOrder::BecomeTemplate`] carry exactly one descriptor, every
    /// other message none; anything else is malformed (and the descriptors
    /// are closed here).
    pub fn recv_order(&self) -> io::Result<Incoming<WorkerOrder>> {
        Ok(match self.recv_order_with_fds()? {
            Incoming::Message(order, mut fds) if fds.len() <= 1 => {
                Incoming::Message(order, fds.pop())
            }
            Incoming::Message(..) => Incoming::Malformed(Malformed::UnexpectedFd),
            Incoming::WouldBlock => Incoming::WouldBlock,
            Incoming::Closed => Incoming::Closed,
            Incoming::Malformed(why) => Incoming::Malformed(why),
        })
    }

    /// Worker side, version 2: receives one order with every descriptor
    /// that came with it ([`WorkerOrder::Seat`] brings several); a count
    /// other than the order's is malformed.
    pub fn recv_order_with_fds(&self) -> io::Result<Incoming<WorkerOrder, Vec<OwnedFd>>> {
        Ok(match self.recv_raw()? {
            Raw::Bytes(buf, n, fds, _) => match WorkerOrder::decode(&buf[..n]) {
                Ok(order) if fds.len() != order.fd_count() => {
                    Incoming::Malformed(Malformed::UnexpectedFd)
                }
                Ok(order) => Incoming::Message(order, fds),
                Err(e) => Incoming::Malformed(Malformed::Protocol(e)),
            },
            Raw::Other(other) => other.without_fds(),
        })
    }

    /// Supervisor side, version 2: sends `order` with several descriptors
    /// ([`WorkerOrder::Seat`]: the slot's sockets, then the scoreboard).
    pub fn send_order_with_fds(
        &self,
        order: WorkerOrder,
        fds: &[BorrowedFd<'_>],
    ) -> io::Result<()> {
        let mut buf = MessageBuf::default();
        fdpass::send_fds(self.fd.as_fd(), order.encode(&mut buf), fds)
    }

    /// Supervisor side: sends `request` to a template with its descriptors
    /// (for a fork order: the worker's channel, then its stderr pipe).
    pub fn send_template_request(
        &self,
        request: TemplateRequest,
        fds: &[BorrowedFd<'_>],
    ) -> io::Result<()> {
        let mut buf = MessageBuf::default();
        fdpass::send_fds(self.fd.as_fd(), request.encode(&mut buf), fds)
    }

    /// Template side: sends `reply` (also used by the template's
    /// intermediate child for `W` and `E`).
    pub fn send_template_reply(&self, reply: TemplateReply) -> io::Result<()> {
        let mut buf = MessageBuf::default();
        fdpass::send(self.fd.as_fd(), reply.encode(&mut buf), None)
    }

    /// Template side: receives one request with its descriptors, in the
    /// order they were sent. A request with other than the number of
    /// descriptors it must carry is malformed (and they are closed here).
    pub fn recv_template_request(&self) -> io::Result<Incoming<TemplateRequest, Vec<OwnedFd>>> {
        Ok(match self.recv_raw()? {
            Raw::Bytes(buf, n, fds, _) => match TemplateRequest::decode(&buf[..n]) {
                Ok(request) if fds.len() != request.fd_count() => {
                    Incoming::Malformed(Malformed::UnexpectedFd)
                }
                Ok(request) => Incoming::Message(request, fds),
                Err(e) => Incoming::Malformed(Malformed::Protocol(e)),
            },
            Raw::Other(other) => other.without_fds(),
        })
    }

    fn recv_raw<M>(&self) -> io::Result<Raw<M>> {
        // One byte more than the longest message, so an oversized datagram
        // is caught by MSG_TRUNC rather than silently cut to a valid length.
        let mut buf = [0u8; MAX_MESSAGE_LEN + 1];
        Ok(match fdpass::recv(self.fd.as_fd(), &mut buf)? {
            Received::Message(n, fds, sender) if n <= MAX_MESSAGE_LEN => {
                Raw::Bytes(buf, n, fds, sender)
            }
            Received::Message(..) | Received::Oversized => {
                Raw::Other(Incoming::Malformed(Malformed::Oversized))
            }
            Received::TruncatedControl => {
                Raw::Other(Incoming::Malformed(Malformed::TruncatedControl))
            }
            Received::WouldBlock => Raw::Other(Incoming::WouldBlock),
            Received::Closed => Raw::Other(Incoming::Closed),
        })
    }
}

enum Raw<M> {
    Bytes([u8; MAX_MESSAGE_LEN + 1], usize, Vec<OwnedFd>, Option<i32>),
    Other(Incoming<M>),
}

impl<M> Incoming<M> {
    /// The same outcome for a receiver that takes a descriptor list; only
    /// called on the outcomes that carry no message.
    fn without_fds(self) -> Incoming<M, Vec<OwnedFd>> {
        match self {
            Incoming::Message(m, fd) => Incoming::Message(m, fd.into_iter().collect()),
            Incoming::WouldBlock => Incoming::WouldBlock,
            Incoming::Closed => Incoming::Closed,
            Incoming::Malformed(why) => Incoming::Malformed(why),
        }
    }
}

impl AsFd for Channel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for Channel {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl From<Channel> for OwnedFd {
    fn from(channel: Channel) -> OwnedFd {
        channel.fd
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_connection_travels_with_its_descriptor() {
        let (parent, child) = Channel::pair().unwrap();
        let (a, mut b) = UnixStream::pair().unwrap();
        parent
            .send_to_child(ParentMessage::Connection { listener: 3 }, Some(a.as_fd()))
            .unwrap();
        drop(a);
        let Incoming::Message(msg, Some(fd)) = child.recv_from_parent().unwrap() else {
            panic!("expected a message with a descriptor");
        };
        assert_eq!(msg, ParentMessage::Connection { listener: 3 });
        use std::io::{Read, Write};
        let mut passed = UnixStream::from(fd);
        passed.write_all(b"hi").unwrap();
        let mut got = [0u8; 2];
        b.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hi");
    }

    #[test]
    fn a_fork_order_travels_with_both_descriptors_in_order() {
        let (supervisor, template) = Channel::pair().unwrap();
        let (chan, _chan_peer) = UnixStream::pair().unwrap();
        let (err, _err_peer) = UnixStream::pair().unwrap();
        let fork = TemplateRequest::Fork {
            slot: 3,
            generation: 2,
        };
        supervisor
            .send_template_request(fork, &[chan.as_fd(), err.as_fd()])
            .unwrap();
        let Incoming::Message(got, fds) = template.recv_template_request().unwrap() else {
            panic!("expected a fork order");
        };
        assert_eq!(got, fork);
        let inode = |fd: BorrowedFd<'_>| {
            use std::os::unix::fs::MetadataExt;
            std::fs::File::from(fd.try_clone_to_owned().unwrap())
                .metadata()
                .unwrap()
                .ino()
        };
        let got: Vec<u64> = fds.iter().map(|f| inode(f.as_fd())).collect();
        assert_eq!(got, vec![inode(chan.as_fd()), inode(err.as_fd())]);

        // One descriptor short: malformed, and nothing is handed over.
        supervisor
            .send_template_request(fork, &[chan.as_fd()])
            .unwrap();
        assert!(matches!(
            template.recv_template_request().unwrap(),
            Incoming::Malformed(Malformed::UnexpectedFd)
        ));
        supervisor
            .send_template_request(TemplateRequest::Ping { seq: 7 }, &[])
            .unwrap();
        assert!(matches!(
            template.recv_template_request().unwrap(),
            Incoming::Message(TemplateRequest::Ping { seq: 7 }, fds) if fds.is_empty()
        ));
        template
            .send_template_reply(TemplateReply::Pong { seq: 7 })
            .unwrap();
        let mut buf = [0u8; 16];
        let Received::Message(n, _, _) = fdpass::recv(supervisor.as_fd(), &mut buf).unwrap() else {
            panic!("expected the pong");
        };
        assert_eq!(&buf[..n], b"\x02P\x00\x00\x00\x07");
    }

    #[test]
    fn a_version_2_worker_takes_become_template_with_one_descriptor() {
        let (supervisor, worker) = Channel::pair().unwrap();
        let (new_template, _peer) = UnixStream::pair().unwrap();
        supervisor
            .send_order(WorkerOrder::BecomeTemplate, Some(new_template.as_fd()))
            .unwrap();
        assert!(matches!(
            worker.recv_order().unwrap(),
            Incoming::Message(WorkerOrder::BecomeTemplate, Some(_))
        ));
        supervisor
            .send_order(WorkerOrder::BecomeTemplate, None)
            .unwrap();
        assert!(matches!(
            worker.recv_order().unwrap(),
            Incoming::Malformed(Malformed::UnexpectedFd)
        ));
        // A version 1 byte on a version 2 channel is refused.
        supervisor.send_to_child(ParentMessage::Quit, None).unwrap();
        assert!(matches!(
            worker.recv_order().unwrap(),
            Incoming::Malformed(Malformed::Protocol(ProtocolError::UnsupportedVersion(1)))
        ));
        worker.send_to_parent_v2(ChildMessage::Idle).unwrap();
        let mut buf = [0u8; 16];
        let Received::Message(n, _, _) = fdpass::recv(supervisor.as_fd(), &mut buf).unwrap() else {
            panic!("expected Idle");
        };
        assert_eq!(&buf[..n], b"\x02I");
    }

    #[test]
    fn the_kernel_names_the_sender_only_once_asked() {
        let (parent, child) = Channel::pair().unwrap();
        child.send_to_parent_v2(ChildMessage::Idle).unwrap();
        let (msg, sender) = parent.recv_from_child_v2_sent_by().unwrap();
        assert!(matches!(msg, Incoming::Message(ChildMessage::Idle, None)));
        assert_eq!(sender, None);
        parent.pass_credentials().unwrap();
        child.send_to_parent_v2(ChildMessage::Idle).unwrap();
        let (msg, sender) = parent.recv_from_child_v2_sent_by().unwrap();
        assert!(matches!(msg, Incoming::Message(ChildMessage::Idle, None)));
        assert_eq!(sender, Some(std::process::id() as i32));
    }

    #[test]
    fn garbage_and_fds_from_a_child_are_malformed() {
        let (parent, child) = Channel::pair().unwrap();
        fdpass::send(child.as_fd(), b"\x01Z", None).unwrap();
        assert!(matches!(
            parent.recv_from_child().unwrap(),
            Incoming::Malformed(Malformed::Protocol(ProtocolError::UnknownKind(b'Z')))
        ));
        fdpass::send(child.as_fd(), &[1u8; 64], None).unwrap();
        assert!(matches!(
            parent.recv_from_child().unwrap(),
            Incoming::Malformed(Malformed::Oversized)
        ));
        let mut buf = MessageBuf::default();
        let idle = ChildMessage::Idle.encode(&mut buf).to_vec();
        fdpass::send(child.as_fd(), &idle, Some(parent.as_fd())).unwrap();
        assert!(matches!(
            parent.recv_from_child().unwrap(),
            Incoming::Malformed(Malformed::UnexpectedFd)
        ));
        assert!(matches!(
            parent.recv_from_child().unwrap(),
            Incoming::WouldBlock
        ));
        drop(child);
        assert!(matches!(
            parent.recv_from_child().unwrap(),
            Incoming::Closed
        ));
    }
}
