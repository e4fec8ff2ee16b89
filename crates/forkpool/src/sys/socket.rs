//! Socket calls the standard library does not offer.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::socket::{accept4, SockFlag};

/// Accepts one connection, close-on-exec and blocking (children use plain
/// blocking I/O). Errors come back as they are, `EAGAIN` included.
pub fn accept(listener: BorrowedFd<'_>) -> Result<OwnedFd, Errno> {
    loop {
        match accept4(listener.as_raw_fd(), SockFlag::SOCK_CLOEXEC) {
            // SAFETY: accept4 returned a new descriptor that nothing else owns.
            Ok(raw) => return Ok(unsafe { OwnedFd::from_raw_fd(raw) }),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Accepts one connection (close-on-exec) with its peer's address, which
/// `accept4` returns at no extra cost: the supervisor keeps it for the
/// status page instead of asking the kernel again (`getpeername`) for
/// every connection it hands on.
pub fn accept_with_peer(listener: BorrowedFd<'_>) -> Result<(OwnedFd, socket2::SockAddr), Errno> {
    let listener = socket2::SockRef::from(&listener);
    loop {
        match listener.accept() {
            Ok((socket, peer)) => return Ok((OwnedFd::from(socket), peer)),
            Err(e) => match Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)) {
                Errno::EINTR => continue,
                errno => return Err(errno),
            },
        }
    }
}

/// Connections waiting in a TCP listener's accept queue. Linux reports it
/// in `tcpi_unacked` of `TCP_INFO` on a listening socket. `None` for sockets
/// that are not TCP listeners.
pub fn tcp_accept_queue_len(listener: BorrowedFd<'_>) -> Option<u32> {
    let mut info = std::mem::MaybeUninit::<libc::tcp_info>::zeroed();
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` is a writable buffer of `len` bytes and `len` points to
    // its size; the kernel writes at most that much.
    let rc = unsafe {
        libc::getsockopt(
            listener.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return None;
    }
    // SAFETY: getsockopt succeeded and the struct was zeroed first, so any
    // field the kernel did not write is a valid zero.
    let info = unsafe { info.assume_init() };
    Some(info.tcpi_unacked)
}

/// The descriptors systemd-style socket activation passed to this process,
/// with their names; the `LISTEN_*` variables are removed so nothing after
/// us (children, exec'd workers) takes them for its own.
pub fn take_listen_fds() -> io::Result<Vec<(OwnedFd, String)>> {
    let passed: Vec<(i32, String)> = match sd_notify::listen_fds_with_names() {
        Ok(fds) => fds.collect(),
        Err(e) if std::env::var_os("LISTEN_FDS").is_none() => {
            let _ = e;
            Vec::new()
        }
        Err(e) => {
            return Err(io::Error::other(format!(
                "LISTEN_FDS is set but unusable: {e}"
            )))
        }
    };
    for var in ["LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"] {
        std::env::remove_var(var);
    }
    let mut owned = Vec::with_capacity(passed.len());
    for (raw, name) in passed {
        // SAFETY: LISTEN_FDS names descriptors the parent left open for this
        // process (LISTEN_PID matched our pid); each is taken exactly once
        // and the variables are gone, so nothing else will claim them.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        set_cloexec(fd.as_fd())?;
        owned.push((fd, name));
    }
    Ok(owned)
}

fn set_cloexec(fd: BorrowedFd<'_>) -> io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    Ok(())
}

/// Sets or clears `O_NONBLOCK`.
pub fn set_nonblocking(fd: BorrowedFd<'_>, nonblocking: bool) -> io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
    let flags = if nonblocking {
        flags | OFlag::O_NONBLOCK
    } else {
        flags & !OFlag::O_NONBLOCK
    };
    fcntl(fd, FcntlArg::F_SETFL(flags))?;
    Ok(())
}

/// Sends all of `buf` as the last bytes before the caller closes `fd`,
/// with `MSG_MORE`: the kernel keeps a segment that is not full until the
/// close, whose FIN then rides in it. The client gets the answer and the
/// end in one packet and acknowledges once, not twice.
///
/// Only for a stream that is closed right after: what is held waits for
/// the close (or the next send without the flag).
pub fn send_all_before_close(fd: BorrowedFd<'_>, mut buf: &[u8]) -> io::Result<()> {
    use nix::sys::socket::{send, MsgFlags};
    let flags = MsgFlags::MSG_NOSIGNAL | MsgFlags::from_bits_retain(libc::MSG_MORE);
    while !buf.is_empty() {
        match send(fd.as_raw_fd(), buf, flags) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Whether `fd` is readable right now (a zero-timeout `poll`).
pub fn readable_now(fd: BorrowedFd<'_>) -> bool {
    let [readable] = readable_now_each([fd]);
    readable
}

/// Waits, however long it takes, until `fd` is readable (or at its end,
/// or in error: a read then says which).
pub fn wait_readable(fd: BorrowedFd<'_>) -> io::Result<()> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    loop {
        let mut polled = [PollFd::new(fd, PollFlags::POLLIN)];
        match poll(&mut polled, PollTimeout::NONE) {
            Ok(_) => return Ok(()),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Shuts down sending on socket `fd`: its peer reads end of file once it
/// has read what was sent before. Reading on `fd` goes on as before.
pub fn shut_down_sending(fd: BorrowedFd<'_>) -> io::Result<()> {
    nix::sys::socket::shutdown(fd.as_raw_fd(), nix::sys::socket::Shutdown::Write)
        .map_err(io::Error::from)
}

/// Which of `fds` are readable right now, in one zero-timeout `poll`
/// (none, if the call fails).
pub fn readable_now_each<const N: usize>(fds: [BorrowedFd<'_>; N]) -> [bool; N] {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut polled = fds.map(|fd| PollFd::new(fd, PollFlags::POLLIN));
    if !matches!(poll(&mut polled, PollTimeout::ZERO), Ok(n) if n > 0) {
        return [false; N];
    }
    polled.map(|p| p.revents().is_some_and(|r| r.contains(PollFlags::POLLIN)))
}

/// Sets `TCP_DEFER_ACCEPT` on a TCP listener: a connection is only
/// reported (readable listener, `accept`) once the client has sent data,
/// or after about `seconds` without any. 0 turns it off.
pub fn set_defer_accept(listener: BorrowedFd<'_>, seconds: u32) -> io::Result<()> {
    let value = libc::c_int::try_from(seconds).unwrap_or(libc::c_int::MAX);
    // SAFETY: `value` is a live c_int and the length passed is its size;
    // the kernel only reads it.
    let rc = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `TCP_DEFER_ACCEPT` as the kernel keeps it (whole seconds, rounded to
/// its SYN-ACK retransmissions; 0 when off).
pub fn defer_accept(listener: BorrowedFd<'_>) -> io::Result<u32> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` is a writable c_int and `len` holds its size; the
    // kernel writes at most that much.
    let rc = unsafe {
        libc::getsockopt(
            listener.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        Ok(u32::try_from(value).unwrap_or(0))
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether `fd` is an IPv4 or IPv6 socket (a TCP connection, for the
/// streams forkpool handles) rather than a Unix one.
pub fn is_inet(fd: BorrowedFd<'_>) -> bool {
    matches!(
        socket2::SockRef::from(&fd).domain(),
        Ok(socket2::Domain::IPV4 | socket2::Domain::IPV6)
    )
}
