//! A Rust worker that `forkpool run` starts as its own executable.
//!
//! ```no_run
//! use std::io::Write;
//! use forkpool::worker::ExecWorker;
//!
//! let worker = match ExecWorker::from_env() {
//!     Ok(worker) => worker,
//!     Err(e) => {
//!         eprintln!("{e}");
//!         std::process::exit(2);
//!     }
//! };
//! // Load what the handler needs here, once per worker process.
//! let code = worker.serve(|mut conn: forkpool::Connection<'_>| {
//!     let _ = conn.stream.write_all(b"hello\n");
//! });
//! std::process::exit(code);
//! ```
//!
//! [`ExecWorker::from_env`] reads the layout [`crate::exec`] describes
//! (`FORKPOOL_CHANNEL_FD`, `LISTEN_FDS`, …), takes ownership of the
//! inherited descriptors (and marks them close-on-exec, so programs the
//! handler runs do not inherit them), and [`ExecWorker::serve`] runs the
//! same loops as a forked library child. The environment variables are
//! left in place; `LISTEN_PID` names this process, so a program the
//! handler starts will not take them for its own.

use std::fmt;
use std::os::fd::{AsFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

use super::{run_child, ChildStart, Handler};
use crate::channel::Channel;
use crate::config::DispatchMode;
use crate::exec::{
    CHANNEL_FD_VAR, DISPATCH_VAR, FIRST_FD, GENERATION_VAR, LISTEN_FDS_VAR, LISTEN_PID_VAR,
    PROTOCOL_VAR, SLOT_VAR,
};
use crate::listener::Listener;
use crate::protocol;
use crate::sys;

/// Set once the inherited descriptors have been claimed: a second claim
/// would make two owners of one descriptor.
static CLAIMED: AtomicBool = AtomicBool::new(false);

/// A worker process started by `forkpool run`, ready to serve.
#[derive(Debug)]
pub struct ExecWorker {
    start: ChildStart,
}

/// Why [`ExecWorker::from_env`] could not set up the worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecWorkerError {
    message: String,
}

impl fmt::Display for ExecWorkerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot start as a forkpool worker: {}", self.message)
    }
}

impl std::error::Error for ExecWorkerError {}

fn fail<T>(message: impl Into<String>) -> Result<T, ExecWorkerError> {
    Err(ExecWorkerError {
        message: message.into(),
    })
}

/// What the environment announces, before any descriptor is touched.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Layout {
    mode: DispatchMode,
    slot: usize,
    generation: u32,
    channel_fd: RawFd,
    listener_fds: Vec<RawFd>,
}

/// Reads the layout from `var` (the environment, or a test's map) for the
/// process `pid`.
fn read_layout(var: impl Fn(&str) -> Option<String>, pid: u32) -> Result<Layout, ExecWorkerError> {
    let required = |name: &str| {
        var(name).ok_or_else(|| ExecWorkerError {
            message: format!(
                "{name} is not set; run this program under `forkpool run ... -- PROGRAM`"
            ),
        })
    };
    let number = |name: &str, text: String| {
        text.trim().parse::<u64>().map_err(|_| ExecWorkerError {
            message: format!("{name}={text:?} is not a number"),
        })
    };
    let mode: DispatchMode = required(DISPATCH_VAR)?
        .parse()
        .map_err(|e: String| ExecWorkerError { message: e })?;
    if !mode.speaks_protocol() {
        return fail(
            "the pool runs with --dispatch none, which has no back-channel: \
             accept on the LISTEN_FDS listeners directly instead",
        );
    }
    let version = required(PROTOCOL_VAR)?;
    if version.trim() != protocol::VERSION.to_string() {
        return fail(format!(
            "the supervisor speaks back-channel protocol {version}, this worker speaks {}; \
             use matching forkpool versions",
            protocol::VERSION
        ));
    }
    let slot = number(SLOT_VAR, required(SLOT_VAR)?)? as usize;
    let generation =
        u32::try_from(number(GENERATION_VAR, required(GENERATION_VAR)?)?).map_err(|_| {
            ExecWorkerError {
                message: format!("{GENERATION_VAR} is out of range"),
            }
        })?;
    let channel_fd = number(CHANNEL_FD_VAR, required(CHANNEL_FD_VAR)?)?;
    let listeners = match var(LISTEN_FDS_VAR) {
        None => 0,
        Some(n) => {
            let listen_pid = number(LISTEN_PID_VAR, required(LISTEN_PID_VAR)?)?;
            if listen_pid != u64::from(pid) {
                return fail(format!(
                    "LISTEN_PID is {listen_pid} but this process is {pid}: the listeners were \
                     passed to another process (a shell wrapper that forks instead of `exec`ing?)"
                ));
            }
            number(LISTEN_FDS_VAR, n)?
        }
    };
    if mode.children_hold_listeners() && listeners == 0 {
        return fail(format!(
            "dispatch '{mode}' needs the listeners, but LISTEN_FDS is not set"
        ));
    }
    let expected = u64::from(FIRST_FD as u32) + listeners;
    if channel_fd != expected {
        return fail(format!(
            "{CHANNEL_FD_VAR} is {channel_fd}, but with {listeners} listener(s) it must be {expected}"
        ));
    }
    Ok(Layout {
        mode,
        slot,
        generation,
        channel_fd: channel_fd as RawFd,
        listener_fds: (0..listeners as RawFd).map(|i| FIRST_FD + i).collect(),
    })
}

impl ExecWorker {
    /// Reads the environment `forkpool run` set up and takes the inherited
    /// back-channel and listeners. Call it once, early, before anything
    /// else in the program opens descriptors it might confuse with them.
    pub fn from_env() -> Result<ExecWorker, ExecWorkerError> {
        let layout = read_layout(|name| std::env::var(name).ok(), std::process::id())?;
        if CLAIMED.swap(true, Ordering::SeqCst) {
            return fail("ExecWorker::from_env was already called in this process");
        }
        let io_error = |what: String| {
            move |e: std::io::Error| ExecWorkerError {
                message: format!("{what}: {e}"),
            }
        };
        let mut listeners = Vec::with_capacity(layout.listener_fds.len());
        for fd in &layout.listener_fds {
            let owned =
                sys::fds::take_inherited(*fd).map_err(io_error(format!("listener {fd}")))?;
            let listener =
                Listener::from_inherited(owned).map_err(io_error(format!("listener {fd}")))?;
            listeners.push(listener);
        }
        let channel_fd = layout.channel_fd;
        let channel = sys::fds::take_inherited(channel_fd)
            .map_err(io_error(format!("back-channel {channel_fd}")))?;
        let kind = socket2::SockRef::from(&channel).r#type();
        if !matches!(kind, Ok(t) if t == socket2::Type::SEQPACKET) {
            return fail(format!(
                "back-channel {channel_fd} is not a SOCK_SEQPACKET socket"
            ));
        }
        // The child's end is ours alone (the supervisor holds the other
        // end), so setting it blocking affects nobody else.
        sys::socket::set_nonblocking(channel.as_fd(), false)
            .map_err(io_error(format!("back-channel {channel_fd}")))?;
        Ok(ExecWorker {
            start: ChildStart {
                slot: layout.slot,
                generation: layout.generation,
                channel: Channel::from_fd(channel),
                mode: layout.mode,
                listener_is_tcp: listeners.iter().map(Listener::is_tcp).collect(),
                listeners,
                max_requests: 0,
                stderr: None,
            },
        })
    }

    /// The worker's slot number.
    pub fn slot(&self) -> usize {
        self.start.slot
    }

    /// The pool generation the worker belongs to.
    pub fn generation(&self) -> u32 {
        self.start.generation
    }

    /// The pool's dispatch mode.
    pub fn dispatch(&self) -> DispatchMode {
        self.start.mode
    }

    /// The listeners this worker holds (none in `handoff` mode).
    pub fn listeners(&self) -> &[Listener] {
        &self.start.listeners
    }

    /// Says `Ready`, then serves connections with `handler` until the
    /// supervisor says quit or goes away, and returns the exit status to
    /// end the process with: 0 after a clean stop, 1 after a protocol or
    /// channel error (logged with `tracing`) or a handler panic.
    pub fn serve<H: Handler>(self, mut handler: H) -> i32 {
        run_child(self.start, &mut handler)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn layout(vars: &[(&str, &str)], pid: u32) -> Result<Layout, ExecWorkerError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        read_layout(|name| map.get(name).cloned(), pid)
    }

    const BASE: [(&str, &str); 4] = [
        ("FORKPOOL_PROTOCOL", "1"),
        ("FORKPOOL_SLOT", "4"),
        ("FORKPOOL_GENERATION", "2"),
        ("FORKPOOL_DISPATCH", "order"),
    ];

    fn with(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
        BASE.iter().chain(extra).copied().collect()
    }

    #[test]
    fn order_worker_with_two_listeners() {
        let vars = with(&[
            ("LISTEN_FDS", "2"),
            ("LISTEN_PID", "77"),
            ("FORKPOOL_CHANNEL_FD", "5"),
        ]);
        assert_eq!(
            layout(&vars, 77).unwrap(),
            Layout {
                mode: DispatchMode::Order,
                slot: 4,
                generation: 2,
                channel_fd: 5,
                listener_fds: vec![3, 4],
            }
        );
    }

    #[test]
    fn handoff_worker_has_only_the_channel() {
        let mut vars = with(&[("FORKPOOL_CHANNEL_FD", "3")]);
        vars[3] = ("FORKPOOL_DISPATCH", "handoff");
        let got = layout(&vars, 1).unwrap();
        assert_eq!(got.channel_fd, 3);
        assert!(got.listener_fds.is_empty());
    }

    #[test]
    fn listeners_meant_for_another_pid_are_refused() {
        let vars = with(&[
            ("LISTEN_FDS", "1"),
            ("LISTEN_PID", "77"),
            ("FORKPOOL_CHANNEL_FD", "4"),
        ]);
        let err = layout(&vars, 78).unwrap_err().to_string();
        assert!(
            err.contains("LISTEN_PID is 77 but this process is 78"),
            "{err}"
        );
    }

    #[test]
    fn missing_or_inconsistent_variables_name_the_fix() {
        let err = layout(&[], 1).unwrap_err().to_string();
        assert!(err.contains("FORKPOOL_DISPATCH is not set"), "{err}");
        assert!(err.contains("forkpool run"), "{err}");

        let vars = with(&[("FORKPOOL_CHANNEL_FD", "3")]);
        let err = layout(&vars, 1).unwrap_err().to_string();
        assert!(err.contains("needs the listeners"), "{err}");

        let vars = with(&[
            ("LISTEN_FDS", "1"),
            ("LISTEN_PID", "1"),
            ("FORKPOOL_CHANNEL_FD", "3"),
        ]);
        let err = layout(&vars, 1).unwrap_err().to_string();
        assert!(err.contains("it must be 4"), "{err}");

        let mut vars = with(&[("FORKPOOL_CHANNEL_FD", "3")]);
        vars[0] = ("FORKPOOL_PROTOCOL", "2");
        let err = layout(&vars, 1).unwrap_err().to_string();
        assert!(err.contains("protocol 2"), "{err}");
    }

    #[test]
    fn dispatch_none_has_no_worker_side() {
        let mut vars = with(&[("LISTEN_FDS", "1"), ("LISTEN_PID", "1")]);
        vars[3] = ("FORKPOOL_DISPATCH", "none");
        let err = layout(&vars, 1).unwrap_err().to_string();
        assert!(err.contains("no back-channel"), "{err}");
    }
}
