//! The supervisor's own small servers: the control socket, which writes
//! a JSON snapshot to whoever connects; the Prometheus metrics endpoint,
//! which answers any HTTP request with the text exposition (and `/live`
//! and `/ready`, see [`crate::fleet`]); and HAProxy's agent check, one
//! line per connection.
//!
//! They have a poll of their own, watched by the loop's as one source,
//! and run at the end of a turn in which that poll woke the loop, once
//! the loop has published the pool's state (`published.rs`): they answer
//! from that alone (`answers.rs`), never
//! from the core. The supervisor forks its children, so it stays one
//! thread; the endpoints are bounded instead. All write without
//! blocking; a client that does not read is dropped after
//! [`CLIENT_TIMEOUT`]. At most [`MAX_ENDPOINT_CLIENTS`] are served at
//! once, and never from the last [`FD_RESERVE`] descriptors: either way
//! the oldest client is closed to make room. A turn handles at most
//! [`ROUNDS_PER_TURN`] rounds of their events. An accept that fails for
//! want of descriptors or memory pauses accepting for [`ACCEPT_PAUSE`];
//! the pause's end is a deadline of the loop's, and what waited on the
//! listeners meanwhile is taken then (their poll is edge-triggered: no
//! new event would come for it).

mod answers;

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use mio::{Interest, Token};
use nix::sys::stat::{umask, Mode};
use tracing::warn;

use crate::policy::backoff::ACCEPT_PAUSE;

pub(crate) use answers::Sources;

use super::event::Event;
use super::Supervisor;

/// The endpoints' own tokens: a client's is its index in the table.
const CONTROL_TOKEN: Token = Token(usize::MAX - 1);
const METRICS_TOKEN: Token = Token(usize::MAX - 2);
const AGENT_TOKEN: Token = Token(usize::MAX - 3);
/// Events taken from the endpoints' poll at once.
const EVENTS_PER_ROUND: usize = 64;
/// Rounds of events a turn of the loop serves; the rest wait a turn.
const ROUNDS_PER_TURN: usize = 4;

/// How long a status or metrics client may take.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest HTTP request head read from a metrics client.
const MAX_REQUEST: usize = 8 * 1024;
/// The most status and metrics clients served at once; one more closes
/// the oldest, so a crowd of idle clients cannot grow the supervisor's
/// descriptor table, and a fresh `forkpool status` still gets through.
pub(crate) const MAX_ENDPOINT_CLIENTS: usize = 64;
/// Descriptors below `RLIMIT_NOFILE` kept for the pool's own work
/// (connections, children's channels and pipes): a client accepted into
/// this reserve makes the oldest client close, so clients never add to
/// the descriptors in use once it is reached.
pub(crate) const FD_RESERVE: u64 = 32;

/// The `LISTEN_FDNAMES` name of the metrics listener passed to a `USR2`
/// successor.
pub const METRICS_FD_NAME: &str = "forkpool-metrics";
/// The `LISTEN_FDNAMES` name of the agent-check listener passed to a
/// `USR2` successor.
pub const AGENT_FD_NAME: &str = "forkpool-agent";

/// The bound control socket and metrics listener, and their clients.
pub(crate) struct Endpoints {
    control: Option<ControlSocket>,
    metrics: Option<TcpListener>,
    agent: Option<TcpListener>,
    clients: Vec<Option<Client>>,
    /// Clients closed early to make room (too many, or few descriptors left).
    displaced: u64,
    /// Their own poll, made when they are registered with the loop's.
    poll: Option<mio::Poll>,
    events: mio::Events,
    /// The tokens of one round's events.
    ready: Vec<Token>,
    /// Events were left in the poll at the end of the last turn.
    more: bool,
    /// Rounds of events a turn serves ([`ROUNDS_PER_TURN`]).
    rounds: usize,
    /// No accepts until then: the last one failed for want of descriptors
    /// or memory.
    paused_until: Option<Instant>,
}

impl Default for Endpoints {
    fn default() -> Self {
        Endpoints {
            control: None,
            metrics: None,
            agent: None,
            clients: Vec::new(),
            displaced: 0,
            poll: None,
            events: mio::Events::with_capacity(EVENTS_PER_ROUND),
            ready: Vec::with_capacity(EVENTS_PER_ROUND),
            more: false,
            rounds: ROUNDS_PER_TURN,
            paused_until: None,
        }
    }
}

struct ControlSocket {
    listener: UnixListener,
    /// Where the socket file is now.
    path: PathBuf,
    /// Where it belongs: differs from `path` in a `USR2` successor until
    /// it is ready and takes its predecessor's place.
    home: PathBuf,
    inode: u64,
}

enum ClientStream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

/// What one accept on an endpoint's listener gave.
enum Accept {
    Client(ClientStream),
    /// Nothing waits, or the endpoint is not open.
    Nothing,
    /// A connection that went away before it was taken: try the next.
    Skipped,
    /// The supervisor is out of descriptors or memory (or the listener
    /// broke): accepting pauses.
    Failed(io::Error),
}

struct Client {
    stream: ClientStream,
    /// Metrics clients send a request first; the answer follows its end.
    request: Option<Vec<u8>>,
    out: Vec<u8>,
    written: usize,
    since: Instant,
}

impl Endpoints {
    /// Binds the control socket at `path`, mode 0600, once its directory
    /// passes [`control_path::prepare`](crate::control_path::prepare)
    /// (made private if missing; refused if other users could replace the
    /// socket). A stale socket file
    /// is replaced; one a live supervisor answers on is an error, unless
    /// `take_over` (a binary upgrade replacing its predecessor's socket).
    pub fn bind_control(&mut self, path: &Path, take_over: bool) -> io::Result<()> {
        crate::control_path::prepare(path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("refusing the control socket {}: {e}", path.display()),
            )
        })?;
        // A successor binds beside its predecessor's socket and moves it
        // into place only once it is ready: until then `forkpool status`
        // reaches the running supervisor, and a successor that fails
        // leaves it alone.
        let home = path.to_path_buf();
        let waiting = take_over.then(|| {
            let mut name = path.as_os_str().to_os_string();
            name.push(format!(".{}", std::process::id()));
            PathBuf::from(name)
        });
        let path = waiting.as_deref().unwrap_or(path);
        crate::listener::remove_stale_socket(path)?;
        // Create the socket file owner-only from the start, not chmod it
        // after: nobody else may connect in between.
        let old = umask(Mode::from_bits_truncate(0o177));
        let bound = UnixListener::bind(path);
        umask(old);
        let listener = bound.map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot bind the control socket {}: {e}", path.display()),
            )
        })?;
        let inode = std::fs::metadata(path)?.ino();
        self.control = Some(ControlSocket {
            listener,
            path: path.to_path_buf(),
            home,
            inode,
        });
        Ok(())
    }

    /// In a `USR2` successor that became ready: moves the control socket
    /// over its predecessor's (one atomic rename, so `forkpool status`
    /// always finds one of the two).
    pub fn take_control_home(&mut self) -> io::Result<()> {
        if let Some(c) = self.control.as_mut() {
            if c.path != c.home {
                std::fs::rename(&c.path, &c.home)?;
                c.path = c.home.clone();
            }
        }
        Ok(())
    }

    /// Removes the control socket file a failed successor with this pid
    /// left beside ours (see [`Endpoints::bind_control`]).
    pub fn remove_successor_control(&self, pid: i32) {
        if let Some(c) = &self.control {
            let mut name = c.home.as_os_str().to_os_string();
            name.push(format!(".{pid}"));
            let _ = std::fs::remove_file(PathBuf::from(name));
        }
    }

    /// Adopts a metrics listener passed by a predecessor.
    pub fn adopt_metrics(&mut self, fd: std::os::fd::OwnedFd) -> io::Result<SocketAddr> {
        let listener = adopt_tcp(fd)?;
        let local = listener.local_addr()?;
        self.metrics = Some(listener);
        Ok(local)
    }

    /// Adopts an agent-check listener passed by a predecessor.
    pub fn adopt_agent(&mut self, fd: std::os::fd::OwnedFd) -> io::Result<SocketAddr> {
        let listener = adopt_tcp(fd)?;
        let local = listener.local_addr()?;
        self.agent = Some(listener);
        Ok(local)
    }

    /// The metrics and agent listeners with their `LISTEN_FDNAMES` names,
    /// for a `USR2` successor.
    pub fn passable(&self) -> Vec<(std::os::fd::BorrowedFd<'_>, &'static str)> {
        use std::os::fd::AsFd;
        let mut out = Vec::new();
        if let Some(m) = &self.metrics {
            out.push((m.as_fd(), METRICS_FD_NAME));
        }
        if let Some(a) = &self.agent {
            out.push((a.as_fd(), AGENT_FD_NAME));
        }
        out
    }

    /// Binds the metrics endpoint.
    pub fn bind_metrics(&mut self, addr: SocketAddr) -> io::Result<SocketAddr> {
        let (listener, local) = bind_tcp(addr, "the metrics endpoint")?;
        self.metrics = Some(listener);
        Ok(local)
    }

    /// Binds the HAProxy agent-check port.
    pub fn bind_agent(&mut self, addr: SocketAddr) -> io::Result<SocketAddr> {
        let (listener, local) = bind_tcp(addr, "the agent-check port")?;
        self.agent = Some(listener);
        Ok(local)
    }

    /// True when a balancer can be told the pool is draining: an agent
    /// port or a readiness endpoint (on the metrics address) is served.
    pub fn can_announce(&self) -> bool {
        self.agent.is_some() || self.metrics.is_some()
    }

    /// Makes the endpoints' own poll, watches the bound listeners with
    /// it, and has the loop's `registry` watch that poll.
    pub fn register(&mut self, registry: &mio::Registry) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let poll = mio::Poll::new()?;
        let own = poll.registry();
        if let Some(c) = self.control.as_mut() {
            own.register(&mut c.listener, CONTROL_TOKEN, Interest::READABLE)?;
        }
        if let Some(m) = self.metrics.as_mut() {
            own.register(m, METRICS_TOKEN, Interest::READABLE)?;
        }
        if let Some(a) = self.agent.as_mut() {
            own.register(a, AGENT_TOKEN, Interest::READABLE)?;
        }
        registry.register(
            &mut mio::unix::SourceFd(&poll.as_raw_fd()),
            Event::Endpoints.token(),
            Interest::READABLE,
        )?;
        self.poll = Some(poll);
        Ok(())
    }

    /// Removes the control socket file, unless a successor replaced it.
    pub fn remove_control_file(&self) {
        if let Some(c) = &self.control {
            let ours = std::fs::metadata(&c.path).is_ok_and(|m| m.ino() == c.inode);
            if ours {
                let _ = std::fs::remove_file(&c.path);
            }
        }
    }

    /// The earliest client deadline, or the end of a pause in accepting.
    pub fn deadline(&self) -> Option<Instant> {
        self.clients
            .iter()
            .flatten()
            .map(|c| c.since + CLIENT_TIMEOUT)
            .chain(self.paused_until)
            .min()
    }
}

impl Endpoints {
    /// Whether clients are left to serve from the last turn (its bound
    /// was reached): the loop turns again without waiting.
    pub fn has_more(&self) -> bool {
        self.more
    }

    /// Serves what the endpoints' own poll has ready, answering from
    /// `src`: at most [`ROUNDS_PER_TURN`] rounds of events a turn, so a
    /// crowd of clients cannot hold the loop; what is left is served next
    /// turn.
    pub(super) fn turn(&mut self, src: &Sources<'_>, now: Instant) {
        self.more = false;
        if self.paused_until.is_some_and(|until| now >= until) {
            // What connected during the pause raised no new event.
            self.paused_until = None;
            for token in [CONTROL_TOKEN, METRICS_TOKEN, AGENT_TOKEN] {
                self.accept_clients(token, src, now);
            }
        }
        for _ in 0..self.rounds {
            let Some(poll) = self.poll.as_mut() else {
                return;
            };
            match poll.poll(&mut self.events, Some(Duration::ZERO)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    warn!("the status endpoints' poll failed: {e}");
                    return;
                }
            }
            if self.events.is_empty() {
                return;
            }
            self.ready.clear();
            self.ready.extend(self.events.iter().map(|e| e.token()));
            for i in 0..self.ready.len() {
                match self.ready[i] {
                    token @ (CONTROL_TOKEN | METRICS_TOKEN | AGENT_TOKEN) => {
                        self.accept_clients(token, src, now)
                    }
                    Token(index) => self.serve_client(index, src),
                }
            }
        }
        // The poll is watched edge-triggered by the loop's: events left
        // in it would not wake the loop again.
        self.more = true;
    }

    /// A client connected to the control socket, the metrics endpoint or
    /// the agent port. Nothing is taken while accepting is paused.
    fn accept_clients(&mut self, token: Token, src: &Sources<'_>, now: Instant) {
        while self.paused_until.is_none() {
            let stream = match self.accept_stream(token) {
                Accept::Client(stream) => stream,
                Accept::Nothing => return,
                Accept::Skipped => continue,
                Accept::Failed(e) => {
                    warn!(
                        "status client accept failed: {e}; the supervisor is out of \
                         descriptors or memory (raise `ulimit -n` / LimitNOFILE): \
                         pausing its status endpoints' accepts for {ACCEPT_PAUSE:?}"
                    );
                    self.paused_until = Some(now + ACCEPT_PAUSE);
                    return;
                }
            };
            let Some(stream) = self.make_room_for(stream) else {
                continue;
            };
            let client = new_client(stream, token, src, now);
            if let Some(index) = self.add_client(client) {
                self.serve_client(index, src);
            }
        }
    }

    /// After a turn: a pause in accepting that has ended makes the loop
    /// turn the endpoints again (see [`Endpoints::turn`]).
    pub(super) fn check_accept_pause(&mut self, now: Instant) {
        if self.paused_until.is_some_and(|until| now >= until) {
            self.more = true;
        }
    }

    /// Accepts one connection on the endpoint `token` names.
    fn accept_stream(&self, token: Token) -> Accept {
        let accepted = match token {
            CONTROL_TOKEN => match self.control.as_ref() {
                Some(c) => c.listener.accept().map(|(s, _)| ClientStream::Unix(s)),
                None => return Accept::Nothing,
            },
            AGENT_TOKEN => match self.agent.as_ref() {
                Some(a) => a.accept().map(|(s, _)| ClientStream::Tcp(s)),
                None => return Accept::Nothing,
            },
            _ => match self.metrics.as_ref() {
                Some(m) => m.accept().map(|(s, _)| ClientStream::Tcp(s)),
                None => return Accept::Nothing,
            },
        };
        match accepted {
            Ok(stream) => Accept::Client(stream),
            Err(e) => accept_error(e),
        }
    }

    /// Keeps the client limits for a newly accepted `stream`; `None` when
    /// it is refused.
    fn make_room_for(&mut self, stream: ClientStream) -> Option<ClientStream> {
        // Too many clients, or descriptors running low: the oldest client
        // makes room. With no client to close, the new one is refused.
        let live = self.clients.iter().flatten().count();
        let low = in_fd_reserve(&stream);
        if live >= MAX_ENDPOINT_CLIENTS || low {
            let closed = self.close_oldest_client();
            self.client_displaced(low);
            if !closed {
                return None;
            }
        }
        // A client accepted into the reserve moves down to the
        // descriptor just freed, so clients never hold the reserve.
        if low {
            stream.moved_down().ok()
        } else {
            Some(stream)
        }
    }

    /// Puts `client` in a free place of the client table and watches it;
    /// its index, or `None` when it cannot be watched (it is closed).
    fn add_client(&mut self, client: Client) -> Option<usize> {
        let index = match self.clients.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.clients.push(None);
                self.clients.len() - 1
            }
        };
        self.clients[index] = Some(client);
        if self.register_client(index).is_err() {
            self.clients[index] = None;
            return None;
        }
        Some(index)
    }

    fn client_displaced(&mut self, low_on_fds: bool) {
        self.displaced += 1;
        let n = self.displaced;
        if n.is_power_of_two() {
            if low_on_fds {
                warn!(
                    displaced = n,
                    "status/metrics clients closed early: the supervisor is within \
                     {FD_RESERVE} descriptors of RLIMIT_NOFILE (raise LimitNOFILE= or ulimit -n)"
                );
            } else {
                warn!(
                    displaced = n,
                    "status/metrics clients closed early: more than \
                     {MAX_ENDPOINT_CLIENTS} connected at once"
                );
            }
        }
    }

    /// Closes the client that connected first; false if there is none.
    fn close_oldest_client(&mut self) -> bool {
        let oldest = self
            .clients
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.as_ref().map(|c| (c.since, i)))
            .min();
        if let Some((_, index)) = oldest {
            self.close_client(index);
        }
        oldest.is_some()
    }

    fn register_client(&mut self, index: usize) -> io::Result<()> {
        let Some(poll) = self.poll.as_ref() else {
            return Err(io::Error::other("the endpoints are not registered"));
        };
        let registry = poll.registry();
        let client = self.clients[index].as_mut().expect("just set");
        let interest = Interest::READABLE | Interest::WRITABLE;
        match &mut client.stream {
            ClientStream::Unix(s) => registry.register(s, Token(index), interest),
            ClientStream::Tcp(s) => registry.register(s, Token(index), interest),
        }
    }

    /// Moves a client along: read its request, write the answer, close.
    fn serve_client(&mut self, index: usize, src: &Sources<'_>) {
        let done = self.advance_client(index, src).unwrap_or(true);
        if done {
            self.close_client(index);
        }
    }

    fn advance_client(&mut self, index: usize, src: &Sources<'_>) -> io::Result<bool> {
        let Some(client) = self.clients.get_mut(index).and_then(Option::as_mut) else {
            return Ok(false);
        };
        if let Some(request) = client.request.as_mut() {
            let mut buf = [0u8; 1024];
            loop {
                match client.stream.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        request.extend_from_slice(&buf[..n]);
                        if request.windows(4).any(|w| w == b"\r\n\r\n")
                            || request.len() > MAX_REQUEST
                        {
                            break;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                    Err(e) => return Err(e),
                }
            }
            let request = client.request.take().unwrap_or_default();
            if request.is_empty() {
                // Closed without asking: nothing is made for it.
                return Ok(true);
            }
            client.out = match answers::health_response(src, &request) {
                Some(answer) => answer,
                None => answers::metrics_response(src, Instant::now()),
            };
        }
        self.write_client(index)
    }

    /// Writes what is left of a client's answer: true once all of it is out.
    fn write_client(&mut self, index: usize) -> io::Result<bool> {
        let client = self.clients[index].as_mut().expect("checked");
        while client.written < client.out.len() {
            match client.stream.write(&client.out[client.written..]) {
                Ok(0) => return Ok(true),
                Ok(n) => client.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    fn close_client(&mut self, index: usize) {
        if let Some(mut client) = self.clients.get_mut(index).and_then(Option::take) {
            if let Some(poll) = self.poll.as_ref() {
                let registry = poll.registry();
                let _ = match &mut client.stream {
                    ClientStream::Unix(s) => registry.deregister(s),
                    ClientStream::Tcp(s) => registry.deregister(s),
                };
            }
        }
    }

    /// Drops clients that have taken too long.
    pub(super) fn expire_clients(&mut self, now: Instant) {
        for index in 0..self.clients.len() {
            let late = self.clients[index]
                .as_ref()
                .is_some_and(|c| now.duration_since(c.since) >= CLIENT_TIMEOUT);
            if late {
                self.close_client(index);
            }
        }
    }
}

/// What a failed accept means: nothing more waits, this connection is
/// gone (the next may be fine), or accepting must pause.
fn accept_error(e: io::Error) -> Accept {
    use nix::errno::Errno;
    if e.kind() == io::ErrorKind::WouldBlock {
        return Accept::Nothing;
    }
    let gone = [
        Errno::ECONNABORTED,
        Errno::EPROTO,
        Errno::ECONNRESET,
        Errno::EINTR,
    ];
    match e.raw_os_error() {
        Some(code) if gone.contains(&Errno::from_raw(code)) => Accept::Skipped,
        _ => Accept::Failed(e),
    }
}

/// A new client on the endpoint `token` names, with its answer ready
/// unless it must send a request first (metrics).
fn new_client(stream: ClientStream, token: Token, src: &Sources<'_>, now: Instant) -> Client {
    let (request, out) = match (&stream, token) {
        (ClientStream::Unix(_), _) => (None, answers::status_json(src, now)),
        (ClientStream::Tcp(_), AGENT_TOKEN) => (None, answers::agent_line(src)),
        (ClientStream::Tcp(_), _) => (Some(Vec::new()), Vec::new()),
    };
    Client {
        stream,
        request,
        out,
        written: 0,
        since: now,
    }
}

impl Supervisor {
    /// Serves the endpoints from what this turn published.
    pub(super) fn serve_endpoints(&mut self, now: Instant) {
        let src = Sources {
            view: &self.published,
            resources: &self.resources,
            latency: self.dispatcher.latency(),
        };
        self.endpoints.turn(&src, now);
    }
}

/// A TCP listener from a passed descriptor, made non-blocking.
fn adopt_tcp(fd: std::os::fd::OwnedFd) -> io::Result<TcpListener> {
    let listener = std::net::TcpListener::from(fd);
    listener.set_nonblocking(true)?;
    Ok(TcpListener::from_std(listener))
}

/// A TCP listener for one of the supervisor's own endpoints, and the
/// address it got; the error names `what` and the address.
fn bind_tcp(addr: SocketAddr, what: &str) -> io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot bind {what} {addr}: {e}")))?;
    let local = listener.local_addr()?;
    Ok((listener, local))
}

/// Whether `stream`'s descriptor lies within [`FD_RESERVE`] of the soft
/// `RLIMIT_NOFILE`.
fn in_fd_reserve(stream: &ClientStream) -> bool {
    use std::os::fd::AsRawFd;
    let fd = match stream {
        ClientStream::Unix(s) => s.as_raw_fd(),
        ClientStream::Tcp(s) => s.as_raw_fd(),
    };
    let Some(soft) = crate::sys::fds::soft_nofile() else {
        return false; // unlimited
    };
    u64::try_from(fd).unwrap_or(0) + FD_RESERVE >= soft
}

impl ClientStream {
    /// The same connection on the lowest free descriptor.
    fn moved_down(self) -> io::Result<ClientStream> {
        use std::os::fd::OwnedFd;
        Ok(match self {
            ClientStream::Unix(s) => {
                let lower = OwnedFd::from(s).try_clone()?;
                ClientStream::Unix(UnixStream::from_std(lower.into()))
            }
            ClientStream::Tcp(s) => {
                let lower = OwnedFd::from(s).try_clone()?;
                ClientStream::Tcp(TcpStream::from_std(lower.into()))
            }
        })
    }
}

impl Read for ClientStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ClientStream::Unix(s) => s.read(buf),
            ClientStream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for ClientStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            ClientStream::Unix(s) => s.write(buf),
            ClientStream::Tcp(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervisor::published::Published;
    use crate::supervisor::resources::Resources;
    use prometheus_client::metrics::histogram::Histogram;
    use std::io::{BufRead, BufReader};

    /// What the answers are made from: nothing published yet.
    struct Nothing {
        published: Published,
        resources: Resources,
        latency: Histogram,
    }

    impl Nothing {
        fn new() -> Nothing {
            Nothing {
                published: Published::new(Instant::now()),
                resources: Resources::default(),
                latency: Histogram::new([0.001]),
            }
        }

        fn src(&self) -> Sources<'_> {
            Sources {
                view: &self.published,
                resources: &self.resources,
                latency: &self.latency,
            }
        }
    }

    /// Endpoints serving the metrics address, `events` events a round and
    /// `rounds` rounds a turn, registered with a loop poll of their own.
    fn metrics_endpoints(events: usize, rounds: usize) -> (Endpoints, SocketAddr, mio::Poll) {
        let mut endpoints = Endpoints {
            events: mio::Events::with_capacity(events),
            rounds,
            ..Endpoints::default()
        };
        let addr = endpoints
            .bind_metrics("127.0.0.1:0".parse().unwrap())
            .unwrap();
        let outer = mio::Poll::new().unwrap();
        endpoints.register(outer.registry()).unwrap();
        (endpoints, addr, outer)
    }

    fn live_request(stream: &mut std::net::TcpStream) {
        stream
            .write_all(b"GET /live HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
    }

    /// Turns until `stream` has its status line, at most 50 turns: how
    /// many it took.
    fn turns_until_answered(
        endpoints: &mut Endpoints,
        src: &Sources<'_>,
        stream: &std::net::TcpStream,
    ) -> Option<usize> {
        stream.set_nonblocking(true).unwrap();
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        for turn in 1..=50 {
            endpoints.turn(src, Instant::now());
            if reader.read_line(&mut line).is_ok() && line.starts_with("HTTP/1.1") {
                return Some(turn);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        None
    }

    #[test]
    fn events_past_a_turns_bound_are_served_next_turn_and_the_loop_knows_to_turn_again() {
        let (mut endpoints, addr, _outer) = metrics_endpoints(1, 1);
        let nothing = Nothing::new();
        let src = nothing.src();
        let mut a = std::net::TcpStream::connect(addr).unwrap();
        let mut b = std::net::TcpStream::connect(addr).unwrap();
        // Both are accepted (one event: the listener) and wait for their
        // requests.
        let deadline = Instant::now() + Duration::from_secs(5);
        while endpoints.clients.iter().flatten().count() < 2 && Instant::now() < deadline {
            endpoints.turn(&src, Instant::now());
        }
        assert_eq!(endpoints.clients.iter().flatten().count(), 2);
        live_request(&mut a);
        live_request(&mut b);
        std::thread::sleep(Duration::from_millis(20));
        // One event a turn: the first turn answers one and says more wait.
        endpoints.turn(&src, Instant::now());
        assert!(endpoints.has_more(), "a turn at its bound must say so");
        assert_eq!(endpoints.clients.iter().flatten().count(), 1);
        let left = if endpoints.clients[0].is_some() {
            &a
        } else {
            &b
        };
        assert_eq!(turns_until_answered(&mut endpoints, &src, left), Some(1));
    }

    #[test]
    fn a_crowd_of_idle_clients_is_capped_and_the_newest_is_answered() {
        let (mut endpoints, addr, _outer) = metrics_endpoints(EVENTS_PER_ROUND, ROUNDS_PER_TURN);
        let nothing = Nothing::new();
        let src = nothing.src();
        let idle: Vec<_> = (0..MAX_ENDPOINT_CLIENTS + 10)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        let mut fresh = std::net::TcpStream::connect(addr).unwrap();
        live_request(&mut fresh);
        assert!(turns_until_answered(&mut endpoints, &src, &fresh).is_some());
        assert!(endpoints.clients.iter().flatten().count() <= MAX_ENDPOINT_CLIENTS);
        assert!(endpoints.displaced >= 10);
        drop(idle);
    }

    #[test]
    fn an_accept_skips_a_lost_connection_and_pauses_when_out_of_descriptors() {
        use nix::errno::Errno;
        let sorted = |errno: Errno| match accept_error(io::Error::from_raw_os_error(errno as i32)) {
            Accept::Nothing => "nothing",
            Accept::Skipped => "skipped",
            Accept::Failed(_) => "failed",
            Accept::Client(_) => unreachable!("an error is no client"),
        };
        assert_eq!(sorted(Errno::EAGAIN), "nothing");
        for lost in [
            Errno::ECONNABORTED,
            Errno::EPROTO,
            Errno::ECONNRESET,
            Errno::EINTR,
        ] {
            assert_eq!(sorted(lost), "skipped", "{lost}");
        }
        for exhausted in [
            Errno::EMFILE,
            Errno::ENFILE,
            Errno::ENOBUFS,
            Errno::ENOMEM,
            Errno::EBADF,
        ] {
            assert_eq!(sorted(exhausted), "failed", "{exhausted}");
        }
    }

    #[test]
    fn a_client_that_connected_during_an_accept_pause_is_served_when_it_ends() {
        let (mut endpoints, addr, _outer) = metrics_endpoints(EVENTS_PER_ROUND, ROUNDS_PER_TURN);
        let nothing = Nothing::new();
        let src = nothing.src();
        let start = Instant::now();
        // As after an accept that failed with EMFILE.
        endpoints.paused_until = Some(start + ACCEPT_PAUSE);
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        live_request(&mut stream);
        // Its listener's one (edge-triggered) event comes during the pause:
        // nothing is accepted.
        for _ in 0..5 {
            endpoints.turn(&src, start);
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(endpoints.clients.iter().flatten().count(), 0);
        assert!(!endpoints.has_more());
        // The pause's end is a deadline of the loop's, which then turns the
        // endpoints: the client is taken and answered with no new event.
        let end = start + ACCEPT_PAUSE;
        assert_eq!(endpoints.deadline(), Some(end));
        endpoints.check_accept_pause(end - Duration::from_millis(1));
        assert!(!endpoints.has_more(), "the pause has not ended yet");
        endpoints.check_accept_pause(end);
        assert!(
            endpoints.has_more(),
            "the loop must turn the endpoints at the pause's end"
        );
        endpoints.turn(&src, end);
        assert_eq!(endpoints.paused_until, None);
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut line = String::new();
        BufReader::new(&stream).read_line(&mut line).unwrap();
        assert!(line.starts_with("HTTP/1.1 200"), "{line:?}");
    }

    #[test]
    fn a_metrics_client_that_closes_without_a_request_gets_nothing() {
        let (mut endpoints, addr, _outer) = metrics_endpoints(EVENTS_PER_ROUND, ROUNDS_PER_TURN);
        let nothing = Nothing::new();
        let src = nothing.src();
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream.shutdown(std::net::Shutdown::Write).unwrap();
        stream.set_nonblocking(true).unwrap();
        // Turns until the endpoint closes the client (at most 5 s): what
        // it got meanwhile.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut answer = Vec::new();
        let mut closed = false;
        while !closed && Instant::now() < deadline {
            endpoints.turn(&src, Instant::now());
            let mut buf = [0u8; 4096];
            match stream.read(&mut buf) {
                Ok(0) => closed = true,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(2))
                }
                Err(e) => panic!("reading the answer: {e}"),
            }
        }
        assert!(closed, "the endpoint never closed the client");
        assert!(answer.is_empty(), "{}", String::from_utf8_lossy(&answer));
    }
}
