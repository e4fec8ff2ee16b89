//! Descriptor plumbing for exec'd workers: pipes, putting descriptors at
//! fixed numbers before `exec`, closing everything else, and taking
//! ownership of descriptors a worker inherited.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};

/// Whether descriptor number `fd` is open: one `fcntl(F_GETFD)`, which
/// touches nothing.
pub fn is_open(fd: RawFd) -> bool {
    // SAFETY: F_GETFD only reads the descriptor's flags; on a number that
    // is not open it fails with EBADF. No Rust object is created for it.
    unsafe { libc::fcntl(fd, libc::F_GETFD) != -1 }
}

/// The descriptor at the start of the reserve a worker keeps below its
/// soft `RLIMIT_NOFILE` (min(32, soft / 4) descriptors), with the limit;
/// `None` without a limit (docs/protocol.md, "Running out of descriptors").
pub fn descriptor_ceiling() -> Option<(RawFd, u64)> {
    let soft = soft_nofile()?;
    Some((reserve_start(soft)?, soft))
}

/// This process's soft `RLIMIT_NOFILE`; `None` when it is unlimited (or
/// cannot be read).
pub fn soft_nofile() -> Option<u64> {
    use nix::sys::resource::{getrlimit, Resource, RLIM_INFINITY};
    let (soft, _) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    (soft != RLIM_INFINITY).then_some(soft)
}

/// The first descriptor of the reserve below a soft limit of `soft`.
fn reserve_start(soft: u64) -> Option<RawFd> {
    RawFd::try_from(soft - (soft / 4).min(RESERVE)).ok()
}

/// Descriptors a worker keeps free below its soft `RLIMIT_NOFILE`, at most
/// a quarter of it.
const RESERVE: u64 = 32;

/// A pipe, both ends close-on-exec: `(read, write)`.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(nix::unistd::pipe2(OFlag::O_CLOEXEC)?)
}

/// Sets or clears `FD_CLOEXEC`.
pub fn set_cloexec(fd: BorrowedFd<'_>, cloexec: bool) -> io::Result<()> {
    let flags = if cloexec {
        FdFlag::FD_CLOEXEC
    } else {
        FdFlag::empty()
    };
    fcntl(fd, FcntlArg::F_SETFD(flags))?;
    Ok(())
}

/// In a forked child about to `exec`: puts each descriptor of `plan` at its
/// target number, without `FD_CLOEXEC` so it survives the `exec`, and
/// closes every other descriptor above 2. Descriptors 0, 1 and 2 that are
/// not in the plan are left as they are.
///
/// A source may sit on another entry's target number (a listener opened
/// as fd 3 that must become fd 4, say), so every source is first moved
/// above the highest target, and only then copied down.
pub fn place_for_exec(plan: Vec<(OwnedFd, RawFd)>) -> io::Result<()> {
    let highest = plan.iter().map(|(_, target)| *target).max().unwrap_or(2);
    let mut moved = Vec::with_capacity(plan.len());
    for (fd, target) in plan {
        let high = fcntl(fd.as_fd(), FcntlArg::F_DUPFD_CLOEXEC(highest + 1))?;
        // SAFETY: F_DUPFD_CLOEXEC just returned a new descriptor that
        // nothing else owns.
        let high = unsafe { OwnedFd::from_raw_fd(high) };
        drop(fd);
        moved.push((high, target));
    }
    for (high, target) in &moved {
        // SAFETY: dup2 only changes the descriptor table. `target` is not
        // owned by any Rust object in this process any more: whatever held
        // it was moved above `highest` and closed. The copy it makes has
        // FD_CLOEXEC clear, which is the point. `high` differs from
        // `target`, so the flag is really cleared.
        if unsafe { libc::dup2(high.as_raw_fd(), *target) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    drop(moved);
    close_from(highest + 1)
}

/// Closes every descriptor numbered `first` or above, so that nothing the
/// process happened to inherit or open leaks into the program it execs.
fn close_from(first: RawFd) -> io::Result<()> {
    // SAFETY: close_range only closes descriptors. The caller is a child
    // about to exec and holds no Rust object owning a descriptor at or
    // above `first` (all were closed or moved below it).
    let rc = unsafe { libc::syscall(libc::SYS_close_range, first as u32, u32::MAX, 0u32) };
    if rc == 0 {
        return Ok(());
    }
    // Kernels before 5.9: list /proc/self/fd first (the directory's own
    // descriptor is closed when the listing is done), then close.
    let open: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd >= first)
        .collect();
    for fd in open {
        // SAFETY: as above; EBADF (the listing's own descriptor, now closed)
        // is harmless and ignored.
        unsafe { libc::close(fd) };
    }
    Ok(())
}

/// Takes ownership of a descriptor this process inherited at a number its
/// environment announced (`FORKPOOL_CHANNEL_FD`, `LISTEN_FDS`), after
/// checking it is open, and marks it close-on-exec so programs the worker
/// runs do not inherit it.
///
/// The caller must make sure that nothing else in the process owns `fd`;
/// [`crate::worker::ExecWorker::from_env`] guarantees it by refusing to run
/// twice.
pub fn take_inherited(fd: RawFd) -> io::Result<OwnedFd> {
    if fd < 3 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("descriptor {fd} is a standard stream, not an inherited socket"),
        ));
    }
    // SAFETY: F_GETFD only reads the descriptor's flags; EBADF tells us the
    // number is not open.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("descriptor {fd} is not open: {e}"),
        ));
    }
    // SAFETY: the descriptor is open, and the caller guarantees that no
    // other object in this process owns it (see above).
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    set_cloexec(owned.as_fd(), true)?;
    Ok(owned)
}

/// Closes every open descriptor of this process except those in `keep`,
/// as listed in `/proc/self/fd`: for a worker forked from a template,
/// which must not hold the template's files or sockets. Objects that
/// wrapped a closed descriptor are dead afterwards: they must not be used
/// or dropped (the caller forgets the ones it owns first).
pub fn close_all_except(keep: &[RawFd]) -> io::Result<()> {
    let mut open = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd")? {
        if let Some(fd) = entry?.file_name().to_str().and_then(|n| n.parse().ok()) {
            open.push(fd);
        }
    }
    // The listing's own descriptor was in the list and is closed now; the
    // close below then fails with EBADF, which is ignored.
    for fd in open.into_iter().filter(|fd| !keep.contains(fd)) {
        // SAFETY: closing a number, not dereferencing anything; the caller
        // guarantees that whatever owned these descriptors is never used
        // again.
        unsafe { libc::close(fd) };
    }
    Ok(())
}

/// Moves `fd` to the number `target` (closing what was there, and the
/// original), without close-on-exec, and returns the descriptor now at
/// `target`.
pub fn move_to(fd: OwnedFd, target: RawFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() == target {
        set_cloexec(fd.as_fd(), false)?;
        return Ok(fd);
    }
    // SAFETY: dup2 on two valid descriptor numbers; what was at `target`
    // is closed atomically, and its owner (if any) was forgotten by the
    // caller.
    if unsafe { libc::dup2(fd.as_raw_fd(), target) } < 0 {
        return Err(io::Error::last_os_error());
    }
    drop(fd);
    // SAFETY: dup2 just made `target` a copy that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(target) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_32_descriptors_or_a_quarter_of_a_small_limit() {
        assert_eq!(reserve_start(1024), Some(992));
        assert_eq!(reserve_start(128), Some(96));
        assert_eq!(reserve_start(100), Some(75));
        assert_eq!(reserve_start(64), Some(48));
        assert_eq!(reserve_start(3), Some(3));
        assert_eq!(reserve_start(1 << 40), None, "past any descriptor number");
    }

    #[test]
    fn is_open_tells_an_open_descriptor_from_a_closed_one() {
        let (r, _w) = pipe().unwrap();
        // High up, where the other tests' descriptors (lowest first) do not
        // land between the close and the look.
        let high = fcntl(r.as_fd(), FcntlArg::F_DUPFD_CLOEXEC(900)).unwrap();
        // SAFETY: F_DUPFD_CLOEXEC just made it, and nothing else owns it.
        let high = unsafe { OwnedFd::from_raw_fd(high) };
        let number = high.as_raw_fd();
        assert!(is_open(number));
        drop(high);
        assert!(!is_open(number));
    }

    #[test]
    fn pipe_ends_are_close_on_exec() {
        let (r, w) = pipe().unwrap();
        for fd in [r.as_fd(), w.as_fd()] {
            let flags = fcntl(fd, FcntlArg::F_GETFD).unwrap();
            assert!(FdFlag::from_bits_truncate(flags).contains(FdFlag::FD_CLOEXEC));
        }
        set_cloexec(r.as_fd(), false).unwrap();
        let flags = fcntl(r.as_fd(), FcntlArg::F_GETFD).unwrap();
        assert!(!FdFlag::from_bits_truncate(flags).contains(FdFlag::FD_CLOEXEC));
    }

    #[test]
    fn taking_a_closed_or_standard_descriptor_fails() {
        assert!(take_inherited(1).is_err());
        // Far above any descriptor limit, so no other test thread can have
        // it open (a number that was just closed could be reused at once).
        let err = take_inherited(999_999).unwrap_err();
        assert!(err.to_string().contains("not open"), "{err}");
    }
}
