//! How many connections wait in a listener's accept queue, for TCP and
//! Unix listeners alike.
//!
//! The kernel reports it through `sock_diag` netlink (the interface `ss`
//! uses): for a listening socket, the receive-queue figure is the number of
//! connections completed but not yet accepted, and the send-queue figure is
//! the backlog given to `listen(2)`. The socket is found by its inode, so
//! this works for any listener the process holds, in its own network
//! namespace. (`/proc/net/unix` has no queue figure, and `SIOCINQ` refuses
//! listening sockets, so netlink is the one method that covers both.)

use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6, AF_UNIX, IPPROTO_TCP};
use netlink_packet_sock_diag::inet::{self, ExtensionFlags, InetRequest, SocketId};
use netlink_packet_sock_diag::unix::nlas::UnixDiagName;
use netlink_packet_sock_diag::unix::{self, ShowFlags, UnixRequest};
use netlink_packet_sock_diag::SockDiagMessage;
use netlink_sys::{protocols::NETLINK_SOCK_DIAG, Socket, SocketAddr};

/// A listener's accept queue at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenQueue {
    /// Connections the kernel completed that nobody accepted yet.
    pub waiting: u32,
    /// The most it holds (the `listen(2)` backlog, as capped by the kernel).
    pub backlog: u32,
}

/// One listening socket the kernel reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listening {
    /// The socket's inode (what `/proc/PID/fd/N` links to as `socket:[N]`).
    pub inode: u32,
    /// Its address: `IP:PORT`, or a Unix socket's path (`@name` for an
    /// abstract one, empty when unnamed).
    pub address: String,
    /// Its accept queue.
    pub queue: ListenQueue,
}

/// The address families a listener can be in.
const FAMILIES: [u8; 3] = [AF_INET, AF_INET6, AF_UNIX];

/// The accept queue of the listening socket `fd` (TCP over IPv4 or IPv6,
/// or Unix stream). Errors name what went wrong: not a socket, not
/// listening, or netlink refused.
pub fn listen_queue(fd: BorrowedFd<'_>) -> io::Result<ListenQueue> {
    let inode = socket_inode(nix::sys::stat::fstat(fd)?.st_ino)?;
    let family = socket2::SockRef::from(&fd).local_addr()?.family();
    let family = match i32::from(family) {
        libc::AF_UNIX => AF_UNIX,
        libc::AF_INET => AF_INET,
        libc::AF_INET6 => AF_INET6,
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("address family {other} has no accept queue to read"),
            ))
        }
    };
    listeners(family)?
        .into_iter()
        .find(|l| l.inode == inode)
        .map(|l| l.queue)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("socket inode {inode} is not a listening TCP or Unix stream socket"),
            )
        })
}

/// Convenience for anything that holds a socket.
pub fn listen_queue_of(socket: &impl AsFd) -> io::Result<ListenQueue> {
    listen_queue(socket.as_fd())
}

/// Every listening TCP and Unix stream socket process `pid` holds open,
/// found through `/proc/PID/fd` (so it needs the rights to read that: the
/// same user, or root). This is how an outside observer such as
/// `forkpool top` sees a pool's accept queues.
pub fn listen_queues_of_process(pid: i32) -> io::Result<Vec<Listening>> {
    let mut inodes = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        let Ok(target) = std::fs::read_link(entry?.path()) else {
            continue; // closed while we looked
        };
        let target = target.to_string_lossy();
        if let Some(n) = target
            .strip_prefix("socket:[")
            .and_then(|t| t.strip_suffix(']'))
            .and_then(|n| n.parse::<u32>().ok())
        {
            inodes.push(n);
        }
    }
    let mut found = Vec::new();
    for family in FAMILIES {
        found.extend(
            listeners(family)?
                .into_iter()
                .filter(|l| inodes.contains(&l.inode)),
        );
    }
    Ok(found)
}

fn socket_inode(inode: u64) -> io::Result<u32> {
    u32::try_from(inode)
        .map_err(|_| io::Error::other(format!("socket inode {inode} does not fit sock_diag")))
}

fn request_for(family: u8) -> SockDiagMessage {
    if family == AF_UNIX {
        return SockDiagMessage::UnixRequest(UnixRequest {
            state_flags: unix::StateFlags::LISTEN,
            inode: 0,
            show_flags: ShowFlags::RQLEN | ShowFlags::NAME,
            cookie: [0xff; 8],
        });
    }
    let socket_id = if family == AF_INET {
        SocketId::new_v4()
    } else {
        SocketId::new_v6()
    };
    SockDiagMessage::InetRequest(InetRequest {
        family,
        protocol: IPPROTO_TCP,
        extensions: ExtensionFlags::empty(),
        states: inet::StateFlags::LISTEN,
        socket_id,
    })
}

/// Every listening socket of one family in this network namespace.
fn listeners(family: u8) -> io::Result<Vec<Listening>> {
    let mut socket = Socket::new(NETLINK_SOCK_DIAG)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    let mut packet = NetlinkMessage::new(header, request_for(family).into());
    packet.finalize();
    let mut out = vec![0; packet.buffer_len()];
    packet.serialize(&mut out);
    socket.send(&out, 0)?;

    let mut found = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let size = socket.recv(&mut &mut buf[..], 0)?;
        let mut offset = 0;
        while offset < size {
            let message = NetlinkMessage::<SockDiagMessage>::deserialize(&buf[offset..size])
                .map_err(|e| io::Error::other(format!("sock_diag answer: {e}")))?;
            let length = message.header.length as usize;
            match message.payload {
                NetlinkPayload::Done(_) => return Ok(found),
                NetlinkPayload::Error(e) => {
                    return Err(io::Error::other(format!("sock_diag refused: {e}")))
                }
                NetlinkPayload::InnerMessage(answer) => found.extend(listening(answer)),
                _ => {}
            }
            if length == 0 {
                break;
            }
            offset += length;
        }
    }
}

/// One socket of a `sock_diag` dump, as a listener and its queue.
fn listening(answer: SockDiagMessage) -> Option<Listening> {
    match answer {
        SockDiagMessage::InetResponse(r) => Some(Listening {
            inode: r.header.inode,
            address: std::net::SocketAddr::new(
                r.header.socket_id.source_address,
                r.header.socket_id.source_port,
            )
            .to_string(),
            queue: ListenQueue {
                waiting: r.header.recv_queue,
                backlog: r.header.send_queue,
            },
        }),
        SockDiagMessage::UnixResponse(r) => {
            let address = match r.name() {
                Some(UnixDiagName::Pathname(p)) => p.to_string_lossy().into_owned(),
                Some(UnixDiagName::Abstract(a)) => format!("@{}", String::from_utf8_lossy(a)),
                None => String::new(),
            };
            Some(Listening {
                inode: r.header.inode,
                address,
                queue: ListenQueue {
                    waiting: r.number_of_pending_connection().unwrap_or(0),
                    backlog: r.max_number_of_pending_connection().unwrap_or(0),
                },
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::{UnixListener, UnixStream};

    #[test]
    fn tcp_listener_counts_unaccepted_connections() {
        for addr in ["127.0.0.1:0", "[::1]:0"] {
            let Ok(listener) = std::net::TcpListener::bind(addr) else {
                // No IPv6 loopback on this machine.
                continue;
            };
            let local = listener.local_addr().unwrap();
            let empty = listen_queue_of(&listener).unwrap();
            assert_eq!(empty.waiting, 0, "{addr}");
            assert!(empty.backlog > 0, "{addr}");
            let clients: Vec<_> = (0..5)
                .map(|_| std::net::TcpStream::connect(local).unwrap())
                .collect();
            assert_eq!(listen_queue_of(&listener).unwrap().waiting, 5, "{addr}");
            let _ = listener.accept().unwrap();
            assert_eq!(listen_queue_of(&listener).unwrap().waiting, 4, "{addr}");
            drop(clients);
        }
    }

    #[test]
    fn unix_listener_counts_unaccepted_connections() {
        let dir = std::env::temp_dir().join(format!("forkpool-queue-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("q.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        assert_eq!(listen_queue_of(&listener).unwrap().waiting, 0);
        let clients: Vec<_> = (0..3)
            .map(|_| UnixStream::connect(&path).unwrap())
            .collect();
        let queue = listen_queue_of(&listener).unwrap();
        assert_eq!(queue.waiting, 3);
        assert!(queue.backlog >= 3);
        // Seen from outside, through this process's fd table, by its path.
        let mine = listen_queues_of_process(std::process::id() as i32).unwrap();
        let entry = mine
            .iter()
            .find(|l| l.address == path.to_string_lossy())
            .expect("own Unix listener listed");
        assert_eq!(entry.queue.waiting, 3);
        drop(clients);
        drop(listener);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_socket_that_does_not_listen_is_an_error() {
        let (a, _b) = UnixStream::pair().unwrap();
        assert!(listen_queue_of(&a).is_err());
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        assert!(listen_queue_of(&file).is_err());
    }
}
