//! What the supervisor knows of one child, and nothing it talks to the
//! child with: the per-slot data the core's transitions read and write.
//! The channel, the stderr pipe and the pidfd are the shell's (see
//! `supervisor/link.rs`), kept beside this in the same slot.

use std::time::{Duration, Instant};

use crate::policy::backoff::Start;
use crate::policy::budget;

/// The supervisor's knowledge of one child (worker) in a slot.
#[derive(Debug, Clone)]
pub(crate) struct Child {
    /// The ping we are waiting on: its sequence number and when it was sent.
    pub ping: Option<(u32, Instant)>,
    /// The sequence number of the last ping sent to this child.
    pub pinged_up_to: u32,
    /// The sequence number of the last ping it answered.
    pub answered_up_to: u32,
    /// Its back-channel message budget (`policy/budget.rs`).
    pub messages: budget::Budget,
    /// In `order` dispatch, the listener the child was told to accept from.
    pub ordered_on: Option<usize>,
    /// Why and by when the child is on its way out, once it is.
    pub leaving: Option<Leaving>,
    /// The channel closed; the process should be reaped soon.
    pub channel_closed: bool,
    /// Its end of the channel is closed, as the kernel says (a child that
    /// sent an empty datagram has not hung up, until it closes).
    pub hung_up: bool,
    /// When the child was forked (or ordered from a template).
    pub spawned_at: Instant,
    /// Whether it has said `Ready`.
    pub readiness: Readiness,
    /// The protocol version it speaks: 2 for a worker forked from a
    /// template (`--preload`), 1 otherwise.
    pub version: u8,
    /// For a worker ordered from a template: the pid its template said
    /// (`W`). Only a claim: the slot's pid is set, and the process may be
    /// signalled, once the kernel has confirmed it (`verify.rs`).
    pub claimed: Option<i32>,
    /// A slow-request capture is gathering its stack: its busy deadline
    /// waits for the capture, which carries the kill.
    pub capturing: bool,
    /// Kernel dispatch: the child said it keeps its record on the
    /// scoreboard (`K`), so the supervisor reads its state there; a child
    /// that said `R` is served as in `handoff`.
    pub keeps_board: bool,
    /// Kernel dispatch: the child's counts on the scoreboard when last
    /// read (connections taken, finished, and taken from the overflow).
    pub board_counts: (u64, u64, u64),
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

impl Child {
    /// A child just forked (or ordered from a template) at `now`, speaking
    /// protocol `version`. `speaks` is false for children that never
    /// report (`none` dispatch): they count as ready from the start.
    pub fn new(now: Instant, speaks: bool, version: u8) -> Child {
        Child {
            ping: None,
            pinged_up_to: 0,
            answered_up_to: 0,
            messages: budget::message_budget(),
            ordered_on: None,
            leaving: None,
            channel_closed: false,
            hung_up: false,
            spawned_at: now,
            readiness: if speaks {
                Readiness::Awaited
            } else {
                Readiness::Assumed
            },
            version,
            claimed: None,
            capturing: false,
            keeps_board: false,
            board_counts: (0, 0, 0),
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

    /// How far it has got in starting, for the spawn back-off.
    pub fn start(&self) -> Start {
        match self.readiness {
            Readiness::Awaited => Start::Awaited,
            Readiness::Said(after) => Start::Ready(self.spawned_at + after),
            Readiness::Assumed => Start::Unannounced(self.spawned_at),
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

    /// Whether it was asked to go (its exit is expected, not a death).
    pub fn asked_to_leave(&self) -> bool {
        matches!(
            self.leaving,
            Some(Leaving {
                cause: LeaveCause::Asked(_),
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
}

/// A slot's link type, as the core sees it: whatever the shell keeps per
/// child, with the core's [`Child`] inside. The simulator's link is the
/// bare `Child`; the supervisor's also holds the channel and the pidfd.
pub(crate) trait HasChild {
    /// The core's part.
    fn child(&self) -> &Child;
    /// The core's part, to change.
    fn child_mut(&mut self) -> &mut Child;
}

impl HasChild for Child {
    fn child(&self) -> &Child {
        self
    }
    fn child_mut(&mut self) -> &mut Child {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_channel_sets_a_deadline_but_is_not_a_request_to_leave() {
        let mut c = Child::new(Instant::now(), true, 1);
        let at = Instant::now();
        c.leave_by(at);
        assert_eq!(c.leave_deadline(), Some(at));
        assert!(!c.told_to_leave());
    }

    #[test]
    fn leave_by_only_moves_a_deadline_earlier() {
        let mut c = Child::new(Instant::now(), true, 1);
        let now = Instant::now();
        c.leaving = Some(Leaving {
            cause: LeaveCause::Asked("surplus".into()),
            deadline: Some(now + Duration::from_secs(1)),
        });
        c.leave_by(now + Duration::from_secs(5));
        assert_eq!(c.leave_deadline(), Some(now + Duration::from_secs(1)));
        c.leave_by(now);
        assert_eq!(c.leave_deadline(), Some(now));
        assert!(c.told_to_leave());
    }

    #[test]
    fn children_that_never_report_are_ready_from_the_start() {
        assert!(Child::new(Instant::now(), false, 1).is_ready());
        assert!(!Child::new(Instant::now(), true, 1).is_ready());
        assert_eq!(Child::new(Instant::now(), false, 1).ready_after(), None);
    }
}
