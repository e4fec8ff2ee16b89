//! The benchmark's system calls that the compiler cannot check: the only
//! module of this crate allowed `unsafe` code.
#![allow(unsafe_code)]

use std::os::unix::process::CommandExt;
use std::process::Command;

/// Clock ticks per second, the unit of CPU times in `/proc/PID/stat`
/// (100 if the system will not say).
pub fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|&t| t > 0).unwrap_or(100)
}

/// Makes the program `command` starts get SIGKILL when its parent dies, so
/// a benchmark that is killed leaves no pool behind.
///
/// The death signal fires when the *thread* that forked exits, so a
/// program started from a short-lived thread dies with that thread.
pub fn die_with_parent(command: &mut Command) {
    // SAFETY: the closure runs between fork and exec and calls only prctl,
    // which is async-signal-safe and touches no memory of ours.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
