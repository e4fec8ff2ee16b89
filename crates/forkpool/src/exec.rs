//! Workers that are other programs: `forkpool run -- CMD [ARGS...]`.
//!
//! For each slot the supervisor forks as usual, and the child, instead of
//! running a Rust handler, arranges its descriptors and environment and
//! `exec`s the command. What the program finds when it starts:
//!
//! | fd          | what                                                        |
//! |-------------|-------------------------------------------------------------|
//! | 0           | `/dev/null`                                                 |
//! | 1           | the supervisor's standard output, shared                    |
//! | 2           | a pipe the supervisor reads; each line is logged with the slot and pid |
//! | 3 … 3+n−1   | the n listening sockets (not in `handoff` mode, where n = 0) |
//! | 3+n         | the back-channel (not in `none` mode)                       |
//!
//! No other descriptor is open. The environment says where things are:
//!
//! | variable              | value                                                   |
//! |-----------------------|---------------------------------------------------------|
//! | `LISTEN_FDS`          | n, when n > 0 (systemd socket activation)               |
//! | `LISTEN_PID`          | the worker's own pid, when n > 0                        |
//! | `LISTEN_FDNAMES`      | each listener's name (`--listen NAME=ADDR`), else `listenerI`; when n > 0 |
//! | `FORKPOOL_CHANNEL_FD` | 3+n, except in `none` mode                              |
//! | `FORKPOOL_PROTOCOL`   | `1`, the back-channel protocol version, except in `none` mode |
//! | `FORKPOOL_SLOT`       | the worker's slot number                                |
//! | `FORKPOOL_GENERATION` | the pool generation (it goes up on every reload)        |
//! | `FORKPOOL_DISPATCH`   | `handoff`, `order`, `shared`, `herd` or `none`          |
//!
//! Variables of these names that the supervisor itself inherited are
//! removed, so a worker never mistakes its parent's socket activation for
//! its own. `docs/protocol.md` describes the same layout for people writing
//! workers in other languages; [`crate::worker::ExecWorker`] is the Rust side.
//!
//! Why `handoff` passes no listener: its workers only ever get connections
//! over the channel, and a worker that holds the listener could accept
//! behind the supervisor's back, which would break the hot-slot ordering
//! and the back-pressure that handoff exists for.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::process::CommandExt;

use crate::protocol;
use crate::sys;
use crate::worker::ChildStart;

/// The first descriptor passed beyond the standard streams (systemd's
/// `SD_LISTEN_FDS_START`).
pub const FIRST_FD: RawFd = 3;

/// Names the back-channel's descriptor number.
pub const CHANNEL_FD_VAR: &str = "FORKPOOL_CHANNEL_FD";
/// The back-channel protocol version, `1`.
pub const PROTOCOL_VAR: &str = "FORKPOOL_PROTOCOL";
/// The worker's slot number.
pub const SLOT_VAR: &str = "FORKPOOL_SLOT";
/// The pool generation the worker belongs to.
pub const GENERATION_VAR: &str = "FORKPOOL_GENERATION";
/// The dispatch mode's name.
pub const DISPATCH_VAR: &str = "FORKPOOL_DISPATCH";
/// systemd socket activation: how many listeners follow fd 2.
pub const LISTEN_FDS_VAR: &str = "LISTEN_FDS";
/// systemd socket activation: the pid the listeners are meant for.
pub const LISTEN_PID_VAR: &str = "LISTEN_PID";
/// systemd socket activation: a name per listener, `:`-separated.
pub const LISTEN_FDNAMES_VAR: &str = "LISTEN_FDNAMES";

const MANAGED_VARS: [&str; 8] = [
    CHANNEL_FD_VAR,
    PROTOCOL_VAR,
    SLOT_VAR,
    GENERATION_VAR,
    DISPATCH_VAR,
    LISTEN_FDS_VAR,
    LISTEN_PID_VAR,
    LISTEN_FDNAMES_VAR,
];

/// The program each worker runs, with its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerCommand {
    program: OsString,
    args: Vec<OsString>,
}

impl WorkerCommand {
    /// A command running `program`, looked up in `PATH` unless it
    /// contains a `/`.
    pub fn new(program: impl Into<OsString>) -> WorkerCommand {
        WorkerCommand {
            program: program.into(),
            args: Vec::new(),
        }
    }

    /// Adds one argument.
    pub fn arg(mut self, arg: impl Into<OsString>) -> WorkerCommand {
        self.args.push(arg.into());
        self
    }

    /// Adds arguments.
    pub fn args<I, S>(mut self, args: I) -> WorkerCommand
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// The program.
    pub fn program(&self) -> &OsStr {
        &self.program
    }

    /// The arguments after the program.
    pub fn arguments(&self) -> &[OsString] {
        &self.args
    }
}

impl fmt::Display for WorkerCommand {
    /// The command as a shell would show it, for logs and errors.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.program.to_string_lossy())?;
        for arg in &self.args {
            write!(f, " {}", arg.to_string_lossy())?;
        }
        Ok(())
    }
}

/// `LISTEN_FDNAMES` for listeners with these names: each name, or
/// `listenerI` for one without (I is the index the back-channel's `C`
/// and `A` messages carry), `:`-separated.
pub fn listener_names<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    names
        .into_iter()
        .enumerate()
        .map(|(i, name)| {
            // systemd's separator cannot be part of a name.
            if name.is_empty() || name.contains(':') {
                format!("listener{i}")
            } else {
                name.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(":")
}

/// In a freshly forked child: lays out the descriptors and environment
/// described in the module docs and `exec`s `command`. Never returns: if the
/// `exec` fails, it writes why on standard error (which the supervisor logs
/// with the slot) and exits with 127 (not found) or 126 (anything else),
/// the shell's conventions.
pub(crate) fn exec_worker(start: ChildStart, command: &WorkerCommand) -> ! {
    let slot = start.slot;
    let err = match prepare(start, command) {
        Ok(mut cmd) => cmd.exec(),
        Err(e) => e,
    };
    let code = if err.kind() == io::ErrorKind::NotFound {
        127
    } else {
        126
    };
    let hint = match err.kind() {
        io::ErrorKind::NotFound => "; check the path, or that the program is on PATH",
        io::ErrorKind::PermissionDenied => "; check that the file is executable",
        _ => "",
    };
    // The error's text ends with "(os error N)": the errno.
    eprintln!("forkpool: slot {slot}: cannot run `{command}`: {err}{hint}");
    sys::process::exit_now(code)
}

/// Everything short of the `exec` itself.
fn prepare(start: ChildStart, command: &WorkerCommand) -> io::Result<std::process::Command> {
    let mode = start.mode;
    let mut plan: Vec<(OwnedFd, RawFd)> = Vec::new();
    let devnull = std::fs::File::open("/dev/null")?;
    plan.push((devnull.into(), 0));
    if let Some(stderr) = start.stderr {
        plan.push((stderr, 2));
    }
    // Only modes whose children hold listeners were given them.
    let n = start.listeners.len();
    let names = listener_names(start.listeners.iter().map(|l| l.name()));
    for (i, listener) in start.listeners.into_iter().enumerate() {
        plan.push((listener.into(), FIRST_FD + i as RawFd));
    }
    let channel_fd = FIRST_FD + n as RawFd;
    if mode.speaks_protocol() {
        plan.push((start.channel.into(), channel_fd));
    } else {
        drop(start.channel);
    }
    sys::fds::place_for_exec(plan)?;

    let mut cmd = std::process::Command::new(&command.program);
    cmd.args(&command.args);
    for var in MANAGED_VARS {
        cmd.env_remove(var);
    }
    if n > 0 {
        cmd.env(LISTEN_FDS_VAR, n.to_string())
            .env(LISTEN_PID_VAR, std::process::id().to_string())
            .env(LISTEN_FDNAMES_VAR, names);
    }
    if mode.speaks_protocol() {
        cmd.env(CHANNEL_FD_VAR, channel_fd.to_string())
            .env(PROTOCOL_VAR, protocol::VERSION.to_string());
    }
    cmd.env(SLOT_VAR, start.slot.to_string())
        .env(GENERATION_VAR, start.generation.to_string())
        .env(DISPATCH_VAR, mode.name());
    Ok(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_number_the_listeners() {
        assert_eq!(listener_names([]), "");
        assert_eq!(listener_names(["", ""]), "listener0:listener1");
        assert_eq!(
            listener_names(["public", "", "a:b"]),
            "public:listener1:listener2"
        );
    }

    #[test]
    fn a_command_shows_like_a_shell_line() {
        let cmd = WorkerCommand::new("python3").args(["worker.py", "--chaos"]);
        assert_eq!(cmd.to_string(), "python3 worker.py --chaos");
        assert_eq!(cmd.program(), "python3");
        assert_eq!(cmd.arguments().len(), 2);
    }
}
