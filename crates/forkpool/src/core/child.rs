//! One child of the supervisor as the core knows it, worker or template:
//! its life (a state that carries its data), its pings and its channel,
//! which every child has, and its role, what only a worker or only a
//! template has. Nothing here talks to the child: the channel, the stderr
//! pipe and the pidfd are the shell's (`supervisor/link.rs` for a worker,
//! `supervisor/template.rs` for a template), kept beside this.
//!
//! A child's life moves only through [`Child::live`], one transition
//! function for a child's reports and the supervisor's acts alike; a move
//! it refuses is an [`IllegalLife`] the caller must handle.

use std::fmt;
use std::time::{Duration, Instant};

use crate::policy::backoff::Start;
use crate::policy::budget;
use crate::policy::recycle::ChildLimits;

/// One child: what every child has, and `role`, what its kind adds. A
/// worker is a `Child` ([`WorkerRole`]); a template is a
/// `Child<TemplateRole>` (`core/template.rs`).
#[derive(Debug, Clone)]
pub(crate) struct Child<R = WorkerRole> {
    /// When it was forked (a worker ordered from a template: when the
    /// order went out).
    pub born: Instant,
    /// Where it is in its life.
    pub life: Life,
    /// The ping we are waiting on: its sequence number and when it was sent.
    pub ping: Option<(u32, Instant)>,
    /// Its channel read as closed: the process should be reaped soon.
    pub channel_closed: bool,
    /// What only its kind has.
    pub role: R,
}

/// What only a worker has.
#[derive(Debug, Clone)]
pub(crate) struct WorkerRole {
    /// The sequence number of the last ping sent to this child.
    pub pinged_up_to: u32,
    /// The sequence number of the last ping it answered.
    pub answered_up_to: u32,
    /// Its back-channel message budget (`policy/budget.rs`).
    pub messages: budget::Budget,
    /// In `order` dispatch, the listener the child was told to accept from.
    pub ordered_on: Option<usize>,
    /// In `order` dispatch: its `B` answered an order, so an `M` may still
    /// come for it while busy. A child that accepted on its own (a
    /// runtime that accepts greedily) sent that `B` across the order and
    /// reads the `A` only while busy; the protocol says to ignore it, and
    /// one that answers `M` instead is not killed for it.
    pub late_missed: bool,
    /// Its end of the channel is closed, as the kernel says (a child that
    /// sent an empty datagram has not hung up, until it closes).
    pub hung_up: bool,
    /// The protocol version it speaks: 2 for a worker forked from a
    /// template (`--preload`), 1 otherwise.
    pub version: u8,
    /// For a worker ordered from a template: the pid its template said
    /// (`W`). Only a claim: the slot's pid is set, and the process may be
    /// signalled, once the kernel has confirmed it (`vouch.rs`).
    pub claimed: Option<i32>,
    /// A slow-request capture is gathering its stack: its busy deadline
    /// waits for the capture, which carries the kill.
    pub capturing: bool,
    /// The connection last captured as slow (its busy-since instant), so
    /// that each connection is captured once (`core/slow.rs`).
    pub captured: Option<Instant>,
    /// Kernel dispatch: how connections reach the child, as its first
    /// message chose: [`Path::Board`] (`K`: it keeps its record on the
    /// scoreboard, where the supervisor reads its state),
    /// [`Path::Messages`] (`G`: its own socket, its state in messages) or
    /// [`Path::Handoff`] (`R`: served as in `handoff`). `None` before it
    /// said one, and in other modes.
    pub path: Option<Path>,
    /// Kernel dispatch: the child's counts on the scoreboard when last
    /// read (connections taken, finished, and taken from the overflow).
    pub board_counts: (u64, u64, u64),
    /// Its own recycling limits (`policy::recycle`), drawn before its
    /// fork or, ordered from a template, when it is adopted.
    pub limits: Option<ChildLimits>,
}

/// `kernel` dispatch: how connections reach a child, as its first message
/// chose, so that a fallback is never invisible (status shows it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// It said `K`: it keeps its record on the scoreboard, and the kernel
    /// queues connections on its own socket.
    Board,
    /// It said `R`: the supervisor takes every connection off the
    /// overflow and hands it over with `C`, as in `handoff`.
    Handoff,
    /// It said `G`: the kernel queues connections on its own socket, as
    /// for `Board`, but it says busy and idle in messages and the
    /// supervisor moves its record (a runtime without shared memory).
    Messages,
}

impl Path {
    /// The name `forkpool status` shows.
    pub fn name(self) -> &'static str {
        match self {
            Path::Board => "board",
            Path::Handoff => "handoff",
            Path::Messages => "messages",
        }
    }
}

/// Where a child is in its life; each state carries what it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Life {
    /// Started; it has not said it is ready.
    Starting,
    /// Up: it said so `after` its start, or (`None`) it never reports
    /// (`none` dispatch) and counts as up from the start.
    Up {
        /// How long it took from its start to its word.
        after: Option<Duration>,
    },
    /// On its way out.
    Leaving {
        /// Why.
        cause: LeaveCause,
        /// When it is SIGKILLed if still there (none once killed).
        by: Option<Instant>,
        /// How far it had got in starting.
        readiness: Readiness,
    },
}

/// How far a child got in starting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Readiness {
    /// It has not said it is ready yet.
    Awaited,
    /// It said it is ready this long after its start.
    Said(Duration),
    /// It never will (`none` dispatch): counted as up from the start.
    Assumed,
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

/// What moves a child's life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LifeEvent {
    /// It said it is ready, `after` its start.
    Ready {
        /// How long after its start.
        after: Duration,
    },
    /// The supervisor told it to go, or it said it is going, for `why`:
    /// it must be gone `by` then.
    Asked {
        /// Why it goes.
        why: String,
        /// When it is SIGKILLed if still there.
        by: Instant,
    },
    /// The supervisor SIGKILLed it, for `why`.
    Killed {
        /// Why it was killed.
        why: String,
    },
    /// Its channel closed: it must be gone `by` then (a deadline already
    /// set only moves earlier).
    Closed {
        /// When it is SIGKILLed if still there.
        by: Instant,
    },
    /// The pool stops: a child leaving must be gone `by` the stop's
    /// deadline, sooner or later than its own.
    StopBy {
        /// The stop's deadline.
        by: Instant,
    },
}

impl LifeEvent {
    fn name(&self) -> &'static str {
        match self {
            LifeEvent::Ready { .. } => "ready",
            LifeEvent::Asked { .. } => "told to go",
            LifeEvent::Killed { .. } => "killed",
            LifeEvent::Closed { .. } => "channel closed",
            LifeEvent::StopBy { .. } => "stop deadline",
        }
    }
}

/// A move of a child's life that [`Child::live`] refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IllegalLife {
    /// The state it was in, by name.
    pub from: &'static str,
    /// The event refused, by name.
    pub event: &'static str,
}

impl fmt::Display for IllegalLife {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.from, self.event) {
            ("up", "ready") => f.write_str("said Ready twice"),
            (from, event) => write!(f, "'{event}' is not allowed while {from}"),
        }
    }
}

/// A move of a child's life that the table allows from every state the
/// caller can be in: a refusal means the core's record is wrong, a bug in
/// forkpool, never something a child did. It is logged loudly rather than
/// dropped (like the scoreboard's `own_move`).
pub(crate) fn own_life<E: fmt::Display>(result: Result<(), E>) {
    if let Err(e) = result {
        // The simulator, the unit tests and every debug build (the
        // integration tests' supervisor) run the core: a refused move of
        // its own is a failed run there, not a log line.
        #[cfg(any(test, debug_assertions))]
        panic!("internal error: the supervisor's own move of a child's life was refused: {e}");
        #[cfg(not(any(test, debug_assertions)))]
        tracing::error!(
            "internal error, please report it: the supervisor's own move of a child's life \
             was refused: {e}"
        );
    }
}

impl Life {
    /// The state's name, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Life::Starting => "starting",
            Life::Up { .. } => "up",
            Life::Leaving {
                cause: LeaveCause::Killed(_),
                ..
            } => "killed",
            Life::Leaving { .. } => "leaving",
        }
    }

    /// How far it got in starting.
    pub fn readiness(&self) -> Readiness {
        match self {
            Life::Starting => Readiness::Awaited,
            Life::Up { after: Some(after) } => Readiness::Said(*after),
            Life::Up { after: None } => Readiness::Assumed,
            Life::Leaving { readiness, .. } => *readiness,
        }
    }

    /// The whole table: the life `event` moves `self` to, or why not.
    /// - `Ready` starts a child that had not started, leaving or not (a
    ///   word that crossed a quit still tells the back-off it started);
    ///   twice is a lie.
    /// - `Asked` makes a running child leave; one already told to go (or
    ///   killed) cannot be told again. A child whose channel closed first
    ///   is now asked, and keeps the sooner deadline.
    /// - `Killed` ends every state but killed.
    /// - `Closed` makes a running child leave as a death; a leaving one
    ///   keeps its cause and the sooner deadline; a killed one waits.
    /// - `StopBy` sets a leaving child's deadline to the stop's; a killed
    ///   one waits.
    pub fn after(&self, event: &LifeEvent) -> Result<Life, IllegalLife> {
        let refused = || IllegalLife {
            from: self.name(),
            event: event.name(),
        };
        let readiness = self.readiness();
        let killed = matches!(
            self,
            Life::Leaving {
                cause: LeaveCause::Killed(_),
                ..
            }
        );
        let sooner = |by: Instant| match self {
            Life::Leaving { by: Some(old), .. } => Some((*old).min(by)),
            _ => Some(by),
        };
        match (event, self) {
            (LifeEvent::Ready { after }, _) if readiness == Readiness::Awaited => match self {
                Life::Leaving { cause, by, .. } => Ok(Life::Leaving {
                    cause: cause.clone(),
                    by: *by,
                    readiness: Readiness::Said(*after),
                }),
                _ => Ok(Life::Up {
                    after: Some(*after),
                }),
            },
            (LifeEvent::Ready { .. }, _) => Err(refused()),
            (LifeEvent::Asked { why, by }, Life::Starting | Life::Up { .. })
            | (
                LifeEvent::Asked { why, by },
                Life::Leaving {
                    cause: LeaveCause::ChannelClosed,
                    ..
                },
            ) => Ok(Life::Leaving {
                cause: LeaveCause::Asked(why.clone()),
                by: sooner(*by),
                readiness,
            }),
            (LifeEvent::Asked { .. }, _) => Err(refused()),
            (LifeEvent::Killed { .. }, _) if killed => Err(refused()),
            (LifeEvent::Killed { why }, _) => Ok(Life::Leaving {
                cause: LeaveCause::Killed(why.clone()),
                by: None,
                readiness,
            }),
            (LifeEvent::Closed { .. } | LifeEvent::StopBy { .. }, _) if killed => Ok(self.clone()),
            (LifeEvent::Closed { by }, Life::Starting | Life::Up { .. }) => Ok(Life::Leaving {
                cause: LeaveCause::ChannelClosed,
                by: Some(*by),
                readiness,
            }),
            (LifeEvent::Closed { by }, Life::Leaving { cause, .. }) => Ok(Life::Leaving {
                cause: cause.clone(),
                by: sooner(*by),
                readiness,
            }),
            (LifeEvent::StopBy { by }, Life::Leaving { cause, .. }) => Ok(Life::Leaving {
                cause: cause.clone(),
                by: Some(*by),
                readiness,
            }),
            (LifeEvent::StopBy { .. }, _) => Err(refused()),
        }
    }
}

impl<R> Child<R> {
    /// A child of `role` started at `now`; `reports` is false for children
    /// that never report (`none` dispatch): they are up from the start.
    pub fn with_role(now: Instant, reports: bool, role: R) -> Child<R> {
        Child {
            born: now,
            life: if reports {
                Life::Starting
            } else {
                Life::Up { after: None }
            },
            ping: None,
            channel_closed: false,
            role,
        }
    }

    /// Moves its life by `event` (the one transition function); on a
    /// refusal its life is unchanged and the caller decides.
    pub fn live(&mut self, event: LifeEvent) -> Result<(), IllegalLife> {
        let next = self.life.after(&event)?;
        if matches!(next, Life::Leaving { .. }) {
            // Nothing is asked of a child on its way out.
            self.ping = None;
        }
        self.life = next;
        Ok(())
    }

    /// How far it got in starting.
    pub fn readiness(&self) -> Readiness {
        self.life.readiness()
    }

    /// Whether it has said it is ready, or never will.
    pub fn is_ready(&self) -> bool {
        self.readiness() != Readiness::Awaited
    }

    /// How long it took from its start to saying it is ready.
    pub fn ready_after(&self) -> Option<Duration> {
        match self.readiness() {
            Readiness::Said(after) => Some(after),
            _ => None,
        }
    }

    /// How far it has got in starting, for the spawn back-off.
    pub fn start(&self) -> Start {
        match self.readiness() {
            Readiness::Awaited => Start::Awaited,
            Readiness::Said(after) => Start::Ready(self.born + after),
            Readiness::Assumed => Start::Unannounced(self.born),
        }
    }

    /// Why it is leaving, once it is.
    pub fn leave_cause(&self) -> Option<&LeaveCause> {
        match &self.life {
            Life::Leaving { cause, .. } => Some(cause),
            _ => None,
        }
    }

    /// Whether the supervisor has told it to go (asked or killed it); a
    /// child whose channel merely closed has not been.
    pub fn told_to_leave(&self) -> bool {
        matches!(
            self.leave_cause(),
            Some(LeaveCause::Asked(_) | LeaveCause::Killed(_))
        )
    }

    /// Whether it was asked to go (its exit is expected, not a death).
    pub fn asked_to_leave(&self) -> bool {
        matches!(self.leave_cause(), Some(LeaveCause::Asked(_)))
    }

    /// Whether it has been SIGKILLed.
    pub fn killed(&self) -> bool {
        matches!(self.leave_cause(), Some(LeaveCause::Killed(_)))
    }

    /// When to SIGKILL it if it is still there.
    pub fn leave_deadline(&self) -> Option<Instant> {
        match self.life {
            Life::Leaving { by, .. } => by,
            _ => None,
        }
    }
}

impl Child {
    /// A worker just forked (or ordered from a template) at `now`,
    /// speaking protocol `version`. `speaks` is false for workers that
    /// never report (`none` dispatch): they count as up from the start.
    pub fn new(now: Instant, speaks: bool, version: u8) -> Child {
        Child::with_role(
            now,
            speaks,
            WorkerRole {
                pinged_up_to: 0,
                answered_up_to: 0,
                messages: budget::message_budget(),
                ordered_on: None,
                late_missed: false,
                hung_up: false,
                version,
                claimed: None,
                capturing: false,
                captured: None,
                path: None,
                board_counts: (0, 0, 0),
                limits: None,
            },
        )
    }
}

/// A slot's link type, as the core sees it: whatever the shell keeps per
/// worker, with the core's [`Child`] inside. The simulator's link is the
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

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// A worker started at `now` and told to go by `by`.
    fn asked_to_go(now: Instant, by: Instant) -> Child {
        let mut c = Child::new(now, true, 1);
        let why = "surplus".into();
        c.live(LifeEvent::Asked { why, by }).unwrap();
        c
    }

    /// Every life a child can be in, with two instants to order deadlines.
    fn lives(t: Instant) -> Vec<Life> {
        let mut all = vec![
            Life::Starting,
            Life::Up {
                after: Some(secs(1)),
            },
            Life::Up { after: None },
        ];
        for readiness in [
            Readiness::Awaited,
            Readiness::Said(secs(1)),
            Readiness::Assumed,
        ] {
            for cause in [
                LeaveCause::Asked("surplus".into()),
                LeaveCause::Killed("hung".into()),
                LeaveCause::ChannelClosed,
            ] {
                for by in [None, Some(t), Some(t + secs(10))] {
                    all.push(Life::Leaving {
                        cause: cause.clone(),
                        by,
                        readiness,
                    });
                }
            }
        }
        all
    }

    fn events(t: Instant) -> Vec<LifeEvent> {
        vec![
            LifeEvent::Ready { after: secs(2) },
            LifeEvent::Asked {
                why: "reload".into(),
                by: t + secs(5),
            },
            LifeEvent::Killed { why: "ping".into() },
            LifeEvent::Closed { by: t + secs(5) },
            LifeEvent::StopBy { by: t + secs(5) },
        ]
    }

    #[test]
    fn every_move_keeps_the_rules_of_a_life() {
        let t = Instant::now();
        for life in lives(t) {
            for event in events(t) {
                let Ok(next) = life.after(&event) else {
                    continue;
                };
                // Nothing comes back from leaving.
                if matches!(life, Life::Leaving { .. }) {
                    assert!(matches!(next, Life::Leaving { .. }), "{life:?} {event:?}");
                }
                // Readiness only moves from awaited to said.
                let (was, now) = (life.readiness(), next.readiness());
                assert!(
                    was == now || (was == Readiness::Awaited && matches!(now, Readiness::Said(_)))
                );
                // A killed child stays killed, for its reason, with no
                // deadline (only a word that crossed the kill is kept).
                if life.name() == "killed" {
                    assert_eq!(next.name(), "killed");
                    assert_eq!(next.readiness() == life.readiness(), next == life);
                }
                // A deadline moves later only by a stop's.
                if let (Life::Leaving { by: Some(old), .. }, Life::Leaving { by: new, .. }) =
                    (&life, &next)
                {
                    if !matches!(event, LifeEvent::StopBy { .. }) && next.name() != "killed" {
                        assert!(
                            new.is_some_and(|n| n <= *old),
                            "{life:?} {event:?} {next:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn what_the_table_refuses() {
        let t = Instant::now();
        let up = Life::Up {
            after: Some(secs(1)),
        };
        let ready = LifeEvent::Ready { after: secs(1) };
        assert_eq!(
            up.after(&ready).unwrap_err().to_string(),
            "said Ready twice"
        );
        let asked = Life::Starting
            .after(&LifeEvent::Asked {
                why: "surplus".into(),
                by: t,
            })
            .unwrap();
        assert!(asked
            .after(&LifeEvent::Asked {
                why: "again".into(),
                by: t
            })
            .is_err());
        let killed = asked
            .after(&LifeEvent::Killed { why: "hung".into() })
            .unwrap();
        assert!(killed
            .after(&LifeEvent::Killed {
                why: "again".into()
            })
            .is_err());
        assert!(Life::Starting.after(&LifeEvent::StopBy { by: t }).is_err());
    }

    #[test]
    fn a_closed_channel_sets_a_deadline_but_is_not_a_request_to_leave() {
        let mut c = Child::new(Instant::now(), true, 1);
        let at = Instant::now();
        c.live(LifeEvent::Closed { by: at }).unwrap();
        assert_eq!(c.leave_deadline(), Some(at));
        assert!(!c.told_to_leave());
    }

    #[test]
    fn a_closed_channel_only_moves_a_deadline_earlier_and_asking_keeps_the_sooner() {
        let now = Instant::now();
        let mut c = asked_to_go(now, now + secs(1));
        c.live(LifeEvent::Closed { by: now + secs(5) }).unwrap();
        assert_eq!(c.leave_deadline(), Some(now + secs(1)));
        c.live(LifeEvent::Closed { by: now }).unwrap();
        assert_eq!(c.leave_deadline(), Some(now));
        assert!(c.told_to_leave());

        let mut closed_first = Child::new(now, true, 1);
        closed_first.live(LifeEvent::Closed { by: now }).unwrap();
        closed_first
            .live(LifeEvent::Asked {
                why: "shutdown".into(),
                by: now + secs(30),
            })
            .unwrap();
        assert_eq!(closed_first.leave_deadline(), Some(now));
        assert!(closed_first.asked_to_leave());
    }

    #[test]
    fn a_ready_that_crossed_a_quit_still_counts_as_a_start() {
        let now = Instant::now();
        let mut c = asked_to_go(now, now + secs(1));
        c.live(LifeEvent::Ready { after: secs(2) }).unwrap();
        assert_eq!(c.ready_after(), Some(secs(2)));
        assert!(c.asked_to_leave());
    }

    #[test]
    fn leaving_drops_the_ping_owed() {
        let now = Instant::now();
        let mut c = Child::new(now, true, 1);
        c.ping = Some((3, now));
        c.live(LifeEvent::Killed { why: "hung".into() }).unwrap();
        assert_eq!(c.ping, None);
        assert!(c.killed());
    }

    #[test]
    fn children_that_never_report_are_ready_from_the_start() {
        assert!(Child::new(Instant::now(), false, 1).is_ready());
        assert!(!Child::new(Instant::now(), true, 1).is_ready());
        assert_eq!(Child::new(Instant::now(), false, 1).ready_after(), None);
    }
}
