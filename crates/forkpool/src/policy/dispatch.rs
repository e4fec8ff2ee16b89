//! Dispatch choice: which child gets the next connection, and when to look
//! at the backlog again when none can.
//!
//! The rule is always the same: the lowest-numbered slot with room for one
//! more connection. A child that serves one connection at a time has room
//! while idle; a child that serves many has room while under its capacity
//! and while fewer than [`MAX_IN_FLIGHT`] connections are on their way to
//! it. Low slots stay hot in cache and memory; high ones idle and are the
//! first retired. The scoreboard answers the question with bitsets
//! (`Scoreboard::lowest_with_room`) using [`has_room`] and [`held_back`];
//! `lowest_with_room` here states the whole rule plainly, and a property
//! test checks the two always agree.

use std::time::{Duration, Instant};

use crate::slot::{SessionLoad, SlotState};

/// The most connections a many-connection child may have on their way to it
/// (handed, not yet counted in a report). The back-channel holds a few
/// hundred messages before a send would fail; this keeps well below that,
/// and a burst waits in the listen backlog for the child to catch up rather
/// than spilling over to a higher slot.
pub const MAX_IN_FLIGHT: u32 = 64;

/// While no child has room, the supervisor stops watching the listeners and
/// looks at the backlog again this long later: a child that comes free
/// says so at once (and the listener is watched again then), so this only
/// bounds how long a connection can wait when a report is lost behind a
/// dying child, or while the first children start. 50 ms is well under a
/// client's patience and costs 20 wake-ups a second at most while saturated.
pub(crate) const BACKLOG_RECHECK: Duration = Duration::from_millis(50);

/// While every child is busy, the supervisor reads its children's reports
/// in batches: after a turn that only read reports and left no child with
/// room, it waits this long before it looks for events again. Busy
/// children take the connections waiting in the backlog themselves and say
/// so (`N`), which changes nothing the supervisor must act on at once; read
/// one at a time, each report would wake it, twice the context switches
/// per request under load for no gain. An `Idle` waits at most this long
/// more, and only while all the others are busy; the control socket and
/// a new connection likewise. A signal ends the pause at once (it is a
/// wait on the signal pipe, not a sleep).
pub(crate) const REPORT_BATCH: Duration = Duration::from_millis(1);

/// How long to wait before the next poll after a turn of `events` events:
/// a [`REPORT_BATCH`] when they were all children's reports
/// (`only_reports`), no child has room after them and the pool is not
/// stopping; otherwise none.
pub(crate) fn report_batch_pause(
    has_room: bool,
    events: usize,
    only_reports: bool,
    stopping: bool,
) -> Option<Duration> {
    (!has_room && events > 0 && only_reports && !stopping).then_some(REPORT_BATCH)
}

/// Whether the child in a slot, in `state` with `load` (for many-connection
/// children), has room for one more connection.
pub(crate) fn has_room(state: SlotState, load: Option<&SessionLoad>) -> bool {
    match load {
        None => state == SlotState::Idle,
        Some(load) => matches!(state, SlotState::Idle | SlotState::Partial) && load.free() > 0,
    }
}

/// Whether a child with room is held back anyway: it already has
/// [`MAX_IN_FLIGHT`] connections on their way to it. The next connection
/// then waits in the backlog for it rather than going to a higher slot.
pub(crate) fn held_back(load: Option<&SessionLoad>) -> bool {
    load.is_some_and(|load| load.in_flight() >= MAX_IN_FLIGHT)
}

/// The whole rule in one place, given each occupied slot's number, state
/// and load: the lowest slot with room, unless it is held back. The
/// scoreboard answers the same question from bitsets; this plain version is
/// what a property test holds it to.
#[cfg(test)]
pub(crate) fn lowest_with_room<'a>(
    slots: impl IntoIterator<Item = (usize, SlotState, Option<&'a SessionLoad>)>,
) -> Option<usize> {
    let (slot, _, load) = slots
        .into_iter()
        .filter(|(_, state, load)| has_room(*state, *load))
        .min_by_key(|(slot, _, _)| *slot)?;
    (!held_back(load)).then_some(slot)
}

/// When to look at the backlog again without an event: soon, while no
/// child has room but some are live (saturated or starting) and they speak
/// the protocol (children that never report are never idle, so there is
/// nothing to look for).
pub(crate) fn backlog_recheck_due(
    has_room: bool,
    live: u32,
    speaks_protocol: bool,
    now: Instant,
) -> Option<Instant> {
    (!has_room && live > 0 && speaks_protocol).then(|| now + BACKLOG_RECHECK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_connection_children_have_room_only_while_idle() {
        assert!(has_room(SlotState::Idle, None));
        for state in [
            SlotState::Starting,
            SlotState::Ordered,
            SlotState::Busy,
            SlotState::Retiring,
            SlotState::Killed,
        ] {
            assert!(!has_room(state, None), "{state:?}");
        }
    }

    #[test]
    fn the_lowest_slot_with_room_wins() {
        let slots = [
            (3, SlotState::Idle, None),
            (0, SlotState::Busy, None),
            (1, SlotState::Idle, None),
        ];
        assert_eq!(lowest_with_room(slots), Some(1));
        assert_eq!(lowest_with_room([(0, SlotState::Busy, None)]), None);
    }

    #[test]
    fn a_many_connection_child_far_behind_holds_the_next_connection_back() {
        let fresh = SessionLoad::new(1000);
        let mut behind = SessionLoad::new(1000);
        behind.handed = MAX_IN_FLIGHT - 1;
        let catching_up = [
            (0, SlotState::Partial, Some(&behind)),
            (1, SlotState::Idle, Some(&fresh)),
        ];
        assert_eq!(lowest_with_room(catching_up), Some(0));
        let mut far_behind = behind;
        far_behind.handed = MAX_IN_FLIGHT;
        let held = [
            (0, SlotState::Partial, Some(&far_behind)),
            (1, SlotState::Idle, Some(&fresh)),
        ];
        assert_eq!(lowest_with_room(held), None);
    }

    #[test]
    fn a_full_many_connection_child_has_no_room() {
        let mut load = SessionLoad::new(2);
        assert!(has_room(SlotState::Idle, Some(&load)));
        load.open = 2;
        assert!(!has_room(SlotState::Busy, Some(&load)));
        assert!(!has_room(SlotState::Partial, Some(&load)));
    }

    #[test]
    fn reports_are_read_in_batches_only_while_saturated_and_serving() {
        assert_eq!(
            report_batch_pause(false, 3, true, false),
            Some(REPORT_BATCH)
        );
        // A child has room: its next report may be the one a waiting
        // connection needs.
        assert_eq!(report_batch_pause(true, 3, true, false), None);
        // Something else woke the loop (a listener, a signal, a client).
        assert_eq!(report_batch_pause(false, 3, false, false), None);
        // A timer woke it: nothing to batch.
        assert_eq!(report_batch_pause(false, 0, true, false), None);
        // Stopping: children's exits are awaited promptly.
        assert_eq!(report_batch_pause(false, 3, true, true), None);
    }

    #[test]
    fn the_backlog_is_rechecked_only_while_children_are_full_or_starting() {
        let now = Instant::now();
        assert_eq!(
            backlog_recheck_due(false, 2, true, now),
            Some(now + BACKLOG_RECHECK)
        );
        assert_eq!(backlog_recheck_due(true, 2, true, now), None);
        assert_eq!(backlog_recheck_due(false, 0, true, now), None);
        assert_eq!(backlog_recheck_due(false, 2, false, now), None);
    }
}
