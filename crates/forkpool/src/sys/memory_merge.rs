//! The kernel's same-page merging (KSM) for the pool's children
//! (`merge_pages`): `prctl(PR_SET_MEMORY_MERGE)` on the supervisor, which
//! every process it starts inherits, through `fork` and, since Linux 6.7,
//! through `execve`. `ksmd` then finds the children's private pages whose
//! contents are the same (an interpreter's reference counts and caches,
//! written copy-on-write while serving and back to what they were after)
//! and shares one copy of each, read-only until one of them writes it.

use std::io;

/// The oldest kernel whose `execve` keeps the setting (`uname -r`).
pub const OLDEST_KERNEL: (u32, u32) = (6, 7);

/// Where the kernel says whether `ksmd` runs: `1`, it merges; `0`, it
/// does not (pages merged before stay merged); `2`, it unmerged them all.
const RUN_FILE: &str = "/sys/kernel/mm/ksm/run";

/// Whether this kernel can merge the children's pages, and whether it
/// does now. `Err` names what is missing and the fix.
pub fn readiness() -> Result<Merging, String> {
    let release = nix::sys::utsname::uname()
        .map_err(|e| format!("merge_pages: cannot read the kernel's version: {e}"))?;
    let release = release.release().to_string_lossy().into_owned();
    if !kernel_at_least(&release, OLDEST_KERNEL) {
        return Err(format!(
            "merge_pages needs Linux {}.{} or later (this is {release}): older kernels drop \
             the setting when a worker is exec'd; leave merge_pages off",
            OLDEST_KERNEL.0, OLDEST_KERNEL.1
        ));
    }
    match std::fs::read_to_string(RUN_FILE) {
        Ok(run) if run.trim() == "1" => Ok(Merging::Running),
        Ok(_) => Ok(Merging::Stopped),
        Err(e) => Err(format!(
            "merge_pages: this kernel has no same-page merging ({RUN_FILE}: {e}); it needs \
             CONFIG_KSM, or leave merge_pages off"
        )),
    }
}

/// What [`readiness`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Merging {
    /// `ksmd` runs: the children's pages are merged.
    Running,
    /// It does not: nothing is merged until the administrator starts it
    /// (`echo 1 > /sys/kernel/mm/ksm/run`).
    Stopped,
}

/// Whether `release` (`uname -r`: `6.18.44-...`) is `oldest` or later.
fn kernel_at_least(release: &str, oldest: (u32, u32)) -> bool {
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().ok());
    match (numbers.next().flatten(), numbers.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor) >= oldest,
        _ => false,
    }
}

/// Marks this process's memory, and that of every process it starts from
/// now on, mergeable (`on`) or not. Turning it off unmerges this process's
/// own pages; children started before keep what they inherited.
pub fn set(on: bool) -> io::Result<()> {
    // SAFETY: prctl with PR_SET_MEMORY_MERGE takes integer arguments only
    // and touches no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_MEMORY_MERGE, libc::c_ulong::from(on), 0, 0, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether this process's memory is marked mergeable now.
pub fn is_set() -> io::Result<bool> {
    // SAFETY: prctl with PR_GET_MEMORY_MERGE takes no pointer and returns
    // the setting.
    let rc = unsafe { libc::prctl(libc::PR_GET_MEMORY_MERGE, 0, 0, 0, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_releases_compare_by_major_then_minor() {
        assert!(kernel_at_least("6.7.0", (6, 7)));
        assert!(kernel_at_least("6.18.44-fc-v657", (6, 7)));
        assert!(kernel_at_least("7.0", (6, 7)));
        assert!(!kernel_at_least("6.6.58-generic", (6, 7)));
        assert!(!kernel_at_least("5.19.0", (6, 7)));
        assert!(!kernel_at_least("6", (6, 7)), "no minor");
        assert!(!kernel_at_least("", (6, 7)));
        assert!(!kernel_at_least("linux", (6, 7)));
    }
}
