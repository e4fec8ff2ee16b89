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
//! Children can also serve many connections each: [`Pool::run_sessions`]
//! gives every child a [`SessionPool`](crate::sessions::SessionPool) (a few threads for many mostly idle
//! sessions) and hands each connection to the lowest-numbered child under
//! its capacity.

use std::fmt;
use std::io;

use crate::config::{ConfigError, PoolConfig};
use crate::listener::{ListenAddr, Listener};
use crate::sessions::{Session, SessionConfig};
use crate::status::Totals;
use crate::supervisor::{Exit, Supervisor};
use crate::sys::process;
use crate::worker::{self, Handler, WorkerInfo};

/// A pool that has not started yet.
#[derive(Debug)]
pub struct Pool {
    config: PoolConfig,
    listeners: Vec<Listener>,
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
        }
    }

    /// Binds a listener now (so a port of 0 resolves) and returns the
    /// address actually bound. Listeners are numbered in the order added.
    pub fn listen(&mut self, addr: &ListenAddr) -> io::Result<ListenAddr> {
        let listener = Listener::bind(addr, self.config.backlog)?;
        let bound = listener.local_addr().clone();
        self.listeners.push(listener);
        Ok(bound)
    }

    /// Adds a listener bound elsewhere (inherited, for instance).
    pub fn add_listener(&mut self, listener: Listener) {
        self.listeners.push(listener);
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
        let supervisor = self.supervisor()?;
        match supervisor.run()? {
            Exit::Done(totals) => Ok(totals),
            Exit::Child(start) => {
                let code = worker::run_child(start, &mut handler);
                std::process::exit(code)
            }
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
    /// use forkpool::sessions::line_demo::LineSession;
    /// use forkpool::sessions::SessionConfig;
    /// use forkpool::{Pool, PoolConfig};
    ///
    /// let mut pool = Pool::new(PoolConfig::default());
    /// pool.listen(&"127.0.0.1:2525".parse().unwrap()).unwrap();
    /// let sessions = SessionConfig {
    ///     workers: 4,
    ///     max_sessions: 256,
    ///     ..SessionConfig::default()
    /// };
    /// pool.run_sessions::<LineSession, _>(sessions, |_child| ()).unwrap();
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
        let mut supervisor = self.supervisor()?;
        supervisor.board.host_sessions(capacity);
        match supervisor.run()? {
            Exit::Done(totals) => Ok(totals),
            Exit::Child(start) => {
                let code = worker::run_session_child::<S, F>(start, sessions, context);
                std::process::exit(code)
            }
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
        Ok(Supervisor::new(self.config, self.listeners)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn many_connection_children_need_handoff() {
        use crate::config::DispatchMode;
        let config = PoolConfig {
            dispatch: DispatchMode::Order,
            ..PoolConfig::default()
        };
        let err = Pool::new(config)
            .run_sessions::<crate::sessions::line_demo::LineSession, _>(
                SessionConfig::default(),
                |_| (),
            )
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
