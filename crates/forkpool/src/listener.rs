//! Listening sockets: addresses, binding, and the stream type a handler gets.
//!
//! The supervisor binds every listener before it forks anything, so children
//! (or a re-executed supervisor) inherit them; a listener never closes while
//! the pool runs.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::str::FromStr;

use socket2::{Domain, SockAddr, Socket, Type};

/// Where a listener listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// A TCP address, IPv4 or IPv6.
    Tcp(SocketAddr),
    /// A Unix stream socket at this path.
    Unix(PathBuf),
}

impl FromStr for ListenAddr {
    type Err = String;

    /// `127.0.0.1:8080`, `[::1]:8080`, `localhost:8080` or `unix:/run/app.sock`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if let Some(path) = text.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("'unix:' needs a path, like unix:/run/forkpool.sock".into());
            }
            return Ok(ListenAddr::Unix(PathBuf::from(path)));
        }
        let mut addrs = text.to_socket_addrs().map_err(|e| {
            format!("'{text}' is not a listen address ({e}); write HOST:PORT or unix:PATH")
        })?;
        addrs
            .next()
            .map(ListenAddr::Tcp)
            .ok_or_else(|| format!("'{text}' resolves to no address"))
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Tcp(addr) => write!(f, "{addr}"),
            ListenAddr::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// A bound, listening, non-blocking socket.
#[derive(Debug)]
pub struct Listener {
    fd: OwnedFd,
    addr: ListenAddr,
    name: String,
}

impl Listener {
    /// Binds and listens on `addr` with the given backlog. A TCP port of 0
    /// picks a free port; [`Listener::local_addr`] tells which.
    pub fn bind(addr: &ListenAddr, backlog: u32) -> io::Result<Listener> {
        Listener::bind_with(addr, backlog, false)
    }

    /// Like [`Listener::bind`]; with `reuse_port`, a TCP listener also
    /// starts a `SO_REUSEPORT` group that kernel dispatch adds a socket per
    /// slot to. The option is set after `bind`, so binding still fails
    /// when anything else holds the address (a second pool on the same
    /// port is an error, not a silent share); only sockets that set the
    /// option, as the same user, can join the group afterwards.
    pub fn bind_with(addr: &ListenAddr, backlog: u32, reuse_port: bool) -> io::Result<Listener> {
        let backlog = i32::try_from(backlog).unwrap_or(i32::MAX);
        let context = |e: io::Error, what: &str| {
            io::Error::new(e.kind(), format!("cannot {what} {addr}: {e}"))
        };
        let socket = match addr {
            ListenAddr::Tcp(sa) => {
                let socket = Socket::new(Domain::for_address(*sa), Type::STREAM, None)
                    .map_err(|e| context(e, "create a socket for"))?;
                socket
                    .set_reuse_address(true)
                    .map_err(|e| context(e, "set SO_REUSEADDR on"))?;
                if sa.is_ipv6() {
                    socket
                        .set_only_v6(true)
                        .map_err(|e| context(e, "set IPV6_V6ONLY on"))?;
                }
                socket.bind(&(*sa).into()).map_err(|e| context(e, "bind"))?;
                if reuse_port {
                    socket
                        .set_reuse_port(true)
                        .map_err(|e| context(e, "set SO_REUSEPORT on"))?;
                }
                // Accepted sockets inherit TCP_NODELAY from the listener on
                // Linux: set once here instead of once per connection.
                socket
                    .set_tcp_nodelay(true)
                    .map_err(|e| context(e, "set TCP_NODELAY on"))?;
                socket
            }
            ListenAddr::Unix(path) => {
                remove_stale_socket(path)?;
                let socket = Socket::new(Domain::UNIX, Type::STREAM, None)
                    .map_err(|e| context(e, "create a socket for"))?;
                let sa = SockAddr::unix(path).map_err(|e| context(e, "use"))?;
                socket.bind(&sa).map_err(|e| context(e, "bind"))?;
                socket
            }
        };
        socket
            .listen(backlog)
            .map_err(|e| context(e, "listen on"))?;
        socket
            .set_nonblocking(true)
            .map_err(|e| context(e, "set O_NONBLOCK on"))?;
        let addr = match addr {
            ListenAddr::Tcp(_) => {
                let local = socket.local_addr()?.as_socket().ok_or_else(|| {
                    io::Error::other(format!("{addr}: bound socket has no TCP address"))
                })?;
                ListenAddr::Tcp(local)
            }
            unix => unix.clone(),
        };
        Ok(Listener {
            fd: socket.into(),
            addr,
            name: String::new(),
        })
    }

    /// Takes the listening sockets passed by systemd socket activation or
    /// by a supervisor upgrading itself (`LISTEN_FDS`, `LISTEN_PID`,
    /// `LISTEN_FDNAMES`), in order, and removes those variables so that
    /// children do not see them. Empty when none were passed to this process.
    pub fn inherited() -> io::Result<Vec<Listener>> {
        let passed = crate::sys::socket::take_listen_fds()?;
        passed
            .into_iter()
            .map(|(fd, name)| {
                let socket = Socket::from(fd);
                socket.set_nonblocking(true)?;
                let local = socket.local_addr()?;
                let addr = if let Some(sa) = local.as_socket() {
                    socket.set_tcp_nodelay(true)?;
                    ListenAddr::Tcp(sa)
                } else if let Some(path) = local.as_pathname() {
                    ListenAddr::Unix(path.to_path_buf())
                } else {
                    return Err(io::Error::other(
                        "an inherited socket is neither TCP nor a Unix socket with a path",
                    ));
                };
                let name = if name == "unknown" {
                    String::new()
                } else {
                    name
                };
                Ok(Listener {
                    fd: socket.into(),
                    addr,
                    name,
                })
            })
            .collect()
    }

    /// Names the listener (in logs, status and `LISTEN_FDNAMES`).
    pub fn with_name(mut self, name: impl Into<String>) -> Listener {
        self.name = name.into();
        self
    }

    /// A slot's own socket in `pool`'s `SO_REUSEPORT` group (kernel
    /// dispatch), standing for that listener in the child: same address,
    /// same name.
    pub(crate) fn from_group_socket(fd: OwnedFd, pool: &Listener) -> Listener {
        Listener {
            fd,
            addr: pool.addr.clone(),
            name: pool.name.clone(),
        }
    }

    /// The listener's name; empty when it has none.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sets `SO_RCVTIMEO` on the listening socket. Linux copies it to every
    /// accepted TCP connection, so a handler's reads time out without a
    /// `setsockopt` per connection. Unix-socket connections are created
    /// afresh on accept and do not inherit it: set it on those streams.
    pub fn set_read_timeout(&self, timeout: std::time::Duration) -> io::Result<()> {
        socket2::SockRef::from(&self.fd).set_read_timeout(Some(timeout))
    }

    /// Sets `TCP_DEFER_ACCEPT` (whole seconds; zero turns it off): a
    /// connection is reported only once the client has sent data. Unix
    /// listeners have no such option and are left alone.
    pub fn set_defer_accept(&self, defer: std::time::Duration) -> io::Result<()> {
        if !self.is_tcp() {
            return Ok(());
        }
        let seconds = u32::try_from(defer.as_secs()).unwrap_or(u32::MAX);
        crate::sys::socket::set_defer_accept(self.fd.as_fd(), seconds).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot set TCP_DEFER_ACCEPT on {}: {e}", self.addr),
            )
        })
    }

    /// Sets the permission bits of a Unix listener's socket file.
    pub fn set_unix_mode(&self, mode: u32) -> io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        if let ListenAddr::Unix(path) = &self.addr {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
        }
        Ok(())
    }

    /// Wraps one listening socket an exec'd worker inherited at a known
    /// descriptor (see [`crate::worker::ExecWorker`]), after checking that
    /// it is one: a stream socket, TCP or Unix, in the listening state.
    /// Unlike [`Listener::inherited`], which is for a supervisor started by
    /// systemd, it leaves the socket's flags alone: the open file is shared
    /// with the supervisor and every other worker.
    pub fn from_inherited(fd: OwnedFd) -> io::Result<Listener> {
        let sock = socket2::SockRef::from(&fd);
        let not_a_listener = |what: String| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "descriptor {} is {what}, not a listening socket",
                    fd.as_raw_fd()
                ),
            )
        };
        if sock.r#type()? != Type::STREAM {
            return Err(not_a_listener("not a stream socket".into()));
        }
        if !sock.is_listener()? {
            return Err(not_a_listener("a socket that is not listening".into()));
        }
        let local = sock.local_addr()?;
        let addr = match sock.domain()? {
            Domain::IPV4 | Domain::IPV6 => ListenAddr::Tcp(
                local
                    .as_socket()
                    .ok_or_else(|| not_a_listener("an IP socket without an address".into()))?,
            ),
            Domain::UNIX => ListenAddr::Unix(
                local
                    .as_pathname()
                    .map_or_else(|| PathBuf::from("(unnamed)"), |p| p.to_path_buf()),
            ),
            other => return Err(not_a_listener(format!("a socket of domain {other:?}"))),
        };
        Ok(Listener {
            fd,
            addr,
            name: String::new(),
        })
    }

    /// The address actually bound (with the real port when 0 was asked).
    pub fn local_addr(&self) -> &ListenAddr {
        &self.addr
    }

    /// Connections waiting in the accept queue, where the kernel tells
    /// (TCP); 0 otherwise.
    pub fn queued(&self) -> u32 {
        match self.addr {
            ListenAddr::Tcp(_) => {
                crate::sys::socket::tcp_accept_queue_len(self.fd.as_fd()).unwrap_or(0)
            }
            ListenAddr::Unix(_) => 0,
        }
    }

    /// Whether connections are TCP (vs Unix).
    pub fn is_tcp(&self) -> bool {
        matches!(self.addr, ListenAddr::Tcp(_))
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for Listener {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl From<Listener> for OwnedFd {
    fn from(listener: Listener) -> OwnedFd {
        listener.fd
    }
}

/// Removes a socket file left behind by a server that is gone, and refuses
/// to touch a path that is not a socket or that a live server answers on.
pub(crate) fn remove_stale_socket(path: &std::path::Path) -> io::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} exists and is not a socket; remove it or choose another path",
                path.display()
            ),
        ));
    }
    if UnixStream::connect(path).is_ok() {
        return Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "another server is listening on {}; stop it or choose another path",
                path.display()
            ),
        ));
    }
    std::fs::remove_file(path)
}

/// A connected client stream handed to a handler.
#[derive(Debug)]
pub enum Stream {
    /// A TCP connection.
    Tcp(TcpStream),
    /// A Unix-socket connection.
    Unix(UnixStream),
}

impl Stream {
    /// Wraps an accepted descriptor; `tcp` says which kind it is.
    pub fn from_fd(fd: OwnedFd, tcp: bool) -> Stream {
        if tcp {
            // TCP_NODELAY came with the socket from the listener.
            Stream::Tcp(TcpStream::from(fd))
        } else {
            Stream::Unix(UnixStream::from(fd))
        }
    }

    /// Sets the read timeout (None: block forever).
    pub fn set_read_timeout(&self, timeout: Option<std::time::Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(timeout),
            Stream::Unix(s) => s.set_read_timeout(timeout),
        }
    }

    /// Writes all of `buf` as the last bytes before the stream is closed
    /// (dropped) right after. On TCP the end of the connection then comes
    /// in the same packet as them (`MSG_MORE`), which saves the client and
    /// the server a packet each; a stream kept open after this would hold
    /// a partial segment back until its close.
    pub fn write_all_before_close(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => crate::sys::socket::send_all_before_close(s.as_fd(), buf),
            Stream::Unix(s) => s.write_all(buf),
        }
    }

    /// The peer's address, for logs (`unix` for Unix sockets).
    pub fn peer(&self) -> String {
        match self {
            Stream::Tcp(s) => s
                .peer_addr()
                .map_or_else(|_| "unknown".into(), |a| a.to_string()),
            Stream::Unix(_) => "unix".into(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
        }
    }
}

impl AsFd for Stream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Tcp(s) => s.as_fd(),
            Stream::Unix(s) => s.as_fd(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tcp_and_unix() {
        assert_eq!(
            "127.0.0.1:80".parse::<ListenAddr>().unwrap(),
            ListenAddr::Tcp("127.0.0.1:80".parse().unwrap())
        );
        assert_eq!(
            "unix:/tmp/x.sock".parse::<ListenAddr>().unwrap(),
            ListenAddr::Unix("/tmp/x.sock".into())
        );
        assert!("unix:"
            .parse::<ListenAddr>()
            .unwrap_err()
            .contains("needs a path"));
        assert!("nonsense"
            .parse::<ListenAddr>()
            .unwrap_err()
            .contains("HOST:PORT"));
    }

    #[test]
    fn port_zero_reports_the_real_port() {
        let l = Listener::bind(&"127.0.0.1:0".parse().unwrap(), 16).unwrap();
        match l.local_addr() {
            ListenAddr::Tcp(a) => assert_ne!(a.port(), 0),
            other => panic!("unexpected {other}"),
        }
    }

    #[test]
    fn queued_counts_unaccepted_connections() {
        let l = Listener::bind(&"127.0.0.1:0".parse().unwrap(), 16).unwrap();
        let ListenAddr::Tcp(addr) = *l.local_addr() else {
            unreachable!()
        };
        assert_eq!(l.queued(), 0);
        let _a = TcpStream::connect(addr).unwrap();
        let _b = TcpStream::connect(addr).unwrap();
        assert_eq!(l.queued(), 2);
    }

    #[test]
    fn accepted_connections_inherit_nodelay() {
        let l = Listener::bind(&"127.0.0.1:0".parse().unwrap(), 16).unwrap();
        let ListenAddr::Tcp(addr) = *l.local_addr() else {
            unreachable!()
        };
        let _client = TcpStream::connect(addr).unwrap();
        let fd = crate::sys::socket::accept(l.as_fd()).unwrap();
        assert!(TcpStream::from(fd).nodelay().unwrap());
    }

    #[test]
    fn accepted_connections_inherit_the_read_timeout() {
        let l = Listener::bind(&"127.0.0.1:0".parse().unwrap(), 16).unwrap();
        l.set_read_timeout(std::time::Duration::from_secs(7))
            .unwrap();
        let ListenAddr::Tcp(addr) = *l.local_addr() else {
            unreachable!()
        };
        let _client = TcpStream::connect(addr).unwrap();
        let fd = crate::sys::socket::accept(l.as_fd()).unwrap();
        let timeout = TcpStream::from(fd).read_timeout().unwrap();
        assert_eq!(timeout, Some(std::time::Duration::from_secs(7)));
    }

    #[test]
    fn an_inherited_listener_keeps_its_address_and_a_non_listener_is_refused() {
        let l = Listener::bind(&"127.0.0.1:0".parse().unwrap(), 16).unwrap();
        let addr = l.local_addr().clone();
        let again = Listener::from_inherited(OwnedFd::from(l)).unwrap();
        assert_eq!(again.local_addr(), &addr);
        assert!(again.is_tcp());
        let (a, _b) = UnixStream::pair().unwrap();
        let err = Listener::from_inherited(OwnedFd::from(a)).unwrap_err();
        assert!(err.to_string().contains("not a listening socket"), "{err}");
    }

    #[test]
    fn stale_unix_socket_is_replaced_but_a_live_one_is_not() {
        let dir = std::env::temp_dir().join(format!("forkpool-listener-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let addr = ListenAddr::Unix(path.clone());
        let live = Listener::bind(&addr, 4).unwrap();
        let err = Listener::bind(&addr, 4).unwrap_err();
        assert!(err.to_string().contains("another server is listening"));
        drop(live);
        Listener::bind(&addr, 4).expect("stale socket file should be replaced");
        std::fs::write(dir.join("plain"), b"x").unwrap();
        let err = Listener::bind(&ListenAddr::Unix(dir.join("plain")), 4).unwrap_err();
        assert!(err.to_string().contains("not a socket"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
