//! Processes: forking, reaping, killing, and the child's signal set-up.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
#[cfg(feature = "herd")]
use nix::sys::resource::{getrusage, UsageWho};
use nix::sys::signal::{self, SigHandler, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{ForkResult, Pid};

/// Which side of a fork we are on.
pub enum Forked {
    /// The parent, with the child's pid.
    Parent(i32),
    /// The new child.
    Child,
}

/// Number of threads in this process, from `/proc/self/task`.
pub fn thread_count() -> io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

/// Forks. The caller must have checked that the process is single-threaded
/// (see [`thread_count`]): the child of a multi-threaded parent may only
/// call async-signal-safe functions, and forkpool's children run arbitrary
/// code.
pub fn fork() -> io::Result<Forked> {
    // SAFETY: callers check that this process has exactly one thread, so no
    // lock can be held by a thread that does not exist in the child.
    match unsafe { nix::unistd::fork() } {
        Ok(ForkResult::Parent { child }) => Ok(Forked::Parent(child.as_raw())),
        Ok(ForkResult::Child) => Ok(Forked::Child),
        Err(e) => Err(e.into()),
    }
}

/// Signals the supervisor handles; a child resets or ignores them.
pub const SUPERVISOR_SIGNALS: [Signal; 8] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGQUIT,
    Signal::SIGHUP,
    Signal::SIGUSR2,
    Signal::SIGTTIN,
    Signal::SIGTTOU,
    Signal::SIGCHLD,
];

/// In a freshly forked child: drop the supervisor's signal handlers (they
/// write to descriptors the child is about to close) and ignore the signals
/// a terminal sends to the whole process group, so that Ctrl-C reaches the
/// supervisor alone and it decides how children stop. SIGTERM keeps its
/// default action: it is the parent-death signal and the way to stop one
/// child by hand.
pub fn reset_child_signals() -> io::Result<()> {
    for sig in SUPERVISOR_SIGNALS {
        let handler = match sig {
            Signal::SIGINT | Signal::SIGQUIT | Signal::SIGHUP => SigHandler::SigIgn,
            Signal::SIGUSR2 | Signal::SIGTTIN | Signal::SIGTTOU => SigHandler::SigIgn,
            _ => SigHandler::SigDfl,
        };
        // SAFETY: installing SIG_DFL or SIG_IGN runs no code of ours in
        // signal context.
        unsafe { signal::signal(sig, handler) }?;
    }
    Ok(())
}

/// Before exec'ing a new supervisor: every signal the old one handles or
/// ignores goes back to its default, as a freshly started program expects.
pub fn default_signals() -> io::Result<()> {
    for sig in SUPERVISOR_SIGNALS {
        // SAFETY: installing SIG_DFL runs no code of ours in signal context.
        unsafe { signal::signal(sig, SigHandler::SigDfl) }?;
    }
    Ok(())
}

/// Ask the kernel to send SIGTERM to this process when its parent dies, and
/// exit at once if the parent is already gone (it may have died between the
/// fork and this call).
pub fn die_with_parent(parent: i32) -> io::Result<()> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;
    if nix::unistd::getppid().as_raw() != parent {
        std::process::exit(0);
    }
    Ok(())
}

/// Drops root: the only group becomes `gid`, then the user `uid`. Order
/// matters: after `setuid` the process may no longer change its groups.
pub fn become_user(uid: u32, gid: u32) -> io::Result<()> {
    use nix::unistd::{setgid, setgroups, setuid, Gid, Uid};
    setgroups(&[Gid::from_raw(gid)])?;
    setgid(Gid::from_raw(gid))?;
    setuid(Uid::from_raw(uid))?;
    Ok(())
}

/// In a forked child about to exec: puts `fds` at descriptors `first`,
/// `first + 1`, ... without close-on-exec, so the new program finds them
/// there (the systemd `LISTEN_FDS` convention). Everything else the
/// supervisor opened is close-on-exec and vanishes at exec.
pub fn place_fds(fds: &[BorrowedFd<'_>], first: RawFd) -> io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg};
    let above = first + fds.len() as RawFd;
    // Move every source above the target range first, so placing one
    // cannot overwrite another that is still to be placed.
    let mut high = Vec::with_capacity(fds.len());
    for fd in fds {
        let raw = fcntl(*fd, FcntlArg::F_DUPFD_CLOEXEC(above))?;
        // SAFETY: F_DUPFD_CLOEXEC returned a new descriptor nothing else owns.
        high.push(unsafe { OwnedFd::from_raw_fd(raw) });
    }
    for (i, fd) in high.iter().enumerate() {
        // SAFETY: dup2 on two valid descriptor numbers; the target, if open,
        // is closed atomically, and the copy it makes has no close-on-exec
        // flag, which is the point.
        if unsafe { libc::dup2(fd.as_raw_fd(), first + i as RawFd) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Takes ownership of a descriptor number passed in an environment
/// variable by our predecessor (binary upgrade), and removes the variable.
pub fn take_fd_from_env(var: &str) -> io::Result<Option<OwnedFd>> {
    let Some(text) = std::env::var_os(var) else {
        return Ok(None);
    };
    std::env::remove_var(var);
    let raw: RawFd = text
        .to_str()
        .and_then(|t| t.parse().ok())
        .filter(|fd| *fd > 2)
        .ok_or_else(|| io::Error::other(format!("{var} is not a descriptor number")))?;
    if nix::fcntl::fcntl(
        // SAFETY: only used to ask whether the number is an open descriptor.
        unsafe { BorrowedFd::borrow_raw(raw) },
        nix::fcntl::FcntlArg::F_GETFD,
    )
    .is_err()
    {
        return Err(io::Error::other(format!(
            "{var}={raw} is not an open descriptor"
        )));
    }
    // SAFETY: the variable names a descriptor our predecessor opened for us
    // and that is open (checked); the variable is gone, so it is taken once.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    nix::fcntl::fcntl(
        fd.as_fd(),
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )?;
    Ok(Some(fd))
}

/// Sends `sig` to `pid`; a process that is already gone is not an error.
pub fn send_signal(pid: i32, sig: Signal) -> io::Result<()> {
    match signal::kill(Pid::from_raw(pid), sig) {
        Ok(()) | Err(Errno::ESRCH) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A pidfd for `pid` (`pidfd_open`): a handle on that very process, which
/// cannot come to name another one when the pid is reused. Take it while
/// the pid is certainly the caller's: its own unreaped child.
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new
    // descriptor or -1; no memory is passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Sends `sig` to the process `pidfd` holds (`pidfd_send_signal`); a
/// process that has exited already is not an error.
pub fn pidfd_signal(pidfd: BorrowedFd<'_>, sig: Signal) -> io::Result<()> {
    // SAFETY: pidfd_send_signal takes a descriptor, a signal number, a null
    // siginfo and flags; no memory of ours is written.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig as libc::c_int,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    match rc {
        0 => Ok(()),
        _ => match Errno::last() {
            Errno::ESRCH => Ok(()),
            e => Err(e.into()),
        },
    }
}

/// Makes `pid` (0: this process) the leader of a process group of its
/// own, so that what it starts can be signalled with it. Called in both
/// the child and the parent after a fork, as shells do, so the group
/// exists whichever runs first; the parent's call fails harmlessly
/// (`EACCES`) once the child has exec'd.
pub fn own_process_group(pid: i32) -> io::Result<()> {
    let pid = Pid::from_raw(pid);
    match nix::unistd::setpgid(pid, pid) {
        Ok(()) | Err(Errno::EACCES) | Err(Errno::ESRCH) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Sends `sig` to every process in the process group `pgid`. Returns
/// whether any process was there to get it.
pub fn signal_group(pgid: i32, sig: Signal) -> io::Result<bool> {
    match signal::killpg(Pid::from_raw(pgid), sig) {
        Ok(()) => Ok(true),
        Err(Errno::ESRCH) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// How a reaped child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// Exited with this status code.
    Code(i32),
    /// Killed by this signal.
    Signal(Signal),
}

impl std::fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExitStatus::Code(c) => write!(f, "exit status {c}"),
            ExitStatus::Signal(s) => write!(f, "signal {}", s.as_str()),
        }
    }
}

/// One exited child, without blocking; `None` when no child has exited.
pub fn reap_one() -> io::Result<Option<(i32, ExitStatus)>> {
    loop {
        match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) => {
                return Ok(Some((pid.as_raw(), ExitStatus::Code(code))))
            }
            Ok(WaitStatus::Signaled(pid, sig, _)) => {
                return Ok(Some((pid.as_raw(), ExitStatus::Signal(sig))))
            }
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return Ok(None),
            Ok(_) => continue,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Ends this process at once with `code`, running no exit handlers and
/// flushing no buffers: for a forked child whose `exec` failed, which must
/// not run anything the supervisor registered.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit takes no pointers and never returns; skipping atexit
    // handlers is the point.
    unsafe { libc::_exit(code) }
}

#[cfg(feature = "herd")]
/// This thread's voluntary context switches so far (each is one sleep):
/// one `getrusage` call, cheap enough not to slow the `herd` it measures.
pub fn voluntary_switches() -> Option<u64> {
    let usage = getrusage(UsageWho::RUSAGE_THREAD).ok()?;
    u64::try_from(usage.voluntary_context_switches()).ok()
}

/// This process's parent pid.
pub fn parent_pid() -> i32 {
    nix::unistd::getppid().as_raw()
}

/// In a worker forked from a template, through an intermediate process
/// `middle` that exits at once: waits until this process has been
/// reparented *and* `middle` has been reaped (its `/proc` entry is gone),
/// polling until `deadline`. The kernel changes the parent and then sends
/// the parent-death signal during the intermediate's exit, so a signal
/// armed before both are done could still fire. Returns whether both
/// happened in time.
pub fn wait_reparented(middle: i32, deadline: std::time::Instant) -> bool {
    let gone = std::path::PathBuf::from(format!("/proc/{middle}"));
    loop {
        if parent_pid() != middle && !gone.exists() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

/// Arms `SIGTERM` as the parent-death signal, then says whether the parent
/// is still `supervisor`: if not, it died before the signal was armed (or
/// is not a subreaper) and the caller must exit.
pub fn arm_parent_death(supervisor: i32) -> io::Result<bool> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;
    Ok(parent_pid() == supervisor)
}

/// Whether the kernel reaps this process's children as they exit
/// (`SIGCHLD` ignored) instead of leaving them for `waitpid`. A template
/// turns it on so that it need not wait for each intermediate process; a
/// worker forked from it turns it off again, as its children are its own.
pub fn reap_children_automatically(on: bool) -> io::Result<()> {
    let handler = if on {
        SigHandler::SigIgn
    } else {
        SigHandler::SigDfl
    };
    // SAFETY: installing SIG_IGN or SIG_DFL runs no code of ours in signal
    // context.
    unsafe { signal::signal(Signal::SIGCHLD, handler) }?;
    Ok(())
}

/// Makes this process a child subreaper (`PR_SET_CHILD_SUBREAPER`): a
/// process whose parent dies and that descends from this one is
/// reparented here rather than to init, so the workers a template forks
/// (through an intermediate that exits at once) become this process's
/// children, to reap, count and kill.
pub fn become_subreaper() -> io::Result<()> {
    nix::sys::prctl::set_child_subreaper(true)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pidfd_signals_the_process_it_holds_and_a_gone_one_is_no_error() {
        let mut child = std::process::Command::new("sleep")
            .arg("100")
            .spawn()
            .unwrap();
        let pidfd = pidfd_open(child.id() as i32).unwrap();
        pidfd_signal(pidfd.as_fd(), Signal::SIGKILL).unwrap();
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        // Reaped: the pidfd still names that process, which is gone.
        pidfd_signal(pidfd.as_fd(), Signal::SIGKILL).unwrap();
    }
}
