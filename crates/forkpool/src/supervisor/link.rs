//! The supervisor's side of one child: what it holds for the child beside
//! the scoreboard entry, in the same slot (see `scoreboard.rs`).

use std::io;
use std::os::fd::BorrowedFd;
use std::time::Instant;

use super::output::ChildOutput;
use super::resources::ChildFigures;
use crate::channel::{Channel, Incoming};
use crate::core::child::{Child, HasChild};
use crate::protocol::{ChildMessage, ParentMessage, WorkerOrder, TEMPLATE_VERSION};

/// The supervisor's side of one child: the core's [`Child`] and what the
/// shell talks to it with.
#[derive(Debug)]
pub(crate) struct ChildLink {
    /// What the core knows of the child.
    pub child: Child,
    /// The back-channel.
    pub channel: Channel,
    /// An exec'd worker's stderr, while it is open.
    pub output: Option<ChildOutput>,
    /// The last lines of its stderr once the pipe closed (for the log of
    /// a failed reload).
    pub stderr_tail: Vec<String>,
    /// The child held by a pidfd, taken while its pid was certainly the
    /// supervisor's (just forked, or verified): every signal to the child
    /// alone goes through it (`signal_child`).
    pub pidfd: Option<std::os::fd::OwnedFd>,
    /// A worker ordered from a template: the boot clock, in the ticks
    /// `/proc` counts starts in, just before the order was sent. The
    /// worker cannot have started before it.
    pub ordered_at_ticks: Option<u64>,
    /// Its `/proc` figures, the client it serves, its last slow capture
    /// (`resources.rs`).
    pub figures: ChildFigures,
}

impl HasChild for ChildLink {
    fn child(&self) -> &Child {
        &self.child
    }
    fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl crate::dispatch::Sends for ChildLink {
    fn send(&self, msg: ParentMessage, fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
        ChildLink::send(self, msg, fd)
    }
}

impl ChildLink {
    /// The supervisor's side of a child just forked (or ordered from a
    /// template) at `now`, speaking protocol `version`. `speaks` is false
    /// for children that never report (`none` dispatch): they count as
    /// ready from the start.
    pub fn new(
        channel: Channel,
        output: Option<ChildOutput>,
        now: Instant,
        speaks: bool,
        version: u8,
    ) -> ChildLink {
        ChildLink {
            child: Child::new(now, speaks, version),
            channel,
            output,
            stderr_tail: Vec::new(),
            pidfd: None,
            ordered_at_ticks: None,
            figures: ChildFigures::default(),
        }
    }

    /// Sends `msg` (with `fd`, for a connection) in the child's version.
    pub fn send(&self, msg: ParentMessage, fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
        if self.child.role.version == TEMPLATE_VERSION {
            self.channel.send_order(WorkerOrder::Parent(msg), fd)
        } else {
            self.channel.send_to_child(msg, fd)
        }
    }

    /// Receives one report, decoded in the child's version, with the
    /// sender's pid where the kernel attaches it (the channels of workers
    /// ordered from a template, see `verify.rs`).
    pub fn receive(&self) -> io::Result<(Incoming<ChildMessage>, Option<i32>)> {
        if self.child.role.version == TEMPLATE_VERSION {
            self.channel.recv_from_child_v2_sent_by()
        } else {
            Ok((self.channel.recv_from_child()?, None))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::VERSION;

    fn link(version: u8) -> (ChildLink, Channel) {
        let (ours, theirs) = Channel::pair().unwrap();
        let link = ChildLink::new(ours, None, Instant::now(), true, version);
        (link, theirs)
    }

    #[test]
    fn a_worker_of_the_first_version_is_spoken_to_in_it() {
        let (link, child) = link(VERSION);
        link.send(ParentMessage::Ping { seq: 3 }, None).unwrap();
        let got = child.recv_from_parent().unwrap();
        assert!(matches!(
            got,
            Incoming::Message(ParentMessage::Ping { seq: 3 }, None)
        ));
        child.send_to_parent(ChildMessage::Idle).unwrap();
        let got = link.receive().unwrap();
        assert!(matches!(
            got,
            (Incoming::Message(ChildMessage::Idle, _), None)
        ));
    }

    #[test]
    fn a_worker_forked_by_a_template_is_spoken_to_in_version_2_with_its_sender() {
        let (link, child) = link(TEMPLATE_VERSION);
        link.channel.pass_credentials().unwrap();
        link.send(ParentMessage::Ping { seq: 3 }, None).unwrap();
        let got = child.recv_order().unwrap();
        let ping = WorkerOrder::Parent(ParentMessage::Ping { seq: 3 });
        assert!(matches!(got, Incoming::Message(order, _) if order == ping));
        child.send_to_parent_v2(ChildMessage::Idle).unwrap();
        let (got, sender) = link.receive().unwrap();
        assert!(matches!(got, Incoming::Message(ChildMessage::Idle, _)));
        assert_eq!(sender, Some(std::process::id() as i32));
        // A message of the first version is not one of its own.
        child.send_to_parent(ChildMessage::Idle).unwrap();
        assert!(matches!(link.receive().unwrap().0, Incoming::Malformed(_)));
    }
}
