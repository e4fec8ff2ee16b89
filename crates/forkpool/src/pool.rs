//! The library's entry point: listeners + config + handler, then [`Pool::run`].
//!
//! ```no_run
//! use std::io::Write;
//! use forkpool::{Pool, PoolConfig};
//!
//! let mut pool = Pool::new(PoolConfig::default());
//! pool.listen(&"127.0.0.1:8080".parse().unwrap()).unwrap();
//! let totals = pool
//!     .run(|mut conn: forkpool::Connection<'_>| {
//!         let _ = conn.stream.write_all(b"hello from a child\n");
//!     })
//!     .unwrap();
//! println!("served {} connections", totals.accepted);
//! ```
//!
//! Or, with [`Pool::run_command`], each child runs another program, which
//! finds the listeners and the back-channel where [`crate::exec`] says.
//! Children can also serve many connections each: [`Pool::run_sessions`]
//! gives every child a [`SessionPool`](crate::sessions::SessionPool) (a few threads for many mostly idle
//! sessions) and hands each connection to the lowest-numbered child under
//! its capacity.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::path::Path;

pub use crate::config::Credentials;
use crate::config::{ConfigError, DispatchMode, PoolConfig};
use crate::exec::{self, WorkerCommand};
use crate::listener::{ListenAddr, Listener};
use crate::sessions::{Session, SessionConfig};
use crate::status::Totals;
use crate::supervisor::{Endpoints, Exit, ReloadSource, Supervisor, UpgradeCommand};
use crate::sys::process;
use crate::worker::{self, Handler, WorkerInfo};

pub use crate::supervisor::{
    AGENT_FD_NAME, METRICS_FD_NAME, SOCKET_ACTIVATED_ENV, UPGRADE_FROM_ENV,
};

/// A pool that has not started yet.
pub struct Pool {
    config: PoolConfig,
    listeners: Vec<Listener>,
    endpoints: Endpoints,
    listeners_outlive: bool,
    reload: Option<ReloadSource>,
    credentials: Option<Credentials>,
    upgrade: Option<UpgradeCommand>,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("config", &self.config)
            .field("listeners", &self.listeners)
            .field("credentials", &self.credentials)
            .finish_non_exhaustive()
    }
}

/// Why a pool could not run.
#[derive(Debug)]
pub enum PoolError {
    /// The configuration cannot work.
    Config(ConfigError),
    /// The pool has no listener to serve.
    NoListeners,
    /// The process has more than one thread, so it must not fork.
    NotSingleThreaded(usize),
    /// The dispatch mode cannot be used this way.
    UnsupportedDispatch(DispatchMode),
    /// `preload` was asked of a pool whose children run Rust code, which
    /// are forked from the loaded supervisor already.
    PreloadNeedsCommand,
    /// A system call failed.
    Io(io::Error),
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::Config(e) => write!(f, "invalid configuration: {e}"),
            PoolError::NoListeners => {
                write!(f, "the pool has no listener: add one with Pool::listen")
            }
            PoolError::NotSingleThreaded(n) => write!(
                f,
                "the process has {n} threads, but a pool can only fork from a \
                 single-threaded process (a child would inherit locks held by \
                 threads that do not exist in it): start no threads before Pool::run, \
                 or start them inside the handler"
            ),
            PoolError::PreloadNeedsCommand => write!(
                f,
                "preload is for pools that run a command (Pool::run_command, `forkpool run`): \
                 children of Pool::run are forked from this loaded process already, so they \
                 share it without a template; drop preload"
            ),
            PoolError::UnsupportedDispatch(mode) => write!(
                f,
                "dispatch '{mode}' is for programs run with Pool::run_command \
                 (`forkpool run`); a pool of Rust handlers speaks the protocol: use shared"
            ),
            PoolError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for PoolError {}

impl From<io::Error> for PoolError {
    fn from(e: io::Error) -> Self {
        PoolError::Io(e)
    }
}

impl Pool {
    /// A pool with this configuration and no listeners yet.
    pub fn new(config: PoolConfig) -> Pool {
        Pool {
            config,
            listeners: Vec::new(),
            endpoints: Endpoints::default(),
            listeners_outlive: false,
            reload: None,
            credentials: None,
            upgrade: None,
        }
    }

    /// Serves the status snapshot (JSON) on a Unix socket at `path`, mode
    /// 0600, bound now. A stale socket file is replaced; a live one is an
    /// error. `take_over` replaces even a live one (a binary upgrade taking
    /// its predecessor's place). The file is removed when the pool stops.
    pub fn control_socket(&mut self, path: &Path, take_over: bool) -> io::Result<()> {
        self.endpoints.bind_control(path, take_over)
    }

    /// Serves Prometheus metrics over HTTP at `addr`, bound now; returns
    /// the address bound (port 0 picks one).
    pub fn metrics(&mut self, addr: SocketAddr) -> io::Result<SocketAddr> {
        self.endpoints.bind_metrics(addr)
    }

    /// Answers HAProxy's agent check at `addr`, bound now: one line per
    /// connection saying how much work the pool can take (see
    /// [`crate::fleet::agent`]); returns the address bound.
    pub fn agent(&mut self, addr: SocketAddr) -> io::Result<SocketAddr> {
        self.endpoints.bind_agent(addr)
    }

    /// Serves metrics (and `/live`, `/ready`) on a listener a `USR2`
    /// predecessor passed (named [`METRICS_FD_NAME`]); returns its address.
    pub fn adopt_metrics(&mut self, listener: Listener) -> io::Result<SocketAddr> {
        self.endpoints.adopt_metrics(listener.into())
    }

    /// Answers the agent check on a listener a `USR2` predecessor passed
    /// (named [`AGENT_FD_NAME`]); returns its address.
    pub fn adopt_agent(&mut self, listener: Listener) -> io::Result<SocketAddr> {
        self.endpoints.adopt_agent(listener.into())
    }

    /// Says the listeners came from systemd socket activation: they
    /// outlive this process, so a graceful stop leaves their backlog to
    /// the next start instead of serving it (see `serve_backlog_on_stop`).
    pub fn listeners_from_socket_activation(&mut self) {
        self.listeners_outlive = true;
    }

    /// How SIGHUP reads the configuration again. Without one, SIGHUP rolls
    /// the children to a new generation under the same configuration.
    pub fn on_reload(&mut self, read: impl FnMut() -> Result<PoolConfig, String> + 'static) {
        self.reload = Some(Box::new(read));
    }

    /// Lets SIGUSR2 replace this process with a fresh run of the same
    /// binary and arguments, handing over the listeners (see the
    /// `supervisor::upgrade` docs in `docs/operations.md`). The program must
    /// adopt inherited listeners with [`Listener::inherited`] instead of
    /// binding when `LISTEN_FDS` is set, as `forkpool` itself does.
    pub fn enable_upgrades(&mut self) -> io::Result<()> {
        self.upgrade = Some(UpgradeCommand::current()?);
        Ok(())
    }

    /// Children switch to this user and group right after they are forked.
    /// The supervisor keeps its own identity (root, typically): it must be
    /// able to signal every child and to re-bind privileged ports for an
    /// upgrade, and it never runs the handler. Requires root.
    pub fn run_children_as(&mut self, credentials: Credentials) -> Result<(), PoolError> {
        if !nix::unistd::geteuid().is_root() {
            return Err(PoolError::Io(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "running children as another user needs the supervisor to start as root",
            )));
        }
        self.credentials = Some(credentials);
        Ok(())
    }

    /// Binds a listener now (so a port of 0 resolves) and returns the
    /// address actually bound. Listeners are numbered in the order added.
    pub fn listen(&mut self, addr: &ListenAddr) -> io::Result<ListenAddr> {
        let kernel = self.config.dispatch == DispatchMode::Kernel;
        let listener = Listener::bind_with(addr, self.config.backlog, kernel)?;
        let bound = listener.local_addr().clone();
        self.listeners.push(listener);
        Ok(bound)
    }

    /// Adds a listener bound elsewhere (inherited, for instance).
    pub fn add_listener(&mut self, listener: Listener) {
        self.listeners.push(listener);
    }

    /// The listeners added so far, in order.
    pub fn listeners(&self) -> &[Listener] {
        &self.listeners
    }

    /// The configuration.
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// Runs the pool until it is told to stop (SIGTERM, SIGINT, SIGQUIT) and
    /// returns the supervisor's totals.
    ///
    /// Children are forked from this process, so everything loaded before
    /// this call is shared copy-on-write; the process must be
    /// single-threaded. In a child this function never returns: the child
    /// serves connections with `handler` and exits.
    pub fn run<H: Handler>(self, mut handler: H) -> Result<Totals, PoolError> {
        if !self.config.dispatch.speaks_protocol() {
            return Err(PoolError::UnsupportedDispatch(self.config.dispatch));
        }
        if self.config.preload {
            return Err(PoolError::PreloadNeedsCommand);
        }
        let mut supervisor = self.supervisor()?;
        supervisor.options.children_take_next = true;
        supervisor.settle_dispatch(None);
        match supervisor.run()? {
            Exit::Done(totals) => Ok(totals),
            Exit::Child(start) => {
                let code = worker::run_child(start, &mut handler);
                std::process::exit(code)
            }
            Exit::Template(_) => no_template_here(),
        }
    }

    /// Runs the pool like [`Pool::run`], but each child `exec`s `command`
    /// instead of running a Rust handler: see [`crate::exec`] for what the
    /// program finds (listeners from fd 3 the systemd way, the back-channel
    /// after them, `FORKPOOL_*` variables) and `docs/workers.md` for how
    /// to write one. A worker's standard error is logged line by line with
    /// its slot; its standard output is the supervisor's.
    ///
    /// With [`DispatchMode::None`] the program needs no forkpool support
    /// at all (any socket-activated server): the listeners are made
    /// blocking, as systemd passes them, and the pool keeps `min_children`
    /// of them running.
    pub fn run_command(self, command: &WorkerCommand) -> Result<Totals, PoolError> {
        if self.config.dispatch == DispatchMode::None {
            // The supervisor never accepts in this mode, so the shared
            // flag only matters to the workers, which expect blocking
            // sockets like systemd gives them.
            for l in &self.listeners {
                crate::sys::socket::set_nonblocking(l.as_fd(), false)?;
            }
        }
        let mut supervisor = self.supervisor()?;
        supervisor.options.capture_output = true;
        // Workers get the listeners in `handoff` too, so one finishing a
        // connection may take the next waiting one itself (`N`).
        supervisor.options.children_take_next = true;
        supervisor.templates.command = command.to_string();
        supervisor.settle_dispatch(None);
        match supervisor.run()? {
            Exit::Done(totals) => Ok(totals),
            Exit::Child(start) => exec::exec_worker(start.into_exec(), command),
            Exit::Template(start) => exec::exec_template(start, command),
        }
    }

    /// Runs the pool with children that each serve many connections at
    /// once, and returns the supervisor's totals when it stops.
    ///
    /// Every child runs a [`SessionPool`](crate::sessions::SessionPool) of sessions `S`, started after the
    /// fork with `sessions` (so its threads exist only in the child) and a
    /// context that `context` builds in the child from who the child is.
    /// `sessions.max_sessions` is each child's *capacity*. The supervisor
    /// hands each new connection to the lowest-numbered child under its
    /// capacity, so the lowest children fill up first; the children report
    /// their load on the back-channel, and the pool grows and shrinks by
    /// spare capacity: `min_spare` and `max_spare` count in children's worth
    /// of free places (see [`crate::scaling`]), and only a child holding no
    /// connection is retired. `sessions.cap_policy` does not apply: the
    /// supervisor never sends a child more than its capacity (should one
    /// come anyway, the child refuses it rather than block). A
    /// `sessions.on_load` hook is still called, before the report.
    ///
    /// Requires `handoff` dispatch. In a child this function never returns:
    /// on `Quit` the child takes no more connections, waits for its open
    /// sessions to end (at most `shutdown_timeout`, after which the
    /// supervisor kills it) and exits.
    ///
    /// ```no_run
    /// use std::io::{self, Read, Write};
    /// use std::sync::Arc;
    ///
    /// use forkpool::sessions::{Session, SessionConfig, SessionStream, Step};
    /// use forkpool::{Pool, PoolConfig};
    ///
    /// /// Echoes what arrives, whenever it arrives.
    /// struct Echo;
    ///
    /// impl Session for Echo {
    ///     type Context = ();
    ///     fn open(_: &Arc<()>, _: &SessionStream) -> Echo {
    ///         Echo
    ///     }
    ///     fn step(&mut self, stream: &mut SessionStream) -> io::Result<Step> {
    ///         let mut buf = [0u8; 512];
    ///         match stream.read(&mut buf) {
    ///             Ok(0) => Ok(Step::Close),
    ///             Ok(n) => stream.write_all(&buf[..n]).map(|()| Step::Wait),
    ///             Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Step::Wait),
    ///             Err(e) => Err(e),
    ///         }
    ///     }
    /// }
    ///
    /// let mut pool = Pool::new(PoolConfig::default());
    /// pool.listen(&"127.0.0.1:2525".parse().unwrap()).unwrap();
    /// let sessions = SessionConfig {
    ///     workers: 4,
    ///     max_sessions: 256,
    ///     ..SessionConfig::default()
    /// };
    /// pool.run_sessions::<Echo, _>(sessions, |_child| ()).unwrap();
    /// ```
    pub fn run_sessions<S, F>(
        self,
        sessions: SessionConfig,
        context: F,
    ) -> Result<Totals, PoolError>
    where
        S: Session,
        F: FnOnce(&WorkerInfo) -> S::Context,
    {
        sessions.validate().map_err(PoolError::Config)?;
        self.config
            .validate_for_sessions()
            .map_err(PoolError::Config)?;
        let capacity = u32::try_from(sessions.max_sessions).unwrap_or(u32::MAX);
        if self.config.preload {
            return Err(PoolError::PreloadNeedsCommand);
        }
        let mut supervisor = self.supervisor()?;
        supervisor.settle_dispatch(Some(
            "children that serve many connections at once are counted per connection handed",
        ));
        supervisor.core.host_sessions(capacity);
        match supervisor.run()? {
            Exit::Done(totals) => Ok(totals),
            Exit::Child(start) => {
                let code = worker::run_session_child::<S, F>(start, sessions, context);
                std::process::exit(code)
            }
            Exit::Template(_) => no_template_here(),
        }
    }

    /// Checks everything that can be checked before forking and builds the
    /// supervisor.
    fn supervisor(self) -> Result<Supervisor, PoolError> {
        self.config.validate().map_err(PoolError::Config)?;
        if self.listeners.is_empty() {
            return Err(PoolError::NoListeners);
        }
        let threads = process::thread_count()?;
        if threads != 1 {
            return Err(PoolError::NotSingleThreaded(threads));
        }
        let mut supervisor = Supervisor::new(self.config, self.listeners)?;
        supervisor.endpoints = self.endpoints;
        supervisor.options.listeners_outlive_pool = self.listeners_outlive;
        supervisor.options.reload_source = self.reload;
        supervisor.options.credentials = self.credentials;
        supervisor.handover.command = self.upgrade;
        Ok(supervisor)
    }
}

/// In a process forked as a template by a pool that has no command to
/// exec: cannot happen (`preload` is refused for such pools, at start and
/// on reload), but if it did, the process must not go on as a second
/// supervisor.
fn no_template_here() -> ! {
    eprintln!("forkpool: a template was started for a pool that runs no command; exiting");
    std::process::exit(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session that never runs: the tests using it fail before a fork.
    struct Silent;

    impl Session for Silent {
        type Context = ();
        fn open(_: &std::sync::Arc<()>, _: &crate::sessions::SessionStream) -> Silent {
            Silent
        }
        fn step(
            &mut self,
            _: &mut crate::sessions::SessionStream,
        ) -> std::io::Result<crate::sessions::Step> {
            Ok(crate::sessions::Step::Close)
        }
    }

    #[test]
    fn refuses_to_fork_from_a_threaded_process() {
        // The test harness runs tests on threads, so this process has
        // several: exactly the situation the check exists for.
        let _keep = std::thread::spawn(std::thread::park);
        let mut pool = Pool::new(PoolConfig::default());
        pool.listen(&"127.0.0.1:0".parse().unwrap()).unwrap();
        let err = pool.run(|_c: crate::Connection<'_>| {}).unwrap_err();
        assert!(matches!(err, PoolError::NotSingleThreaded(n) if n > 1));
        assert!(err.to_string().contains("single-threaded"));
    }

    #[test]
    fn refuses_an_invalid_config_before_anything_else() {
        let config = PoolConfig {
            min_spare: 8,
            max_spare: 4,
            ..PoolConfig::default()
        };
        let err = Pool::new(config)
            .run(|_c: crate::Connection<'_>| {})
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid configuration: min_spare 8 is above max_spare 4; \
             lower min_spare or raise max_spare"
        );
    }

    #[test]
    fn a_rust_handler_pool_refuses_dispatch_none() {
        let config = PoolConfig {
            dispatch: DispatchMode::None,
            ..PoolConfig::default()
        };
        let err = Pool::new(config)
            .run(|_c: crate::Connection<'_>| {})
            .unwrap_err();
        assert!(matches!(
            err,
            PoolError::UnsupportedDispatch(DispatchMode::None)
        ));
        assert!(err.to_string().contains("run_command"));
    }

    #[test]
    fn many_connection_children_need_handoff() {
        let config = PoolConfig {
            dispatch: DispatchMode::Order,
            ..PoolConfig::default()
        };
        let err = Pool::new(config)
            .run_sessions::<Silent, _>(SessionConfig::default(), |_| ())
            .unwrap_err();
        assert!(matches!(&err, PoolError::Config(e) if e.field == "dispatch"));
        assert!(err.to_string().contains("use handoff"), "{err}");
    }

    #[test]
    fn refuses_to_run_without_listeners() {
        let err = Pool::new(PoolConfig::default())
            .run(|_c: crate::Connection<'_>| {})
            .unwrap_err();
        assert!(matches!(err, PoolError::NoListeners));
    }
}
