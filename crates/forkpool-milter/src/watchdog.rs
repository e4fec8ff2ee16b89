//! Per-step deadlines: a hook still running past its deadline gets its
//! conversation tempfailed and closed, though its thread cannot be stopped.
//!
//! One thread per process watches the steps in progress. Each step
//! registers a duplicate of its socket's descriptor and its deadline; the
//! watchdog, if the deadline passes first, writes the MTA a tempfail (when
//! the MTA waits for a reply) and shuts the socket down, so the MTA learns
//! at once instead of at its own timeout. When the hook returns at last,
//! its session finds it was timed out, drops its replies and closes. Either
//! the step or the watchdog wins, under one lock: never both.

use std::collections::HashMap;
use std::io::Write;
use std::net::Shutdown;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::reply::Reply;

/// Watches the steps of one process's conversations.
#[derive(Debug)]
pub struct Watchdog {
    inner: Arc<Inner>,
    deadline: Duration,
}

#[derive(Debug, Default)]
struct Inner {
    state: Mutex<State>,
    wake: Condvar,
    fired: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    running: HashMap<u64, Step>,
    next_id: u64,
    stop: bool,
}

#[derive(Debug)]
struct Step {
    by: Instant,
    socket: OwnedFd,
    owes_reply: bool,
}

/// A step being watched. [`Watched::end`] says whether it ended in time;
/// dropped (as when its hook panicked), it just stops being watched.
#[derive(Debug)]
#[must_use = "a watched step must be ended"]
pub struct Watched {
    inner: Arc<Inner>,
    id: u64,
}

impl Watched {
    /// The step is over: `true` if in time, `false` if the watchdog already
    /// tempfailed and closed its conversation.
    pub fn end(self) -> bool {
        self.inner.lock().running.remove(&self.id).is_some()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.inner.lock().running.remove(&self.id);
    }
}

impl Watchdog {
    /// Starts the watching thread (`milter-watch`); steps get `deadline`.
    pub fn start(deadline: Duration) -> std::io::Result<Watchdog> {
        let inner = Arc::new(Inner::default());
        let watcher = Arc::clone(&inner);
        std::thread::Builder::new()
            .name("milter-watch".to_string())
            .spawn(move || watcher.run())?;
        Ok(Watchdog { inner, deadline })
    }

    /// How many steps it has timed out.
    pub fn fired(&self) -> u64 {
        self.inner.fired.load(Ordering::Relaxed)
    }

    /// Watches a step on `socket` from now; `owes_reply` says whether the
    /// MTA waits for an answer to it. `None` if the descriptor cannot be
    /// duplicated (out of descriptors): the step then runs unwatched.
    pub fn begin(&self, socket: &impl AsFd, owes_reply: bool) -> Option<Watched> {
        let socket = socket.as_fd().try_clone_to_owned().ok()?;
        let by = Instant::now() + self.deadline;
        let mut state = self.inner.lock();
        let earliest = state.running.values().all(|s| s.by > by);
        let id = state.next_id;
        state.next_id += 1;
        state.running.insert(
            id,
            Step {
                by,
                socket,
                owes_reply,
            },
        );
        drop(state);
        if earliest {
            self.inner.wake.notify_one();
        }
        Some(Watched {
            inner: Arc::clone(&self.inner),
            id,
        })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.inner.lock().stop = true;
        self.inner.wake.notify_one();
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn run(&self) {
        let mut state = self.lock();
        while !state.stop {
            let now = Instant::now();
            let late: Vec<u64> = state
                .running
                .iter()
                .filter(|(_, s)| s.by <= now)
                .map(|(id, _)| *id)
                .collect();
            for id in late {
                if let Some(step) = state.running.remove(&id) {
                    self.time_out(step);
                }
            }
            state = match state.running.values().map(|s| s.by).min() {
                Some(by) => {
                    let wait = by.saturating_duration_since(Instant::now());
                    match self.wake.wait_timeout(state, wait) {
                        Ok((state, _)) => state,
                        Err(poisoned) => poisoned.into_inner().0,
                    }
                }
                None => self.wake.wait(state).unwrap_or_else(|e| e.into_inner()),
            };
        }
    }

    /// Tempfails and closes a late step's conversation. Under the lock, so
    /// its session cannot have ended the step (and written) meanwhile.
    fn time_out(&self, step: Step) {
        self.fired.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            "a milter filter step ran past its deadline; its conversation is tempfailed and closed"
        );
        let socket = socket2::SockRef::from(&step.socket);
        if step.owes_reply {
            let mut packet = Vec::new();
            if Reply::Tempfail.encode(&mut packet).is_ok() {
                // A short write to a socket with room; if the MTA is not
                // reading, the shutdown below tells it all the same.
                let _ = (&*socket).write(&packet);
            }
        }
        let _ = socket.shutdown(Shutdown::Both);
    }
}
