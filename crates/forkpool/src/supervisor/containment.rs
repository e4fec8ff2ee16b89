//! Containment: what a worker starts goes when the worker goes.
//!
//! Every child is the leader of a process group of its own (set in the
//! child right after the fork, before it runs the worker or execs). A kill
//! (`SIGKILL` for a hung or misbehaving child, or at a stop deadline) goes
//! to the whole group, and when a child has been reaped whatever is left
//! in its group (a background process, a forked helper that kept the
//! inherited listeners) is killed and logged. So after a stop no process
//! the pool started still runs or holds a listener.
//!
//! The limit: a process that leaves the group on purpose (`setsid`,
//! `setpgid`) escapes it. Under systemd, `KillMode=control-group` (the
//! default) catches those when the service stops.

use nix::sys::signal::Signal;
use tracing::{debug, warn};

use super::Supervisor;
use crate::core::Counted;
use crate::sys::process;

impl Supervisor {
    /// After reaping the child of `slot`: kill what it left in its group.
    pub(super) fn sweep_group(&mut self, slot: usize, pid: i32) {
        if self.sweep(pid, "worker") {
            warn!(
                slot,
                pid,
                "killed processes the worker left behind in its process group \
                 (a worker must not leave processes running when it exits)"
            );
        }
    }

    /// After reaping the template `pid` of `generation`: kill what it
    /// left in its group (helpers it started, which may hold the
    /// listeners, and workers it forked that were never verified).
    pub(super) fn sweep_template_group(&mut self, pid: i32, generation: u32) {
        if self.sweep(pid, "template") {
            warn!(
                pid,
                generation,
                "killed processes the template left behind in its process group \
                 (a template must not leave processes running when it exits)"
            );
        }
    }

    /// SIGKILLs the process group `pgid` of a reaped `who`; whether
    /// anything was left in it (counted in `strays_killed`).
    fn sweep(&mut self, pgid: i32, who: &str) -> bool {
        match process::signal_group(pgid, Signal::SIGKILL) {
            Ok(true) => {
                self.core.count(Counted::StraysKilled);
                true
            }
            Ok(false) => false,
            Err(e) => {
                debug!(pgid, "cannot signal the {who}'s process group: {e}");
                false
            }
        }
    }
}
