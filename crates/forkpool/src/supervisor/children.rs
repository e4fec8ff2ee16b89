//! The verbs that change which children exist: spawn, reap, retire, kill.

use std::io;
use std::os::fd::OwnedFd;
use std::time::Instant;

use nix::sys::signal::Signal;
use tracing::{debug, info, warn};

use super::endpoints::FD_RESERVE;
use super::{ChildLink, ChildOutput, Supervisor};
use crate::channel::Channel;
use crate::core::RESOURCE_BACKOFF;
use crate::core::{Gone, Input};
use crate::status::KillReason;
use crate::sys::fds;
use crate::sys::process::{self, Forked};
use crate::worker::ChildStart;

/// The ends a new child (or template) is given, both sides: the
/// back-channel pair and, when the pool captures output, a stderr pipe.
pub(super) struct ChildEnds {
    /// The supervisor's end of the back-channel.
    pub ours: Channel,
    /// The child's end of the back-channel.
    pub theirs: Channel,
    /// The end of the stderr pipe the supervisor reads.
    pub output_read: Option<OwnedFd>,
    /// The end of the stderr pipe the child writes.
    pub output_write: Option<OwnedFd>,
}

impl ChildEnds {
    /// Opens the back-channel pair and, `with_output`, a stderr pipe; or
    /// says which could not be opened.
    pub fn open(with_output: bool) -> Result<ChildEnds, String> {
        let (ours, theirs, output_read, output_write) = match with_output {
            true => open_piped().map(|(o, t, r, w)| (o, t, Some(r), Some(w)))?,
            false => channel_pair().map(|(o, t)| (o, t, None, None))?,
        };
        Ok(ChildEnds {
            ours,
            theirs,
            output_read,
            output_write,
        })
    }
}

/// A back-channel pair (ours, theirs), or why not.
fn channel_pair() -> Result<(Channel, Channel), String> {
    Channel::pair().map_err(|e| format!("cannot create a back-channel: {e}"))
}

/// A back-channel pair and a stderr pipe (read, write), as a template and
/// the workers it forks always get; or why not.
pub(super) fn open_piped() -> Result<(Channel, Channel, OwnedFd, OwnedFd), String> {
    let (ours, theirs) = channel_pair()?;
    let (read, write) = fds::pipe().map_err(|e| format!("cannot create a stderr pipe: {e}"))?;
    Ok((ours, theirs, read, write))
}

/// A child just forked, in the parent: where, who, and the limits it was
/// drawn before its fork.
struct JustForked {
    slot: usize,
    pid: i32,
    limits: crate::policy::recycle::ChildLimits,
}

impl Supervisor {
    /// Forks one child into the lowest free slot. In the child, returns what
    /// the worker needs; in the parent, `None`.
    pub(super) fn spawn_child(&mut self, now: Instant) -> io::Result<Option<ChildStart>> {
        if self.core.board().occupied() >= self.core.slot_limit() {
            // Children on their way out hold slots until reaped: a
            // replacement waits for them, so however many a fault leaves
            // there, the table stays bounded.
            debug!("every slot is taken, counting children on their way out: not spawning");
            return Ok(None);
        }
        if let Some(why) = short_of_descriptors() {
            self.resource_backoff(now, why);
            return Ok(None);
        }
        if self.core.config().preload {
            self.fork_from_template(now)?;
            return Ok(None);
        }
        let ends = match ChildEnds::open(self.options.capture_output) {
            Ok(ends) => ends,
            // Spawning backs off (see [`Self::resource_backoff`]).
            Err(why) => {
                self.resource_backoff(now, why);
                return Ok(None);
            }
        };
        let slot = self.core.spawn_slot();
        if let Err(e) = self.seat_child(slot) {
            self.resource_backoff(now, format!("cannot make slot {slot}'s socket: {e}"));
            return Ok(None);
        }
        let limits = self.core.draw_limits();
        match self.fork_child()? {
            Ok(Forked::Child) => {
                drop(ends.ours);
                drop(ends.output_read);
                let mut start = self.child_start(slot, ends.theirs, ends.output_write);
                start.max_requests = limits.max_requests;
                start.limits = self.core.self_limits(limits.lifetime);
                Ok(Some(start))
            }
            Ok(Forked::Parent(pid)) => {
                drop(ends.theirs);
                drop(ends.output_write);
                let forked = JustForked { slot, pid, limits };
                self.adopt_forked(forked, ends.ours, ends.output_read, now)?;
                Ok(None)
            }
            Err(e) => {
                let hint = fork_failure_hint(e.raw_os_error());
                self.resource_backoff(now, format!("fork failed: {e}{hint}"));
                Ok(None)
            }
        }
    }

    /// What the child just forked into `slot` needs to become a worker.
    fn child_start(&self, slot: usize, channel: Channel, stderr: Option<OwnedFd>) -> ChildStart {
        ChildStart {
            slot,
            generation: self.core.generation(),
            channel,
            mode: self.core.config().dispatch,
            listener_is_tcp: Vec::new(),
            listeners: Vec::new(),
            board: None,
            board_map: None,
            overflow: Vec::new(),
            max_requests: self.core.config().max_requests_per_child,
            limits: Default::default(),
            stderr,
            backlog: self.core.config().backlog,
        }
    }

    /// The parent's side of a fork: takes the child `pid` into `slot`,
    /// watching its back-channel (`ours`) and its stderr (`output_read`).
    fn adopt_forked(
        &mut self,
        JustForked { slot, pid, limits }: JustForked,
        ours: Channel,
        output_read: Option<OwnedFd>,
        now: Instant,
    ) -> io::Result<()> {
        let _ = process::own_process_group(pid);
        let reports = self.core.config().dispatch.speaks_protocol();
        // A child that speaks no protocol never gets its end of the
        // channel (it is closed at exec), so ours is not watched.
        // Keeping the pair costs a descriptor per child and spares
        // every other path a "no channel" case.
        if reports {
            self.register_channel(slot, &ours)?;
        }
        let output = match output_read.map(ChildOutput::new).transpose() {
            Ok(output) => output,
            Err(e) => {
                warn!(slot, pid, "cannot read the worker's stderr: {e}");
                None
            }
        };
        if let Some(output) = &output {
            if let Err(e) = self.register_output(slot, output) {
                warn!(slot, pid, "cannot watch the worker's stderr: {e}");
            }
        }
        let mut link = ChildLink::new(ours, output, now, reports, crate::protocol::VERSION);
        // Just forked and not reaped: the pid is certainly this child.
        link.pidfd = hold(pid);
        let generation = self.core.generation();
        // The limits it was told its share from before its fork.
        self.core
            .adopt_with_limits(slot, pid, generation, link, limits, now);
        info!(
            slot,
            pid,
            generation = self.core.generation(),
            "child spawned"
        );
        Ok(())
    }

    /// Forks a child of the supervisor (a worker, or a template) and, in
    /// the child, sets up what every child needs: its own process group
    /// (containment, see `containment.rs`: the child and all it starts form
    /// one group), the supervisor's signal handlers undone, the
    /// parent-death signal, and the pool's user. The outer error is a
    /// failure of that set-up in the child; the inner one a failed `fork`.
    pub(super) fn fork_child(&self) -> io::Result<io::Result<Forked>> {
        let parent_pid = std::process::id() as i32;
        // Anything buffered would be written twice, once by each process.
        use std::io::Write;
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        let forked = process::fork();
        if let Ok(Forked::Child) = forked {
            process::own_process_group(0)?;
            process::reset_child_signals()?;
            process::die_with_parent(parent_pid)?;
            if let Some(c) = self.options.credentials {
                if let Err(e) = process::become_user(c.uid, c.gid) {
                    tracing::error!("cannot switch to uid {} gid {}: {e}", c.uid, c.gid);
                    std::process::exit(1);
                }
            }
        }
        Ok(forked)
    }

    /// A spawn failed for lack of resources: back off like a start-up
    /// failure (doubling from `RESOURCE_BACKOFF`), so a process limit
    /// reached does not make the supervisor retry in a tight loop.
    pub(super) fn resource_backoff(&mut self, now: Instant, why: String) {
        let delay = self.core.fork_failed(now, RESOURCE_BACKOFF);
        warn!("{why}; trying again in {delay:?}");
    }

    /// Collects every child that has exited and hands each to the core.
    pub(super) fn reap_children(&mut self, now: Instant) -> io::Result<()> {
        while let Some((pid, status)) = process::reap_one()? {
            self.child_exited(pid, status, now);
        }
        Ok(())
    }

    /// The child in `slot`, `pid`, has been reaped with `status`: what it
    /// said last is logged first (it explains how it ended), then the core
    /// frees the slot and hands back what the shell kept for it.
    pub(super) fn child_exited(&mut self, pid: i32, status: process::ExitStatus, now: Instant) {
        let slot = self.core.slot_of(pid);
        // What it sent before it exited counts first: a worker that said
        // `X` (leaving) and exited at once was retired, not died, even when
        // its exit is seen in the same turn before its channel is read. A
        // worker the kernel has not vouched for is left to the core.
        if let Some(slot) = slot.filter(|&s| !self.unverified(s)) {
            self.read_reports(slot, now);
        }
        if let Some(slot) = slot {
            self.drain_output(slot, pid);
        }
        self.core.on(Input::Reaped { pid, status }, now);
        self.carry_out(now);
    }

    /// The shell's part of a child's end: its template forgets the order of
    /// a worker never verified; a verified one's process group is swept; a
    /// reload its failed start abandoned is logged; its channel and
    /// order are let go.
    pub(super) fn child_gone(&mut self, gone: Gone<ChildLink>) {
        let Gone {
            slot,
            pid,
            verified,
            reload_failed,
            link,
        } = gone;
        if verified {
            self.sweep_group(slot, pid);
        }
        if let Some(failed) = reload_failed {
            self.log_reload_failed(&failed, &link.stderr_tail);
        }
        self.release_order(&link);
        if let Some(output) = &link.output {
            self.forget_output(output);
        }
        self.deregister_channel(&link.channel);
        self.unseat_child(slot, std::time::Instant::now());
    }

    /// Tells a child to finish its connection, if any, and exit.
    pub(crate) fn retire(&mut self, slot: usize, reason: &str, now: Instant) {
        self.core.retire(slot, reason, now);
        self.carry_out(now);
    }

    /// SIGKILLs a child and marks its slot; it is reaped by the loop.
    pub(crate) fn kill(&mut self, slot: usize, why: KillReason, detail: String, now: Instant) {
        self.core.kill(slot, why, detail, now);
        self.carry_out(now);
    }

    /// Carries out [`crate::core::Effect::Kill`]: SIGKILL to the child's
    /// whole group (what the worker started dies with it); a child whose
    /// group is missing gets the signal alone, through its pidfd.
    pub(super) fn kill_verified(&mut self, slot: usize) {
        let Some(entry) = self.core.board().get(slot) else {
            return;
        };
        let pid = entry.pid;
        let link = &entry.link;
        let sent = process::signal_group(pid, Signal::SIGKILL).and_then(|any| match any {
            true => Ok(()),
            false => signal_child(link, pid, Signal::SIGKILL),
        });
        if let Err(e) = sent {
            warn!(slot, pid, "kill failed: {e}");
        }
    }

    pub(super) fn release_order(&mut self, link: &ChildLink) {
        if let Some(i) = link.child.role.ordered_on {
            self.listeners[i].orders_out = self.listeners[i].orders_out.saturating_sub(1);
        }
    }
}

/// A pidfd for `pid`, a child the caller knows is its own and unreaped;
/// `None` where the kernel has none to give (then signals go by the
/// verified pid, which cannot be reused before the supervisor reaps it).
pub(super) fn hold(pid: i32) -> Option<std::os::fd::OwnedFd> {
    match process::pidfd_open(pid) {
        Ok(fd) => Some(fd),
        Err(e) => {
            debug!(pid, "no pidfd for the child: {e}");
            None
        }
    }
}

/// Sends `sig` to the child of `link` alone, `pid` (verified), through
/// its pidfd when it has one.
pub(super) fn signal_child(link: &ChildLink, pid: i32, sig: Signal) -> io::Result<()> {
    match &link.pidfd {
        Some(fd) => process::pidfd_signal(std::os::fd::AsFd::as_fd(fd), sig),
        None => process::send_signal(pid, sig),
    }
}

/// Whether a failed send means the child closed its end of the channel.
pub(super) fn is_peer_gone(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EPIPE) | Some(libc::ECONNRESET) | Some(libc::ECONNREFUSED)
    )
}

/// Descriptors kept below the endpoints' reserve ([`FD_RESERVE`]) for
/// status and metrics clients, which are never served from the reserve.
const STATUS_ROOM: u64 = 8;

/// Why no child may start for want of descriptors: the supervisor's table
/// has filled up to the last [`FD_RESERVE`] + [`STATUS_ROOM`] below its
/// soft `RLIMIT_NOFILE` (descriptors are taken lowest first, so the first
/// of them is open). Those are kept for connections and `forkpool status`:
/// a pool whose children took them could accept nothing, nor say why.
/// `None` while there is room.
fn short_of_descriptors() -> Option<String> {
    let soft = fds::soft_nofile()?;
    let kept = FD_RESERVE + STATUS_ROOM;
    let first = std::os::fd::RawFd::try_from(soft.checked_sub(kept)?).ok()?;
    fds::is_open(first).then(|| {
        format!(
            "not starting a child: the supervisor's descriptors have reached the last {kept} \
             below RLIMIT_NOFILE ({soft}), kept for connections and status; raise `ulimit -n` \
             (LimitNOFILE) or lower max_children"
        )
    })
}

/// What to add to a failed `fork`'s message so the operator knows the fix,
/// from its `errno`.
fn fork_failure_hint(errno: Option<i32>) -> &'static str {
    match errno {
        Some(libc::EAGAIN) => {
            "; the process limit is reached: raise `ulimit -u` (or TasksMax) \
             or lower max_children"
        }
        Some(libc::ENOMEM) => "; out of memory: lower max_children",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::fork_failure_hint;

    #[test]
    fn a_fork_failure_names_the_limit_to_raise() {
        assert!(fork_failure_hint(Some(libc::EAGAIN)).contains("ulimit -u"));
        assert!(fork_failure_hint(Some(libc::ENOMEM)).contains("out of memory"));
        assert_eq!(fork_failure_hint(Some(libc::EPERM)), "");
        assert_eq!(fork_failure_hint(None), "");
    }
}
