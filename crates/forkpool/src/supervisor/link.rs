//! The supervisor's side of one child: what it holds for the child beside
//! the scoreboard entry, in the same slot (see `scoreboard.rs`).

use std::io;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use super::output::ChildOutput;
use crate::channel::{Channel, Incoming};
use crate::policy::budget;
use crate::protocol::{ChildMessage, ParentMessage, WorkerOrder, TEMPLATE_VERSION};

/// The supervisor's side of one child.
#[derive(Debug)]
pub(crate) struct ChildLink {
    pub channel: Channel,
    /// The ping we are waiting on: its sequence number and when it was sent.
    pub ping: Option<(u32, Instant)>,
    /// The sequence number of the last ping sent to this child.
    pub pinged_up_to: u32,
    /// The sequence number of the last ping it answered.
    pub answered_up_to: u32,
    /// Its back-channel message budget (`budget.rs`).
    pub messages: budget::Budget,
    /// In `order` dispatch, the listener the child was told to accept from.
    pub ordered_on: Option<usize>,
    /// Why and by when the child is on its way out, once it is.
    pub leaving: Option<Leaving>,
    /// The channel closed; the process should be reaped soon.
    pub channel_closed: bool,
    /// When the child was forked.
    pub spawned_at: Instant,
    /// Whether it has said `Ready`.
    pub readiness: Readiness,
    /// An exec'd worker's stderr, while it is open.
    pub output: Option<ChildOutput>,
    /// The last lines of its stderr once the pipe closed (for the log of
    /// a failed reload).
    pub stderr_tail: Vec<String>,
    /// The protocol version it speaks: 2 for a worker forked from a
    /// template (`--preload`), 1 otherwise.
    pub version: u8,
    /// For a worker ordered from a template: the pid its template said
    /// (`W`). Only a claim: the slot's pid is set, and the process may be
    /// signalled, once the kernel has confirmed it (`verify.rs`).
    pub claimed: Option<i32>,
    /// The child held by a pidfd, taken while its pid was certainly the
    /// supervisor's (just forked, or verified): every signal to the child
    /// alone goes through it (`signal_child`).
    pub pidfd: Option<std::os::fd::OwnedFd>,
}

/// Whether a child has shown it is up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Readiness {
    /// It has not said `Ready` yet.
    Awaited,
    /// It said `Ready` this long after its fork (or fork order).
    Said(Duration),
    /// It never will (`none` dispatch): counted as up from the start.
    Assumed,
}

/// A child on its way out: why, and when it is SIGKILLed if still there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Leaving {
    /// Why it is leaving.
    pub cause: LeaveCause,
    /// When to SIGKILL it if it has not exited (none once it was killed).
    pub deadline: Option<Instant>,
}

/// Why a child is leaving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LeaveCause {
    /// The supervisor told it to quit (or it said it was leaving), for
    /// this reason: its exit is expected.
    Asked(String),
    /// The supervisor SIGKILLed it, for this reason.
    Killed(String),
    /// Its channel closed without a word: when it exits, it died.
    ChannelClosed,
}

impl crate::dispatch::ChildEnd for ChildLink {
    fn send(&self, msg: ParentMessage, fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
        ChildLink::send(self, msg, fd)
    }

    fn ordered_on(&mut self) -> &mut Option<usize> {
        &mut self.ordered_on
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
            channel,
            ping: None,
            pinged_up_to: 0,
            answered_up_to: 0,
            messages: budget::message_budget(),
            ordered_on: None,
            leaving: None,
            channel_closed: false,
            spawned_at: now,
            readiness: if speaks {
                Readiness::Awaited
            } else {
                Readiness::Assumed
            },
            output,
            stderr_tail: Vec::new(),
            version,
            claimed: None,
            pidfd: None,
        }
    }

    /// Whether it has said `Ready`, or never will.
    pub fn is_ready(&self) -> bool {
        self.readiness != Readiness::Awaited
    }

    /// How long it took from its fork (or fork order) to `Ready`.
    pub fn ready_after(&self) -> Option<Duration> {
        match self.readiness {
            Readiness::Said(after) => Some(after),
            _ => None,
        }
    }

    /// Whether the supervisor has told it to go (asked or killed it); a
    /// child whose channel merely closed has not been.
    pub fn told_to_leave(&self) -> bool {
        matches!(
            self.leaving,
            Some(Leaving {
                cause: LeaveCause::Asked(_) | LeaveCause::Killed(_),
                ..
            })
        )
    }

    /// When to SIGKILL it if it is still there.
    pub fn leave_deadline(&self) -> Option<Instant> {
        self.leaving.as_ref().and_then(|l| l.deadline)
    }

    /// Moves its leave deadline earlier, to `at` at the latest (a closed
    /// channel: it is on its way out whatever it was doing).
    pub fn leave_by(&mut self, at: Instant) {
        match &mut self.leaving {
            Some(l) => {
                if l.deadline.is_none_or(|t| t > at) {
                    l.deadline = Some(at);
                }
            }
            None => {
                self.leaving = Some(Leaving {
                    cause: LeaveCause::ChannelClosed,
                    deadline: Some(at),
                })
            }
        }
    }

    /// Sends `msg` (with `fd`, for a connection) in the child's version.
    pub fn send(&self, msg: ParentMessage, fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
        if self.version == TEMPLATE_VERSION {
            self.channel.send_order(WorkerOrder::Parent(msg), fd)
        } else {
            self.channel.send_to_child(msg, fd)
        }
    }

    /// Receives one report, decoded in the child's version, with the
    /// sender's pid where the kernel attaches it (the channels of workers
    /// ordered from a template, see `verify.rs`).
    pub fn receive(&self) -> io::Result<(Incoming<ChildMessage>, Option<i32>)> {
        if self.version == TEMPLATE_VERSION {
            self.channel.recv_from_child_v2_sent_by()
        } else {
            Ok((self.channel.recv_from_child()?, None))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(speaks: bool) -> ChildLink {
        let (ours, _theirs) = Channel::pair().unwrap();
        ChildLink::new(ours, None, Instant::now(), speaks, 1)
    }

    #[test]
    fn a_closed_channel_sets_a_deadline_but_is_not_a_request_to_leave() {
        let mut l = link(true);
        let at = Instant::now();
        l.leave_by(at);
        assert_eq!(l.leave_deadline(), Some(at));
        assert!(!l.told_to_leave());
    }

    #[test]
    fn leave_by_only_moves_a_deadline_earlier() {
        let mut l = link(true);
        let now = Instant::now();
        l.leaving = Some(Leaving {
            cause: LeaveCause::Asked("surplus".into()),
            deadline: Some(now + Duration::from_secs(1)),
        });
        l.leave_by(now + Duration::from_secs(5));
        assert_eq!(l.leave_deadline(), Some(now + Duration::from_secs(1)));
        l.leave_by(now);
        assert_eq!(l.leave_deadline(), Some(now));
        assert!(l.told_to_leave());
    }

    #[test]
    fn children_that_never_report_are_ready_from_the_start() {
        assert!(link(false).is_ready());
        assert!(!link(true).is_ready());
        assert_eq!(link(false).ready_after(), None);
    }
}
