//! The protocol crate's syscall boundary: passing a descriptor over the
//! channel. Every `unsafe` block of the crate lives here, each with a
//! `SAFETY:` note.

pub mod fdpass;

/// Plain socket settings, through `socket2`.
pub mod socket {
    use std::io;
    use std::os::fd::BorrowedFd;

    /// Makes `fd` non-blocking, or blocking again.
    pub fn set_nonblocking(fd: BorrowedFd<'_>, nonblocking: bool) -> io::Result<()> {
        socket2::SockRef::from(&fd).set_nonblocking(nonblocking)
    }
}
