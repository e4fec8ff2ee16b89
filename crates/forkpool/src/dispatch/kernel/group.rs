//! One listener's `SO_REUSEPORT` group: a listening socket per slot, the
//! supervisor's own listener as the overflow socket, and the program that
//! picks among them by the pool's scoreboard.
//!
//! The supervisor creates and keeps every socket. A slot's socket is made
//! the first time the slot is used and lives until the pool stops, so a
//! child that dies loses nothing queued on it: the child that takes the
//! slot next inherits the socket, queue and all.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;
use socket2::{Domain, SockAddr, Socket, Type};

use super::program::{pick_lowest_idle, MAX_SLOTS};
use crate::sys::bpf;

/// Why kernel dispatch cannot run here: the supervisor then falls back to
/// `handoff`, says so once in the log and in status (`dispatch_fallback`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unavailable {
    /// The listener is not TCP (a Unix socket): no `SO_REUSEPORT` groups.
    NotTcp,
    /// The listener was not bound with `SO_REUSEPORT` (a socket passed by
    /// systemd or an older supervisor), so no socket can join its group.
    NoGroup,
    /// More slots than the program scans.
    TooManySlots(usize),
    /// The kernel refused to create a map or load the program for lack of
    /// privilege (`EPERM`: no `CAP_BPF` and `CAP_NET_ADMIN`).
    NotPermitted,
    /// The kernel does not know a map type, flag or instruction the
    /// program needs (too old: Linux 5.12 or later is needed).
    Unsupported(String),
    /// Something else failed while building the group.
    Failed(String),
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unavailable::NotTcp => write!(
                f,
                "the listener is not TCP (kernel dispatch needs a SO_REUSEPORT group)"
            ),
            Unavailable::NoGroup => write!(
                f,
                "the listener was passed in without SO_REUSEPORT, so no socket can join its group; \
                 let forkpool bind it, or set ReusePort=yes in the systemd socket unit"
            ),
            Unavailable::TooManySlots(n) => write!(
                f,
                "{n} slots: the kernel program scans at most {MAX_SLOTS}; lower --max-children"
            ),
            Unavailable::NotPermitted => write!(
                f,
                "the kernel refused to load the eBPF program (no CAP_BPF and CAP_NET_ADMIN): \
                 run as root or grant those capabilities"
            ),
            Unavailable::Unsupported(why) => write!(
                f,
                "the kernel cannot run the program ({why}); Linux 5.12 or later is needed"
            ),
            Unavailable::Failed(why) => write!(f, "{why}"),
        }
    }
}

/// What an error from the kernel while building kernel dispatch means.
pub fn refused(what: &str, errno: Errno) -> Unavailable {
    match errno {
        Errno::EPERM | Errno::EACCES => Unavailable::NotPermitted,
        Errno::EINVAL | Errno::ENOSYS | Errno::EOPNOTSUPP | Errno::E2BIG => {
            Unavailable::Unsupported(format!("{what}: {errno}"))
        }
        _ => Unavailable::Failed(format!("{what}: {errno}")),
    }
}

/// A listener's group.
pub struct Group {
    sockets_map: OwnedFd,
    _program: OwnedFd,
    local: SockAddr,
    domain: Domain,
    backlog: i32,
    sockets: Vec<Option<OwnedFd>>,
    /// Slots whose socket is out of the socket array ([`Group::take_off`]).
    off: Vec<bool>,
    /// What the listener's accepted connections inherit from it, which a
    /// slot's socket must give its connections too: the read and write
    /// timeouts (the demo's keep-alive limit) and `TCP_DEFER_ACCEPT`.
    inherited: Inherited,
}

/// Options a listening socket passes on, or applies to what it queues.
#[derive(Debug, Clone, Copy, Default)]
struct Inherited {
    read_timeout: Option<std::time::Duration>,
    write_timeout: Option<std::time::Duration>,
    defer_accept: u32,
}

impl Inherited {
    fn of(listener: BorrowedFd<'_>) -> Inherited {
        let sock = socket2::SockRef::from(&listener);
        Inherited {
            read_timeout: sock.read_timeout().ok().flatten(),
            write_timeout: sock.write_timeout().ok().flatten(),
            defer_accept: crate::sys::socket::defer_accept(listener).unwrap_or(0),
        }
    }

    fn apply(&self, socket: BorrowedFd<'_>) -> io::Result<()> {
        let sock = socket2::SockRef::from(&socket);
        sock.set_read_timeout(self.read_timeout)?;
        sock.set_write_timeout(self.write_timeout)?;
        crate::sys::socket::set_defer_accept(socket, self.defer_accept)
    }
}

impl Group {
    /// Whether `listener` can have a group (TCP, bound with
    /// `SO_REUSEPORT`): its address and family if so. Asks the kernel
    /// nothing that needs privilege.
    pub fn check(listener: BorrowedFd<'_>) -> Result<(SockAddr, Domain), Unavailable> {
        let listener = socket2::SockRef::from(&listener);
        let local = listener
            .local_addr()
            .map_err(|e| Unavailable::Failed(format!("the listener's address: {e}")))?;
        let domain = match local.as_socket() {
            Some(std::net::SocketAddr::V4(_)) => Domain::IPV4,
            Some(std::net::SocketAddr::V6(_)) => Domain::IPV6,
            None => return Err(Unavailable::NotTcp),
        };
        if !listener.reuse_port().unwrap_or(false) {
            return Err(Unavailable::NoGroup);
        }
        Ok((local, domain))
    }

    /// Builds the group around `overflow`, the supervisor's listening
    /// socket (bound with `SO_REUSEPORT`), for `slots` slots of the
    /// scoreboard map `board`: the sockarray (the overflow socket at index
    /// `slots`) and the program, attached. Slot sockets come with
    /// [`Group::socket`].
    pub fn new(
        overflow: BorrowedFd<'_>,
        board: BorrowedFd<'_>,
        slots: usize,
        backlog: u32,
    ) -> Result<Group, Unavailable> {
        if slots > MAX_SLOTS || slots == 0 {
            return Err(Unavailable::TooManySlots(slots));
        }
        let (local, domain) = Group::check(overflow)?;
        let sockets_map = bpf::create_sockarray(slots as u32 + 1, "forkpool_socks")
            .map_err(|e| refused("creating the socket array", e))?;
        bpf::sockarray_set(sockets_map.as_fd(), slots as u32, overflow)
            .map_err(|e| refused("putting the listener in the socket array", e))?;
        let insns: Vec<u64> = pick_lowest_idle(board.as_raw_fd(), sockets_map.as_raw_fd(), slots)
            .into_iter()
            .map(|i| i.encode())
            .collect();
        let program = bpf::load_program(bpf::PROG_TYPE_SK_REUSEPORT, &insns, "forkpool_pick")
            .map_err(|e| {
                let mut why = refused("loading the program", e.errno);
                if let Unavailable::Unsupported(text) = &mut why {
                    if !e.log.is_empty() {
                        text.push_str("; the verifier said: ");
                        text.push_str(e.log.trim());
                    }
                }
                why
            })?;
        bpf::attach_reuseport(overflow, program.as_fd())
            .map_err(|e| refused("attaching the program", e))?;
        Ok(Group {
            sockets_map,
            _program: program,
            local,
            domain,
            backlog: i32::try_from(backlog).unwrap_or(i32::MAX),
            sockets: (0..slots).map(|_| None).collect(),
            off: vec![false; slots],
            inherited: Inherited::of(overflow),
        })
    }

    /// `slot`'s listening socket, made (and put in the group) the first
    /// time it is asked for.
    pub fn socket(&mut self, slot: usize) -> io::Result<BorrowedFd<'_>> {
        if self.sockets[slot].is_none() {
            let socket = Socket::new(self.domain, Type::STREAM, None)?;
            socket.set_reuse_address(true)?;
            socket.set_reuse_port(true)?;
            if self.domain == Domain::IPV6 {
                socket.set_only_v6(true)?;
            }
            socket.set_tcp_nodelay(true)?;
            socket.bind(&self.local)?;
            socket.listen(self.backlog)?;
            socket.set_nonblocking(true)?;
            let fd = OwnedFd::from(socket);
            self.inherited.apply(fd.as_fd())?;
            bpf::sockarray_set(self.sockets_map.as_fd(), slot as u32, fd.as_fd())
                .map_err(|e| io::Error::from_raw_os_error(e as i32))?;
            self.sockets[slot] = Some(fd);
        }
        Ok(self.sockets[slot].as_ref().expect("made above").as_fd())
    }

    /// `slot`'s socket, made if need be, and in the socket array (again,
    /// after [`Group::take_off`]): before a child is forked into it.
    pub fn seat(&mut self, slot: usize) -> io::Result<()> {
        self.socket(slot)?;
        if std::mem::take(&mut self.off[slot]) {
            let fd = self.sockets[slot].as_ref().expect("made above").as_fd();
            bpf::sockarray_set(self.sockets_map.as_fd(), slot as u32, fd)
                .map_err(|e| io::Error::from_raw_os_error(e as i32))?;
        }
        Ok(())
    }

    /// Takes `slot`'s socket out of the socket array: the program's pick
    /// of the slot then fails and it looks further, so no new connection
    /// is queued there, whatever the child's state on the board says. For
    /// a child that must take no more connections (it is told to quit);
    /// what is already queued stays, for it or the supervisor to take.
    pub fn take_off(&mut self, slot: usize) -> io::Result<()> {
        if self.sockets.get(slot).is_some_and(Option::is_some) && !self.off[slot] {
            bpf::sockarray_clear(self.sockets_map.as_fd(), slot as u32)
                .map_err(|e| io::Error::from_raw_os_error(e as i32))?;
            self.off[slot] = true;
        }
        Ok(())
    }

    /// `TCP_DEFER_ACCEPT` changed on the listener (a reload): every slot's
    /// socket follows, and those made later.
    pub fn follow_defer_accept(&mut self, listener: BorrowedFd<'_>) -> io::Result<()> {
        self.inherited.defer_accept = crate::sys::socket::defer_accept(listener)?;
        for fd in self.sockets.iter().flatten() {
            crate::sys::socket::set_defer_accept(fd.as_fd(), self.inherited.defer_accept)?;
        }
        Ok(())
    }

    /// Takes the listener out of this group's socket array, so a new
    /// supervisor (an upgrade) can put it in its own: a socket is in one
    /// array at a time. Until then the program's overflow pick fails and
    /// the kernel's hash picks among the group's sockets, every one of
    /// which has a taker.
    pub fn release_overflow(&self) -> io::Result<()> {
        bpf::sockarray_clear(self.sockets_map.as_fd(), self.sockets.len() as u32)
            .map_err(|e| io::Error::from_raw_os_error(e as i32))
    }

    /// Puts the listener back as the overflow (an upgrade that failed).
    pub fn restore_overflow(&self, listener: BorrowedFd<'_>) -> io::Result<()> {
        bpf::sockarray_set(
            self.sockets_map.as_fd(),
            self.sockets.len() as u32,
            listener,
        )
        .map_err(|e| io::Error::from_raw_os_error(e as i32))
    }

    /// `slot`'s socket if it has been made.
    pub fn existing(&self, slot: usize) -> Option<BorrowedFd<'_>> {
        self.sockets[slot].as_ref().map(|fd| fd.as_fd())
    }

    /// Takes `slot`'s socket out of the group's keeping (in a freshly
    /// forked child, which keeps only its own).
    pub fn take(&mut self, slot: usize) -> Option<OwnedFd> {
        self.sockets[slot].take()
    }
}
