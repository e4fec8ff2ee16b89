//! Workers that are other programs: `forkpool run -- CMD [ARGS...]`.
//!
//! For each slot the supervisor forks as usual, and the child, instead of
//! running a Rust handler, arranges its descriptors and environment and
//! `exec`s the command. What the program finds when it starts:
//!
//! [`forkpool_protocol::layout`] lists the descriptors and environment it
//! finds, the same for a worker in any language.
//!
//! Variables of these names that the supervisor itself inherited are
//! removed, so a worker never mistakes its parent's socket activation for
//! its own. `docs/protocol.md` describes the same layout for people writing
//! workers in other languages; [`crate::worker::ExecWorker`] is the Rust side.
//!
//! In `handoff` the workers get the listeners too, for one use only: a
//! worker finishing a connection may accept the next one already waiting
//! and report `Next` (`docs/protocol.md`, "Taking the next connection");
//! accepting at any other time would break the hot-slot ordering and the
//! back-pressure that handoff exists for.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::process::CommandExt;

use crate::channel::Channel;
use crate::config::SelfLimits;
use crate::protocol;
use crate::sys;

pub use forkpool_protocol::layout::{
    BACKLOG_VAR, BOARD_FD_VAR, CHANNEL_FD_VAR, DISPATCH_VAR, FIRST_FD, GENERATION_VAR,
    KERNEL_DISPATCH_VAR, LISTEN_FDNAMES_VAR, LISTEN_FDS_VAR, LISTEN_PID_VAR,
    MAX_CHILD_LIFETIME_MS_VAR, MAX_CHILD_MEMORY_VAR, MAX_REQUESTS_VAR, OVERFLOW_FD_VAR,
    PROTOCOL_VAR, SLOT_VAR, SUPERVISOR_PID_VAR, TEMPLATE_FD_VAR,
};

const MANAGED_VARS: [&str; 17] = [
    BACKLOG_VAR,
    BOARD_FD_VAR,
    KERNEL_DISPATCH_VAR,
    MAX_REQUESTS_VAR,
    MAX_CHILD_MEMORY_VAR,
    MAX_CHILD_LIFETIME_MS_VAR,
    OVERFLOW_FD_VAR,
    CHANNEL_FD_VAR,
    TEMPLATE_FD_VAR,
    SUPERVISOR_PID_VAR,
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
pub(crate) fn exec_worker(start: WorkerStart, command: &WorkerCommand) -> ! {
    let who = format!("slot {}", start.slot);
    let role = Role::Worker {
        slot: start.slot,
        generation: start.generation,
    };
    let parts = Parts {
        mode: start.mode,
        listeners: start.listeners,
        channel: start.channel,
        stderr: start.stderr,
        kernel: start.board_map.map(|board_map| KernelParts {
            overflow: start.overflow,
            board_map,
            max_requests: start.max_requests,
        }),
        limits: start.limits,
        backlog: start.backlog,
    };
    exec_or_exit(parts, role, command, &who)
}

/// What a freshly forked child hands over to the worker program it
/// `exec`s: its part of a forked child's start (`worker::ChildStart`), less
/// what only an in-process handler uses.
#[derive(Debug)]
pub(crate) struct WorkerStart {
    /// The child's slot.
    pub slot: usize,
    /// The generation it belongs to.
    pub generation: u32,
    /// The dispatch mode.
    pub mode: crate::config::DispatchMode,
    /// The listeners (in `kernel` dispatch, the slot's own sockets).
    pub listeners: Vec<crate::listener::Listener>,
    /// The child's end of its channel.
    pub channel: Channel,
    /// The write end of the worker's stderr pipe.
    pub stderr: Option<OwnedFd>,
    /// `kernel` dispatch: the scoreboard map's descriptor.
    pub board_map: Option<OwnedFd>,
    /// `kernel` dispatch: the overflow sockets.
    pub overflow: Vec<crate::listener::Listener>,
    /// Its share of connections (0: no limit).
    pub max_requests: u64,
    /// `kernel` dispatch: the limits it checks itself.
    pub limits: SelfLimits,
    /// The pool's listen backlog, for `FORKPOOL_BACKLOG`.
    pub backlog: u32,
}

/// What a freshly forked template process (`--preload`) needs to `exec`
/// the worker program as a template.
#[derive(Debug)]
pub(crate) struct TemplateStart {
    /// The generation the template forks workers for.
    pub generation: u32,
    /// The template's end of the template channel.
    pub channel: Channel,
    /// The dispatch mode of the workers it forks.
    pub mode: crate::config::DispatchMode,
    /// The listeners its workers hold.
    pub listeners: Vec<crate::listener::Listener>,
    /// The write end of the template's own stderr pipe.
    pub stderr: Option<OwnedFd>,
    /// The supervisor's pid, for `FORKPOOL_SUPERVISOR_PID`.
    pub supervisor_pid: u32,
    /// `kernel` dispatch: the limits its workers check themselves, which
    /// they inherit with its environment (none in other modes).
    pub limits: SelfLimits,
    /// The pool's listen backlog, for `FORKPOOL_BACKLOG`.
    pub backlog: u32,
}

/// In a freshly forked child: `exec`s `command` as a template, laid out as
/// an exec'd worker except for the variables `docs/protocol.md` lists under
/// "How a program learns it is a template". Never returns, like
/// [`exec_worker`].
pub(crate) fn exec_template(start: TemplateStart, command: &WorkerCommand) -> ! {
    let who = format!("template of generation {}", start.generation);
    let role = Role::Template {
        generation: start.generation,
        supervisor_pid: start.supervisor_pid,
    };
    let parts = Parts {
        mode: start.mode,
        listeners: start.listeners,
        channel: start.channel,
        stderr: start.stderr,
        kernel: None,
        limits: start.limits,
        backlog: start.backlog,
    };
    exec_or_exit(parts, role, command, &who)
}

/// The descriptors an exec'd process gets, worker or template.
struct Parts {
    mode: crate::config::DispatchMode,
    /// The listeners (in `kernel` dispatch, the slot's own sockets).
    listeners: Vec<crate::listener::Listener>,
    channel: Channel,
    stderr: Option<OwnedFd>,
    /// `kernel` dispatch, for a worker that keeps its record.
    kernel: Option<KernelParts>,
    /// `kernel` dispatch: the limits the worker (or a template's workers)
    /// checks itself: `FORKPOOL_MAX_CHILD_MEMORY` and
    /// `FORKPOOL_MAX_CHILD_LIFETIME_MS`.
    limits: SelfLimits,
    /// The pool's listen backlog (`FORKPOOL_BACKLOG`).
    backlog: u32,
}

/// What a worker in `kernel` dispatch gets beyond its own sockets.
struct KernelParts {
    /// The pool's listeners, the overflow (after the own sockets).
    overflow: Vec<crate::listener::Listener>,
    /// The scoreboard map (after the channel).
    board_map: OwnedFd,
    /// This worker's share of connections (0: no limit).
    max_requests: u64,
}

/// Which side of `--preload` the program is started as.
enum Role {
    /// A worker for `slot`, speaking version 1.
    Worker { slot: usize, generation: u32 },
    /// A template, speaking version 2.
    Template {
        generation: u32,
        supervisor_pid: u32,
    },
}

fn exec_or_exit(parts: Parts, role: Role, command: &WorkerCommand, who: &str) -> ! {
    let err = match prepare(parts, role, command) {
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
    eprintln!("forkpool: {who}: cannot run `{command}`: {err}{hint}");
    sys::process::exit_now(code)
}

/// Everything short of the `exec` itself.
fn prepare(parts: Parts, role: Role, command: &WorkerCommand) -> io::Result<std::process::Command> {
    let mode = parts.mode;
    let mut plan: Vec<(OwnedFd, RawFd)> = Vec::new();
    let devnull = std::fs::File::open("/dev/null")?;
    plan.push((devnull.into(), 0));
    if let Some(stderr) = parts.stderr {
        plan.push((stderr, 2));
    }
    // Only modes whose children hold listeners were given them.
    let n = parts.listeners.len();
    let names = listener_names(parts.listeners.iter().map(|l| l.name()));
    for (i, listener) in parts.listeners.into_iter().enumerate() {
        plan.push((listener.into(), FIRST_FD + i as RawFd));
    }
    let channel_fd = FIRST_FD + n as RawFd;
    // Kernel dispatch: after the channel (where it is in every mode), the
    // overflow listeners, then the scoreboard.
    let overflow_fd = channel_fd + 1;
    let board_fd = overflow_fd + n as RawFd;
    let kernel = parts.kernel.map(|kernel| {
        for (i, listener) in kernel.overflow.into_iter().enumerate() {
            plan.push((listener.into(), overflow_fd + i as RawFd));
        }
        plan.push((kernel.board_map, board_fd));
        kernel.max_requests
    });
    if mode.speaks_protocol() {
        plan.push((parts.channel.into(), channel_fd));
    } else {
        drop(parts.channel);
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
    let generation = match role {
        Role::Worker { slot, generation } => {
            if mode.speaks_protocol() {
                cmd.env(CHANNEL_FD_VAR, channel_fd.to_string())
                    .env(PROTOCOL_VAR, protocol::VERSION.to_string());
            }
            cmd.env(SLOT_VAR, slot.to_string());
            generation
        }
        Role::Template {
            generation,
            supervisor_pid,
        } => {
            cmd.env(TEMPLATE_FD_VAR, channel_fd.to_string())
                .env(PROTOCOL_VAR, protocol::TEMPLATE_VERSION.to_string())
                .env(SUPERVISOR_PID_VAR, supervisor_pid.to_string());
            generation
        }
    };
    if let Some(max_requests) = kernel {
        cmd.env(OVERFLOW_FD_VAR, overflow_fd.to_string())
            .env(BOARD_FD_VAR, board_fd.to_string());
        if max_requests > 0 {
            cmd.env(MAX_REQUESTS_VAR, max_requests.to_string());
        }
    }
    if parts.limits.max_memory > 0 {
        cmd.env(MAX_CHILD_MEMORY_VAR, parts.limits.max_memory.to_string());
    }
    if !parts.limits.lifetime.is_zero() {
        cmd.env(
            MAX_CHILD_LIFETIME_MS_VAR,
            parts.limits.lifetime_ms().to_string(),
        );
    }
    cmd.env(GENERATION_VAR, generation.to_string());
    cmd.env(BACKLOG_VAR, parts.backlog.to_string());
    // Kernel dispatch is handoff to a worker that does not know it (one
    // written before it): such a worker says `R` and is handed every
    // connection; one that knows it reads FORKPOOL_KERNEL_DISPATCH.
    if mode == crate::config::DispatchMode::Kernel {
        cmd.env(DISPATCH_VAR, crate::config::DispatchMode::Handoff.name())
            .env(KERNEL_DISPATCH_VAR, "1");
    } else {
        cmd.env(DISPATCH_VAR, mode.name());
    }
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
