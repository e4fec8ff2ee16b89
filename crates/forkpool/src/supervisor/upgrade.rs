//! SIGUSR2: replace the running supervisor with a fresh copy of its binary
//! (possibly a new version) without closing the listeners.
//!
//! 1. The old supervisor forks; the child places the listeners at
//!    descriptors 3.. (`LISTEN_FDS`, `LISTEN_PID`, `LISTEN_FDNAMES`) and a
//!    pipe's write end after them (`FORKPOOL_UPGRADE_READY_FD`), then execs
//!    the binary with the original arguments.
//! 2. The new supervisor adopts the listeners, starts its own children and,
//!    once they are ready, writes `ready` to the pipe.
//! 3. The old supervisor then shuts down gracefully: it stops accepting
//!    (the new one is already accepting on the same sockets), lets busy
//!    children finish, and exits. No connection is refused at any point.
//!
//! If the new supervisor exits, or is not ready within `start_timeout`
//! plus [`SUCCESSOR_START`], the old one says why and keeps serving as if
//! nothing happened. Those decisions are the core's (`core/upgrade.rs`);
//! this file forks, execs and reads the readiness pipe.

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::time::Instant;

use nix::sys::signal::Signal;
use tracing::{error, info, warn};

use super::event::Event;
use super::Supervisor;
use crate::core::upgrade::{Successor, SUCCESSOR_START};
use crate::sys::process::{self, ExitStatus, Forked};

/// The variable naming the pipe a new supervisor reports readiness on.
pub const READY_FD_ENV: &str = "FORKPOOL_UPGRADE_READY_FD";
/// The variable telling a new supervisor which pid it replaces.
pub const UPGRADE_FROM_ENV: &str = "FORKPOOL_UPGRADE_FROM";
/// Set (to `1`) for a new supervisor whose listeners came from systemd
/// socket activation in the first place, through its predecessor.
pub const SOCKET_ACTIVATED_ENV: &str = "FORKPOOL_SOCKET_ACTIVATED";
/// How to start the new supervisor: the binary's path as it was when this
/// one started (so a binary replaced on disk is picked up) and the original
/// arguments.
#[derive(Debug, Clone)]
pub struct UpgradeCommand {
    /// The program.
    pub program: PathBuf,
    /// Its arguments, without the program name.
    pub args: Vec<OsString>,
}

impl UpgradeCommand {
    /// The command this process was started with.
    pub fn current() -> io::Result<UpgradeCommand> {
        let program = std::env::current_exe()?;
        Ok(UpgradeCommand {
            program,
            args: std::env::args_os().skip(1).collect(),
        })
    }
}

/// Both ends of a binary upgrade, as this supervisor sees them.
#[derive(Default)]
pub(crate) struct Handover {
    /// How to re-exec for an upgrade (SIGUSR2), if enabled.
    pub command: Option<UpgradeCommand>,
    /// The successor being started, if an upgrade is in progress.
    pub successor: Option<Upgrade>,
    /// In a supervisor started by an upgrade: the pipe to report ready on.
    pub predecessor: Option<OwnedFd>,
    /// A successor took over: this supervisor is draining.
    pub handed_over: bool,
}

/// An upgrade in progress: the successor's readiness pipe (its pid and
/// deadline are the core's).
pub(crate) struct Upgrade {
    ready: UnixStream,
}

impl Supervisor {
    /// SIGUSR2: start the new supervisor.
    pub(super) fn begin_upgrade(&mut self, now: Instant) {
        let command = self.handover.command.clone();
        if let Err(why) = self.core.may_upgrade(command.is_some()) {
            warn!("SIGUSR2 ignored: {why}");
            return;
        }
        let Some(command) = command else {
            return;
        };
        self.release_listeners_for_successor();
        match self.spawn_successor(&command) {
            Ok((pid, ready)) => {
                info!(pid, program = %command.program.display(), "upgrade: started a new supervisor");
                if let Err(e) = self.wake.watch(ready.as_raw_fd(), Event::Upgrade) {
                    error!("upgrade: cannot watch the new supervisor: {e}");
                }
                self.core.successor_started(pid, now);
                self.handover.successor = Some(Upgrade { ready });
            }
            Err(e) => {
                self.upgrade_failed();
                error!("upgrade failed, this supervisor keeps serving: {e}");
            }
        }
    }

    fn spawn_successor(&mut self, command: &UpgradeCommand) -> io::Result<(i32, UnixStream)> {
        let (ours, theirs) = UnixStream::pair()?;
        ours.set_nonblocking(true)?;
        let _ = io::stdout().flush();
        let _ = io::stderr().flush();
        match process::fork()? {
            Forked::Parent(pid) => Ok((pid, ours)),
            Forked::Child => {
                let err = self.exec_successor(command, theirs);
                eprintln!(
                    "forkpool: cannot start {} for the upgrade: {err}",
                    command.program.display()
                );
                // Exit without running the supervisor's destructors: they
                // belong to the parent.
                std::process::exit(127)
            }
        }
    }

    /// In the forked child: descriptors in place, then exec. Returns only
    /// on failure.
    fn exec_successor(&self, command: &UpgradeCommand, ready: UnixStream) -> io::Error {
        if let Err(e) = process::default_signals() {
            return e;
        }
        let mut fds: Vec<std::os::fd::BorrowedFd<'_>> =
            self.listeners.iter().map(|l| l.listener.as_fd()).collect();
        let mut names: Vec<&str> = self
            .listeners
            .iter()
            .map(|l| match l.listener.name() {
                "" => "unknown",
                name => name,
            })
            .collect();
        // The metrics and agent ports go along, so the successor answers
        // on them without a moment where nobody listens.
        for (fd, name) in self.endpoints.passable() {
            fds.push(fd);
            names.push(name);
        }
        let n = fds.len();
        let ready_fd: OwnedFd = ready.into();
        fds.push(ready_fd.as_fd());
        if let Err(e) = process::place_fds(&fds, 3) {
            return e;
        }
        let mut exec = std::process::Command::new(&command.program);
        if self.options.listeners_outlive_pool {
            exec.env(SOCKET_ACTIVATED_ENV, "1");
        } else {
            exec.env_remove(SOCKET_ACTIVATED_ENV);
        }
        exec.args(&command.args)
            .env("LISTEN_FDS", n.to_string())
            .env("LISTEN_PID", std::process::id().to_string())
            .env("LISTEN_FDNAMES", names.join(":"))
            .env(READY_FD_ENV, (3 + n).to_string())
            .env(UPGRADE_FROM_ENV, self.published.pid.to_string())
            .exec()
    }

    /// The new supervisor wrote to, or closed, the readiness pipe.
    pub(super) fn upgrade_progress(&mut self, now: Instant) {
        let (Some(upgrade), Some(successor)) =
            (self.handover.successor.as_mut(), self.core.successor())
        else {
            return;
        };
        let pid = successor.pid;
        let mut buf = [0u8; 16];
        let read = upgrade.ready.read(&mut buf);
        match said(read.map(|n| &buf[..n])) {
            Said::Ready => {
                self.core.successor_ready();
                self.end_upgrade(pid);
                info!(
                    pid,
                    "upgrade: the new supervisor is ready; this one drains and exits"
                );
                self.successor_ready(now);
            }
            Said::Ended => {
                self.upgrade_failed();
                error!(
                    pid,
                    "upgrade failed: the new supervisor stopped before it was ready; \
                     this supervisor keeps serving (see its messages above)"
                );
            }
            Said::Nothing => {}
            Said::Failed(e) => {
                self.upgrade_failed();
                error!("upgrade failed: {e}; this supervisor keeps serving");
            }
        }
    }

    /// Kills a new supervisor that did not become ready in time.
    pub(super) fn check_upgrade(&mut self, now: Instant) {
        let Some(Successor { pid, timeout, .. }) = self.core.successor_late(now) else {
            return;
        };
        let _ = process::send_signal(pid, Signal::SIGKILL);
        self.upgrade_failed();
        error!(
            pid,
            "upgrade failed: the new supervisor was not ready within {timeout:?} \
             (start_timeout plus {SUCCESSOR_START:?}); killed it, this supervisor keeps \
             serving"
        );
    }

    /// Carries out [`crate::core::Effect::SuccessorGone`]: the new
    /// supervisor exited before it was ready (the core counted it).
    pub(super) fn successor_gone(&mut self, pid: i32, status: ExitStatus) {
        self.end_upgrade(pid);
        self.reclaim_listeners_from_successor();
        error!(
            pid,
            %status,
            "upgrade failed: the new supervisor exited; this supervisor keeps serving"
        );
    }

    /// An upgrade failed: the core counts it, and kernel dispatch takes
    /// its listeners back.
    fn upgrade_failed(&mut self) {
        if let Some(successor) = self.core.upgrade_failed() {
            self.end_upgrade(successor.pid);
        }
        self.reclaim_listeners_from_successor();
    }

    /// Stops watching the successor `pid`'s readiness pipe.
    fn end_upgrade(&mut self, pid: i32) {
        if let Some(upgrade) = self.handover.successor.take() {
            // A successor that became ready has moved its socket into
            // place already; one that failed may have left it beside ours.
            self.endpoints.remove_successor_control(pid);
            self.wake.forget(upgrade.ready.as_raw_fd());
        }
    }

    /// In a new supervisor: tell the old one we are ready (once).
    pub(super) fn tell_predecessor_ready(&mut self) {
        if let Some(fd) = self.handover.predecessor.take() {
            if let Err(e) = self.endpoints.take_control_home() {
                warn!("cannot move the control socket into place: {e}");
            }
            super::notify::main_pid();
            let mut pipe = UnixStream::from(fd);
            match pipe.write_all(b"ready\n") {
                Ok(()) => info!("told the previous supervisor to drain and exit"),
                Err(e) => warn!("cannot tell the previous supervisor we are ready: {e}"),
            }
        }
    }
}

/// What a read of the new supervisor's readiness pipe says.
#[derive(Debug)]
enum Said {
    /// It wrote `ready`: it serves, this one drains.
    Ready,
    /// It closed the pipe, or wrote anything else: it ended, or will,
    /// before it was ready.
    Ended,
    /// Nothing yet.
    Nothing,
    /// The pipe cannot be read.
    Failed(io::Error),
}

/// What `read` (the bytes read from the pipe, or the error) says.
fn said(read: io::Result<&[u8]>) -> Said {
    match read {
        Ok(bytes) if bytes.starts_with(b"ready") => Said::Ready,
        Ok(_) => Said::Ended,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Said::Nothing,
        Err(e) => Said::Failed(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ready_on_the_pipe_hands_over() {
        assert!(matches!(said(Ok(b"ready\n")), Said::Ready));
        assert!(matches!(said(Ok(b"")), Said::Ended));
        assert!(matches!(said(Ok(b"read")), Said::Ended));
        assert!(matches!(said(Ok(b"error")), Said::Ended));
        let blocked = io::Error::from(io::ErrorKind::WouldBlock);
        assert!(matches!(said(Err(blocked)), Said::Nothing));
        let broken = io::Error::from(io::ErrorKind::BrokenPipe);
        assert!(matches!(said(Err(broken)), Said::Failed(_)));
    }
}
