//! Sending and receiving one back-channel datagram, with at most one file
//! descriptor attached as `SCM_RIGHTS` ancillary data.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType,
};

/// What one receive produced.
#[derive(Debug)]
pub enum Received {
    /// A datagram of this many bytes, and the descriptor that came with it.
    Message(usize, Option<OwnedFd>),
    /// A datagram larger than the buffer (never a valid message).
    Oversized,
    /// Nothing waiting on a non-blocking socket.
    WouldBlock,
    /// The peer closed its end.
    Closed,
}

/// A connected `SOCK_SEQPACKET` pair, close-on-exec, both ends non-blocking.
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
    )
    .map_err(io::Error::from)
}

/// Sends one datagram, attaching `fd` if given. Never raises SIGPIPE.
pub fn send(channel: BorrowedFd<'_>, bytes: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    let iov = [IoSlice::new(bytes)];
    let raw: [RawFd; 1] = [fd.map_or(-1, |f| f.as_raw_fd())];
    let cmsgs: &[ControlMessage] = if fd.is_some() {
        &[ControlMessage::ScmRights(&raw)]
    } else {
        &[]
    };
    loop {
        match sendmsg::<()>(
            channel.as_raw_fd(),
            &iov,
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(_) => return Ok(()),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Receives one datagram into `buf`, keeping at most one passed descriptor
/// (any extra ones are closed, so a confused peer cannot leak fds into us).
pub fn recv(channel: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Received> {
    let mut cmsg_space = nix::cmsg_space!([RawFd; 4]);
    loop {
        let mut iov = [IoSliceMut::new(buf)];
        let result = recvmsg::<()>(
            channel.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg_space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        );
        let msg = match result {
            Ok(msg) => msg,
            Err(Errno::EINTR) => continue,
            Err(Errno::EAGAIN) => return Ok(Received::WouldBlock),
            Err(Errno::ECONNRESET) => return Ok(Received::Closed),
            Err(e) => return Err(e.into()),
        };
        let mut passed = None;
        if let Ok(cmsgs) = msg.cmsgs() {
            for cmsg in cmsgs {
                if let ControlMessageOwned::ScmRights(fds) = cmsg {
                    for raw in fds {
                        // SAFETY: the kernel just installed `raw` in our fd
                        // table for this message; nothing else owns it.
                        let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                        if passed.is_none() {
                            passed = Some(owned);
                        }
                    }
                }
            }
        }
        if msg.flags.contains(MsgFlags::MSG_TRUNC) {
            return Ok(Received::Oversized);
        }
        if msg.bytes == 0 && passed.is_none() {
            return Ok(Received::Closed);
        }
        return Ok(Received::Message(msg.bytes, passed));
    }
}
