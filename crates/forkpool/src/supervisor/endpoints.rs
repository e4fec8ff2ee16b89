//! The supervisor's own small servers, run from its event loop (no thread):
//! the control socket, which writes a JSON [`Snapshot`] to whoever connects,
//! and the Prometheus metrics endpoint, which answers any HTTP request with
//! the text exposition (and `/live` and `/ready`, see [`crate::fleet`]),
//! and HAProxy's agent check, one line per connection. All write without blocking; a client that does not
//! read is dropped after [`CLIENT_TIMEOUT`]. At most [`MAX_ENDPOINT_CLIENTS`]
//! are served at once, and never from the last [`FD_RESERVE`] descriptors:
//! either way the oldest client is closed to make room.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use mio::{Interest, Token};
use nix::sys::stat::{umask, Mode};
use tracing::warn;

use super::event::Event;
use super::Supervisor;
use crate::status::{SlotStatus, Snapshot};

const CONTROL_TOKEN: Token = Event::Control.token();
const METRICS_TOKEN: Token = Event::Metrics.token();
const AGENT_TOKEN: Token = Event::Agent.token();

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
#[derive(Default)]
pub(crate) struct Endpoints {
    control: Option<ControlSocket>,
    metrics: Option<TcpListener>,
    agent: Option<TcpListener>,
    clients: Vec<Option<Client>>,
    /// Clients closed early to make room (too many, or few descriptors left).
    displaced: u64,
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

    /// Registers the bound listeners with the loop.
    pub fn register(&mut self, registry: &mio::Registry) -> io::Result<()> {
        if let Some(c) = self.control.as_mut() {
            registry.register(&mut c.listener, CONTROL_TOKEN, Interest::READABLE)?;
        }
        if let Some(m) = self.metrics.as_mut() {
            registry.register(m, METRICS_TOKEN, Interest::READABLE)?;
        }
        if let Some(a) = self.agent.as_mut() {
            registry.register(a, AGENT_TOKEN, Interest::READABLE)?;
        }
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

    /// The earliest client deadline.
    pub fn deadline(&self) -> Option<Instant> {
        self.clients
            .iter()
            .flatten()
            .map(|c| c.since + CLIENT_TIMEOUT)
            .min()
    }
}

impl Supervisor {
    /// A client connected to the control socket, the metrics endpoint or
    /// the agent port.
    pub(super) fn accept_endpoint_clients(&mut self, token: Token, now: Instant) {
        while let Some(stream) = self.accept_endpoint_stream(token) {
            let Some(stream) = self.make_room_for(stream) else {
                continue;
            };
            let client = self.new_endpoint_client(stream, token, now);
            if let Some(index) = self.add_endpoint_client(client) {
                self.serve_client(index);
            }
        }
    }

    /// Accepts one connection on the endpoint `token` names; `None` when
    /// that endpoint is not open, nothing is waiting, or the accept failed.
    fn accept_endpoint_stream(&self, token: Token) -> Option<ClientStream> {
        let accepted = match token {
            CONTROL_TOKEN => {
                let c = self.endpoints.control.as_ref()?;
                c.listener.accept().map(|(s, _)| ClientStream::Unix(s))
            }
            AGENT_TOKEN => {
                let a = self.endpoints.agent.as_ref()?;
                a.accept().map(|(s, _)| ClientStream::Tcp(s))
            }
            _ => {
                let m = self.endpoints.metrics.as_ref()?;
                m.accept().map(|(s, _)| ClientStream::Tcp(s))
            }
        };
        match accepted {
            Ok(stream) => Some(stream),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
            Err(e) => {
                warn!("status client accept failed: {e}");
                None
            }
        }
    }

    /// Keeps the client limits for a newly accepted `stream`; `None` when
    /// it is refused.
    fn make_room_for(&mut self, stream: ClientStream) -> Option<ClientStream> {
        // Too many clients, or descriptors running low: the oldest client
        // makes room. With no client to close, the new one is refused.
        let live = self.endpoints.clients.iter().flatten().count();
        let low = in_fd_reserve(&stream);
        if live >= MAX_ENDPOINT_CLIENTS || low {
            let closed = self.close_oldest_client();
            self.endpoint_client_displaced(low);
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

    /// A new client on the endpoint `token` names, with its answer ready
    /// unless it must send a request first (metrics).
    fn new_endpoint_client(&self, stream: ClientStream, token: Token, now: Instant) -> Client {
        let (request, out) = match (&stream, token) {
            (ClientStream::Unix(_), _) => (None, self.status_json()),
            (ClientStream::Tcp(_), AGENT_TOKEN) => (None, self.agent_line(now)),
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

    /// Puts `client` in a free place of the client table and watches it;
    /// its index, or `None` when it cannot be watched (it is closed).
    fn add_endpoint_client(&mut self, client: Client) -> Option<usize> {
        let index = match self.endpoints.clients.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.endpoints.clients.push(None);
                self.endpoints.clients.len() - 1
            }
        };
        self.endpoints.clients[index] = Some(client);
        if self.register_client(index).is_err() {
            self.endpoints.clients[index] = None;
            return None;
        }
        Some(index)
    }

    fn endpoint_client_displaced(&mut self, low_on_fds: bool) {
        self.endpoints.displaced += 1;
        let n = self.endpoints.displaced;
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
            .endpoints
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
        let token = Event::Client(index).token();
        let registry = self.poll.registry();
        let client = self.endpoints.clients[index].as_mut().expect("just set");
        let interest = Interest::READABLE | Interest::WRITABLE;
        match &mut client.stream {
            ClientStream::Unix(s) => registry.register(s, token, interest),
            ClientStream::Tcp(s) => registry.register(s, token, interest),
        }
    }

    /// Moves a client along: read its request, write the answer, close.
    pub(super) fn serve_client(&mut self, index: usize) {
        let done = self.advance_client(index).unwrap_or(true);
        if done {
            self.close_client(index);
        }
    }

    fn advance_client(&mut self, index: usize) -> io::Result<bool> {
        let Some(client) = self
            .endpoints
            .clients
            .get_mut(index)
            .and_then(Option::as_mut)
        else {
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
            if let Some(answer) = self.health_response(&request, Instant::now()) {
                let client = self.endpoints.clients[index].as_mut().expect("checked");
                client.out = answer;
                return self.write_client(index);
            }
            let body = self.metrics_text();
            let client = self.endpoints.clients[index].as_mut().expect("checked");
            client.out = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            )
            .into_bytes();
            client.out.extend_from_slice(body.as_bytes());
        }
        self.write_client(index)
    }

    /// Writes what is left of a client's answer: true once all of it is out.
    fn write_client(&mut self, index: usize) -> io::Result<bool> {
        let client = self.endpoints.clients[index].as_mut().expect("checked");
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
        if let Some(mut client) = self.endpoints.clients.get_mut(index).and_then(Option::take) {
            let registry = self.poll.registry();
            let _ = match &mut client.stream {
                ClientStream::Unix(s) => registry.deregister(s),
                ClientStream::Tcp(s) => registry.deregister(s),
            };
        }
    }

    /// Drops clients that have taken too long.
    pub(super) fn expire_clients(&mut self, now: Instant) {
        for index in 0..self.endpoints.clients.len() {
            let late = self.endpoints.clients[index]
                .as_ref()
                .is_some_and(|c| now.duration_since(c.since) >= CLIENT_TIMEOUT);
            if late {
                self.close_client(index);
            }
        }
    }

    /// The scoreboard and totals as the control socket reports them.
    pub(crate) fn snapshot(&self, now: Instant) -> Snapshot {
        let counts = self.core.board.counts();
        // Kernel dispatch: a child's client is asked of the kernel, once per
        // snapshot (the supervisor never held the connection).
        let established = (self.kernel.is_some() && counts.busy > 0)
            .then(crate::observe::peers::established_by_inode);
        let slots = self
            .core
            .board
            .iter()
            .map(|(slot, s)| {
                let mut status = SlotStatus {
                    slot,
                    pid: s.pid,
                    state: s.state.name().to_string(),
                    generation: s.generation,
                    served: s.served,
                    busy_for_ms: matches!(
                        s.state,
                        crate::scoreboard::SlotState::Busy | crate::scoreboard::SlotState::Ordered
                    )
                    .then(|| now.duration_since(s.since).as_millis() as u64),
                    last_heard_ms: now.duration_since(s.last_heard).as_millis() as u64,
                    sessions: s.load.map(|l| (l.load(), l.capacity)),
                    cpu_seconds: None,
                    cpu_percent: None,
                    rss_bytes: None,
                    pss_bytes: None,
                    uss_bytes: None,
                    peer: None,
                    last_capture: None,
                    ready_after_ms: s.link.child.ready_after().map(|d| d.as_millis() as u64),
                };
                self.resources.fill(&mut status);
                if let (None, Some(_), Some(established)) =
                    (&status.peer, status.busy_for_ms, &established)
                {
                    status.peer = crate::observe::peers::peers_of(s.pid, established)
                        .first()
                        .map(|a| a.to_string());
                }
                status
            })
            .collect();
        let mut totals = self.core.totals;
        if let Some(since) = self.core.saturated_since() {
            totals.saturated_ms += now.duration_since(since).as_millis() as u64;
        }
        Snapshot {
            pid: std::process::id(),
            generation: self.core.generation,
            serving_generation: self.core.serving_generation(),
            ready: self.told_ready,
            dispatch: self.core.config.dispatch.name().to_string(),
            dispatch_fallback: self.dispatch_fallback.clone(),
            uptime_ms: now.duration_since(self.started).as_millis() as u64,
            line: self.core.board.line(),
            starting: counts.starting,
            idle: counts.idle,
            busy: counts.busy,
            leaving: counts.leaving,
            bounds: [
                self.core.config.min_children,
                self.core.config.max_children,
                self.core.config.min_spare,
                self.core.config.max_spare,
            ],
            slots,
            totals,
            queues: self.resources.queues(),
            templates: self.template_statuses(now),
        }
    }

    fn status_json(&self) -> Vec<u8> {
        let mut json = serde_json::to_vec(&self.snapshot(Instant::now())).unwrap_or_default();
        json.push(b'\n');
        json
    }

    fn metrics_text(&self) -> String {
        crate::metrics::render(
            &self.snapshot(Instant::now()),
            self.dispatcher.latency(),
            &self.resources.service_time,
        )
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
    let Ok((soft, _)) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
    else {
        return false;
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
