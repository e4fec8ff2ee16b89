//! Sending and receiving one back-channel datagram. A sender attaches its
//! descriptors (one for a handoff, two for a fork order) as `SCM_RIGHTS`
//! ancillary data; a receiver gets
//! every descriptor that arrived, owned, so none can leak.

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::sys::socket::{
    sendmsg, socketpair, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType,
};

/// What one receive produced. Every descriptor the kernel installed for
/// the datagram is returned owned, so whatever the caller does not keep is
/// closed when dropped: nothing a peer sends can leak descriptors into us.
#[derive(Debug)]
pub enum Received {
    /// A datagram of this many bytes, every descriptor that came with it,
    /// and the sender's pid as the kernel vouches for it (`SCM_CREDENTIALS`,
    /// present only once [`pass_credentials`] was set on the receiving end).
    Message(usize, Vec<OwnedFd>, Option<i32>),
    /// A datagram larger than the buffer (never a valid message).
    Oversized,
    /// The ancillary data did not fit (`MSG_CTRUNC`): more descriptors than
    /// one message can carry, or our descriptor table was full. The ones
    /// that did arrive are already closed.
    TruncatedControl,
    /// Nothing waiting on a non-blocking socket.
    WouldBlock,
    /// The peer closed its end, or sent an empty datagram: on
    /// `SOCK_SEQPACKET` the two read alike (a 0-byte read).
    Closed,
}

/// The most descriptors Linux passes in one message (`SCM_MAX_FD`). The
/// receive buffer has room for all of them, so a long descriptor list is
/// received (and closed) whole instead of being cut short.
const SCM_MAX_FD: usize = 253;

/// Control buffer, in `u64`s so that it is aligned for `cmsghdr`: its
/// header, plus `SCM_MAX_FD` descriptors, plus slack for a second header.
/// Then room for one `SCM_CREDENTIALS` header and its `ucred`.
const CONTROL_WORDS: usize =
    (3 * size_of::<libc::cmsghdr>() + SCM_MAX_FD * 4 + size_of::<libc::ucred>()) / 8 + 3;

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
    send_fds(channel, bytes, fd.as_slice())
}

/// Sends one datagram with every descriptor of `fds` attached, in order,
/// as one `SCM_RIGHTS` message (none: a plain datagram). Never raises
/// SIGPIPE.
pub fn send_fds(channel: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let iov = [IoSlice::new(bytes)];
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let rights = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage] = if raw.is_empty() { &[] } else { &rights };
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

/// Receives one datagram into `buf`, with every descriptor attached to it.
pub fn recv(channel: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Received> {
    let mut control = [0u64; CONTROL_WORDS];
    loop {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: an all-zero msghdr is a valid empty header.
        let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
        hdr.msg_iov = &mut iov;
        hdr.msg_iovlen = 1;
        hdr.msg_control = control.as_mut_ptr().cast();
        hdr.msg_controllen = size_of_val(&control) as _;
        // SAFETY: `hdr` points at `iov` (which covers `buf`) and `control`,
        // all alive and writable for the whole call.
        let n = unsafe { libc::recvmsg(channel.as_raw_fd(), &mut hdr, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            match Errno::last() {
                Errno::EINTR => continue,
                Errno::EAGAIN => return Ok(Received::WouldBlock),
                Errno::ECONNRESET => return Ok(Received::Closed),
                e => return Err(e.into()),
            }
        }
        let (fds, sender) = take_control(&hdr);
        if hdr.msg_flags & libc::MSG_CTRUNC != 0 {
            drop(fds);
            return Ok(Received::TruncatedControl);
        }
        if hdr.msg_flags & libc::MSG_TRUNC != 0 {
            return Ok(Received::Oversized);
        }
        if n == 0 && fds.is_empty() {
            return Ok(Received::Closed);
        }
        return Ok(Received::Message(n as usize, fds, sender));
    }
}

/// Takes ownership of every descriptor in the `SCM_RIGHTS` messages the
/// kernel wrote into `hdr`'s control buffer, including when it set
/// `MSG_CTRUNC` (the headers then cover only the descriptors installed),
/// and reads the sender's pid from an `SCM_CREDENTIALS` message, if any.
fn take_control(hdr: &libc::msghdr) -> (Vec<OwnedFd>, Option<i32>) {
    let mut fds = Vec::new();
    let mut sender = None;
    // SAFETY: CMSG_LEN is plain arithmetic.
    let credentials_len = unsafe { libc::CMSG_LEN(size_of::<libc::ucred>() as u32) } as usize;
    // SAFETY: `hdr` was filled in by a successful recvmsg; the CMSG_* macros
    // walk only within `msg_control[..msg_controllen]`.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(hdr) };
    while !cmsg.is_null() {
        // SAFETY: CMSG_FIRSTHDR/CMSG_NXTHDR return either null or a header
        // that lies inside the control buffer.
        let header = unsafe { cmsg.read_unaligned() };
        if header.cmsg_level == libc::SOL_SOCKET && header.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: CMSG_LEN(0) is plain arithmetic.
            let head = unsafe { libc::CMSG_LEN(0) } as usize;
            let count = (header.cmsg_len as usize).saturating_sub(head) / size_of::<RawFd>();
            // SAFETY: the data of this header holds `count` descriptors.
            let data = unsafe { libc::CMSG_DATA(cmsg) }.cast::<RawFd>();
            for i in 0..count {
                // SAFETY: `i < count`, inside this header's data; the kernel
                // just installed the descriptor in our table for this
                // message and nothing else owns it.
                let owned = unsafe { OwnedFd::from_raw_fd(data.add(i).read_unaligned()) };
                fds.push(owned);
            }
        } else if header.cmsg_level == libc::SOL_SOCKET
            && header.cmsg_type == libc::SCM_CREDENTIALS
            && header.cmsg_len as usize >= credentials_len
        {
            // SAFETY: the header is long enough for one `ucred`, which the
            // kernel wrote at its data.
            let cred = unsafe { libc::CMSG_DATA(cmsg).cast::<libc::ucred>().read_unaligned() };
            sender = Some(cred.pid);
        }
        // SAFETY: `cmsg` is a header inside `hdr`'s control buffer.
        cmsg = unsafe { libc::CMSG_NXTHDR(hdr, cmsg) };
    }
    (fds, sender)
}

/// Asks the kernel to attach the sender's credentials (`SCM_CREDENTIALS`)
/// to every datagram this end receives from now on (`SO_PASSCRED`): the
/// pid comes from the kernel, whatever the sender says about itself.
pub fn pass_credentials(channel: BorrowedFd<'_>) -> io::Result<()> {
    nix::sys::socket::setsockopt(&channel, nix::sys::socket::sockopt::PassCred, &true)
        .map_err(io::Error::from)
}
