//! The handle a program holds: start the pool, feed it connections, read its
//! load, shut it down.

use std::io;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use tracing::{error, info};

use super::config::{CapPolicy, SessionConfig};
use super::load::{Load, Reserve};
use super::poller::{Poller, PollerConfig};
use super::session::Session;
use super::stream::{SessionListener, SessionStream};
use super::workers::{panic_message, refuse, spawn_workers, Crew};

/// What [`SessionPool::add`] did with a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// It is a session of the pool now.
    Accepted,
    /// The pool was full and its policy is
    /// [`CapPolicy::Refuse`]: [`Session::refuse`] had its say and the
    /// connection is closed.
    Refused,
}

/// A fixed crew of worker threads serving many sessions of type `S`, taking
/// turns at one poll over them all. See the [module documentation](super)
/// for the model.
///
/// The handle is `Sync`: several threads may [`add`](SessionPool::add)
/// connections at once. Dropping it shuts the pool down like
/// [`shutdown`](SessionPool::shutdown).
pub struct SessionPool<S: Session> {
    name: String,
    workers: usize,
    policy: CapPolicy,
    poller: Arc<Poller<S>>,
    load: Arc<Load>,
    context: Arc<S::Context>,
    threads: Vec<JoinHandle<()>>,
}

impl<S: Session> SessionPool<S> {
    /// Validates `config` and starts the workers. Every
    /// session gets `context` in [`Session::open`].
    ///
    /// Fails with [`io::ErrorKind::InvalidInput`] (wrapping a
    /// [`ConfigError`](crate::ConfigError) that names the field) for
    /// a bad config, or with the system's error if a thread or the poll
    /// cannot be created.
    pub fn start(config: SessionConfig, context: S::Context) -> io::Result<Self> {
        config
            .validate()
            .map_err(|err| io::Error::new(io::ErrorKind::InvalidInput, err))?;
        let load = Arc::new(Load::new(config.max_sessions, config.on_load.clone()));
        let context = Arc::new(context);
        let poller = Arc::new(Poller::new(
            PollerConfig {
                name: config.name.clone(),
                policy: config.cap_policy,
                idle_timeout: config.idle_timeout,
            },
            Arc::clone(&load),
            Arc::clone(&context),
        )?);

        // Every thread reports once it runs, so that `start` returns with the
        // whole crew up (and named, for anyone reading /proc).
        let (started_tx, started_rx) = mpsc::channel();
        let spawned = spawn_workers(
            config.workers,
            Crew {
                poller: Arc::clone(&poller),
            },
            &started_tx,
        );
        drop(started_tx);
        let threads = match spawned {
            Ok(threads) => threads,
            Err(err) => {
                // The workers already started exit once the ledger is empty
                // and the pool stopping.
                poller.shut_down();
                return Err(err);
            }
        };
        for _ in 0..threads.len() {
            // Fails only if a thread died before reporting; it is joined
            // (and its panic logged) at shutdown.
            let _ = started_rx.recv();
        }
        info!(
            pool = %config.name,
            workers = config.workers,
            max_sessions = config.max_sessions,
            cap_policy = ?config.cap_policy,
            idle_timeout = ?config.idle_timeout,
            "session pool started"
        );
        Ok(SessionPool {
            name: config.name,
            workers: config.workers,
            policy: config.cap_policy,
            poller,
            load,
            context,
            threads,
        })
    }

    /// Makes a connection accepted elsewhere (or received from a supervisor,
    /// see [`SessionStream`]'s `TryFrom<OwnedFd>`) a session of the pool.
    ///
    /// When the pool is full, the [`CapPolicy`] decides: `Backlog` blocks
    /// this call until a session closes (so do not call it from a session
    /// hook), `Refuse` lets [`Session::refuse`] answer the peer on this
    /// thread and returns [`Admission::Refused`].
    ///
    /// Fails if the socket cannot be made non-blocking, or once the pool is
    /// shutting down; the connection is closed either way.
    pub fn add(&self, stream: impl Into<SessionStream>) -> io::Result<Admission> {
        let mut stream = stream.into();
        stream.make_nonblocking()?;
        let place = match self.policy {
            CapPolicy::Backlog => self.load.reserve_waiting(),
            CapPolicy::Refuse => self.load.try_reserve(),
        };
        match place {
            Reserve::Taken => match self.poller.add(stream) {
                Ok(()) => Ok(Admission::Accepted),
                Err(_stream) => {
                    self.load.release();
                    Err(stopped())
                }
            },
            Reserve::Full => {
                refuse::<S>(&self.name, &self.context, &mut stream);
                Ok(Admission::Refused)
            }
            Reserve::Closed => Err(stopped()),
        }
    }

    /// Accepts sessions from `listener` too: the worker whose turn it is at
    /// the poll accepts while the pool is under its cap. With
    /// [`CapPolicy::Backlog`] it stops accepting while full, so new peers
    /// wait in the kernel's listen backlog; with [`CapPolicy::Refuse`] it
    /// accepts and refuses them. May be called several times (up to 64
    /// listeners).
    ///
    /// Fails if the listener cannot be made non-blocking or watched, if the
    /// pool already serves 64 listeners, or once it is shutting down.
    pub fn serve(&self, listener: impl Into<SessionListener>) -> io::Result<()> {
        self.poller.listen(listener.into())
    }

    /// Sessions open right now, idle or running, including connections
    /// accepted and not yet opened. Cheap: one atomic read.
    pub fn open_sessions(&self) -> usize {
        self.load.open()
    }

    /// Sessions a worker is running right now (a step, or opening or
    /// closing one): at most [`workers`](Self::workers). Cheap: one atomic
    /// read.
    pub fn running_sessions(&self) -> usize {
        self.load.running()
    }

    /// The cap on open sessions ([`SessionConfig::max_sessions`]).
    pub fn max_sessions(&self) -> usize {
        self.load.max()
    }

    /// Whether one more session would be taken now without waiting or being
    /// refused. Another thread may take the place first.
    pub fn has_capacity(&self) -> bool {
        self.load.has_capacity()
    }

    /// The number of worker threads (fixed for the pool's life).
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// The context every session of this pool shares.
    pub fn context(&self) -> &Arc<S::Context> {
        &self.context
    }

    /// Stops taking sessions (listeners are closed, [`add`](Self::add)
    /// fails), lets steps already running finish, closes every session
    /// (`on_close` with [`CloseReason::Shutdown`](super::CloseReason)), and
    /// joins every thread. Sessions that wait for input are not stepped
    /// again. It returns once the longest running step has returned: a step
    /// that never returns keeps it waiting.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if self.threads.is_empty() {
            return;
        }
        self.poller.shut_down();
        join_all(&self.name, std::mem::take(&mut self.threads));
        info!(pool = %self.name, "session pool stopped");
    }
}

impl<S: Session> Drop for SessionPool<S> {
    fn drop(&mut self) {
        self.stop();
    }
}

impl<S: Session> std::fmt::Debug for SessionPool<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionPool")
            .field("name", &self.name)
            .field("workers", &self.workers)
            .field("policy", &self.policy)
            .field("open_sessions", &self.open_sessions())
            .finish_non_exhaustive()
    }
}

fn stopped() -> io::Error {
    io::Error::other("the session pool is shutting down and takes no new sessions")
}

fn join_all(pool: &str, threads: Vec<JoinHandle<()>>) {
    for handle in threads {
        let thread = handle.thread().name().unwrap_or("?").to_string();
        if let Err(payload) = handle.join() {
            error!(
                pool,
                thread,
                panic = panic_message(payload.as_ref()),
                "pool thread panicked"
            );
        }
    }
}
