//! The sockets the pool works with: connected streams (TCP or Unix) that
//! sessions talk on, and listeners the pool can accept from.
//!
//! Both are small enums over `mio`'s socket types so that one session type
//! works on any connected stream socket, whichever way it arrived: accepted
//! by the pool, accepted elsewhere, or received as a bare descriptor from a
//! supervisor.

use std::fmt;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use mio::event::Source;
use mio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use mio::{Interest, Registry, Token};
use socket2::{SockRef, Type};

/// A connected stream socket a session talks on.
///
/// It reads and writes like any stream, but it is always in non-blocking
/// mode: see [`Session`](super::Session) for what that means for a hook.
#[derive(Debug)]
pub enum SessionStream {
    /// A TCP connection.
    Tcp(TcpStream),
    /// A Unix-domain stream connection.
    Unix(UnixStream),
}

impl SessionStream {
    /// Shuts down the read, write or both halves of the connection.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            SessionStream::Tcp(s) => s.shutdown(how),
            SessionStream::Unix(s) => s.shutdown(how),
        }
    }

    /// Writes as much of `pending` as the socket takes now and drops what
    /// was written from its front: `Ok(true)` once it is empty, `Ok(false)`
    /// when the socket is full (answer [`Step::WaitWritable`]).
    ///
    /// [`Step::WaitWritable`]: crate::Step::WaitWritable
    pub fn write_pending(&mut self, pending: &mut Vec<u8>) -> io::Result<bool> {
        while !pending.is_empty() {
            match self.write(pending) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    pending.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Who is on the other end, for log lines: `tcp 127.0.0.1:4242`, or
    /// `unix` (Unix peers are rarely bound to a path).
    pub fn peer(&self) -> String {
        match self {
            SessionStream::Tcp(s) => match s.peer_addr() {
                Ok(addr) => format!("tcp {addr}"),
                Err(_) => "tcp (peer gone)".to_string(),
            },
            SessionStream::Unix(_) => "unix".to_string(),
        }
    }

    /// Puts the socket in non-blocking mode, whatever it was before; the pool
    /// does this to every stream it is given.
    pub(crate) fn make_nonblocking(&self) -> io::Result<()> {
        SockRef::from(self).set_nonblocking(true)
    }
}

impl From<TcpStream> for SessionStream {
    fn from(stream: TcpStream) -> Self {
        SessionStream::Tcp(stream)
    }
}

impl From<UnixStream> for SessionStream {
    fn from(stream: UnixStream) -> Self {
        SessionStream::Unix(stream)
    }
}

/// The pool switches the socket to non-blocking mode when it takes it.
impl From<std::net::TcpStream> for SessionStream {
    fn from(stream: std::net::TcpStream) -> Self {
        SessionStream::Tcp(TcpStream::from_std(stream))
    }
}

/// The pool switches the socket to non-blocking mode when it takes it.
impl From<std::os::unix::net::UnixStream> for SessionStream {
    fn from(stream: std::os::unix::net::UnixStream) -> Self {
        SessionStream::Unix(UnixStream::from_std(stream))
    }
}

/// Takes a connected stream socket known only by its descriptor, such as one
/// received from a supervisor over `SCM_RIGHTS`. The socket's family decides
/// the variant; anything but a stream socket is refused.
impl TryFrom<OwnedFd> for SessionStream {
    type Error = io::Error;

    fn try_from(fd: OwnedFd) -> io::Result<Self> {
        let sock = SockRef::from(&fd);
        if sock.r#type()? != Type::STREAM {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a session needs a stream socket (SOCK_STREAM); this descriptor is another kind",
            ));
        }
        let local = sock.local_addr()?;
        if local.is_unix() {
            Ok(SessionStream::Unix(UnixStream::from(fd)))
        } else if local.as_socket().is_some() {
            Ok(SessionStream::Tcp(TcpStream::from(fd)))
        } else {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a session needs a TCP or Unix socket; this descriptor has another family",
            ))
        }
    }
}

impl Read for SessionStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            SessionStream::Tcp(s) => s.read(buf),
            SessionStream::Unix(s) => s.read(buf),
        }
    }

    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        match self {
            SessionStream::Tcp(s) => s.read_vectored(bufs),
            SessionStream::Unix(s) => s.read_vectored(bufs),
        }
    }
}

impl Write for SessionStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            SessionStream::Tcp(s) => s.write(buf),
            SessionStream::Unix(s) => s.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            SessionStream::Tcp(s) => s.write_vectored(bufs),
            SessionStream::Unix(s) => s.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            SessionStream::Tcp(s) => s.flush(),
            SessionStream::Unix(s) => s.flush(),
        }
    }
}

impl AsFd for SessionStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            SessionStream::Tcp(s) => s.as_fd(),
            SessionStream::Unix(s) => s.as_fd(),
        }
    }
}

impl AsRawFd for SessionStream {
    fn as_raw_fd(&self) -> RawFd {
        self.as_fd().as_raw_fd()
    }
}

impl Source for SessionStream {
    fn register(&mut self, r: &Registry, t: Token, i: Interest) -> io::Result<()> {
        match self {
            SessionStream::Tcp(s) => s.register(r, t, i),
            SessionStream::Unix(s) => s.register(r, t, i),
        }
    }

    fn reregister(&mut self, r: &Registry, t: Token, i: Interest) -> io::Result<()> {
        match self {
            SessionStream::Tcp(s) => s.reregister(r, t, i),
            SessionStream::Unix(s) => s.reregister(r, t, i),
        }
    }

    fn deregister(&mut self, r: &Registry) -> io::Result<()> {
        match self {
            SessionStream::Tcp(s) => s.deregister(r),
            SessionStream::Unix(s) => s.deregister(r),
        }
    }
}

/// A listening socket the pool accepts sessions from
/// ([`SessionPool::serve`](super::SessionPool::serve)).
#[derive(Debug)]
pub enum SessionListener {
    /// A TCP listener.
    Tcp(TcpListener),
    /// A Unix-domain stream listener.
    Unix(UnixListener),
}

impl SessionListener {
    /// Accepts one pending connection.
    pub(crate) fn accept(&self) -> io::Result<SessionStream> {
        match self {
            SessionListener::Tcp(l) => l.accept().map(|(s, _)| SessionStream::Tcp(s)),
            SessionListener::Unix(l) => l.accept().map(|(s, _)| SessionStream::Unix(s)),
        }
    }

    pub(crate) fn make_nonblocking(&self) -> io::Result<()> {
        SockRef::from(self).set_nonblocking(true)
    }
}

impl fmt::Display for SessionListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SessionListener::Tcp(l) => match l.local_addr() {
                Ok(addr) => write!(f, "tcp {addr}"),
                Err(_) => f.write_str("tcp (unbound)"),
            },
            SessionListener::Unix(l) => match l.local_addr() {
                Ok(addr) => match addr.as_pathname() {
                    Some(path) => write!(f, "unix {}", path.display()),
                    None => f.write_str("unix (unnamed)"),
                },
                Err(_) => f.write_str("unix (unbound)"),
            },
        }
    }
}

/// The pool switches the socket to non-blocking mode when it takes it.
impl From<std::net::TcpListener> for SessionListener {
    fn from(listener: std::net::TcpListener) -> Self {
        SessionListener::Tcp(TcpListener::from_std(listener))
    }
}

/// The pool switches the socket to non-blocking mode when it takes it.
impl From<std::os::unix::net::UnixListener> for SessionListener {
    fn from(listener: std::os::unix::net::UnixListener) -> Self {
        SessionListener::Unix(UnixListener::from_std(listener))
    }
}

impl From<TcpListener> for SessionListener {
    fn from(listener: TcpListener) -> Self {
        SessionListener::Tcp(listener)
    }
}

impl From<UnixListener> for SessionListener {
    fn from(listener: UnixListener) -> Self {
        SessionListener::Unix(listener)
    }
}

impl AsFd for SessionListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            SessionListener::Tcp(l) => l.as_fd(),
            SessionListener::Unix(l) => l.as_fd(),
        }
    }
}

impl Source for SessionListener {
    fn register(&mut self, r: &Registry, t: Token, i: Interest) -> io::Result<()> {
        match self {
            SessionListener::Tcp(l) => l.register(r, t, i),
            SessionListener::Unix(l) => l.register(r, t, i),
        }
    }

    fn reregister(&mut self, r: &Registry, t: Token, i: Interest) -> io::Result<()> {
        match self {
            SessionListener::Tcp(l) => l.reregister(r, t, i),
            SessionListener::Unix(l) => l.reregister(r, t, i),
        }
    }

    fn deregister(&mut self, r: &Registry) -> io::Result<()> {
        match self {
            SessionListener::Tcp(l) => l.deregister(r),
            SessionListener::Unix(l) => l.deregister(r),
        }
    }
}
