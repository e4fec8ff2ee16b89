//! Kernel dispatch's reservations, as rules with no I/O: how long one
//! holds its child against other connections, when the supervisor gives
//! one back, and how often it must read the scoreboard.
//!
//! The program reserves a child at the SYN, before the kernel knows
//! whether the connection will ever be accepted. Most are, within a round
//! trip; some never are (a load balancer's TCP check that resets, a
//! scanner, a client that gives up, a client silent under
//! `TCP_DEFER_ACCEPT`). The rules below make a reservation cheap to be
//! wrong about:
//! - it holds its child for [`RESERVATION_HOLD`] only: past that the
//!   program takes it over for a connection that finds no idle child, and
//!   the supervisor may claim it for a connection on the overflow;
//! - a young one counts as a child taken, for scaling and the balancer;
//! - one older than [`GIVE_BACK_AFTER`] (plus the defer time) is made idle
//!   again when the supervisor reads the board, so its slot is the lowest
//!   idle one again;
//! - after a takeover a connection may wait on a busy child's socket
//!   behind another one (the taken-over reservation's own connection came
//!   after all): for a while the supervisor reads the board every
//!   [`BEHIND_READ_INTERVAL`] and hands such connections to an idle child.

use std::time::{Duration, Instant};

/// How long a reservation holds its slot against other connections. Far
/// longer than a handshake and an accept take on one machine or a network
/// nearby, so a live reservation is almost never taken over; short enough
/// that a connection that never comes costs the others next to nothing.
pub const RESERVATION_HOLD: Duration = Duration::from_millis(30);

/// A reservation this old when the supervisor reads the board is given
/// back (idle again), beyond `defer_accept` (a client may take that long
/// to send its first byte, when set, before the kernel queues it). Long,
/// because a slot given back while its connection is still coming gets a
/// second one queued behind it.
pub const GIVE_BACK_AFTER: Duration = Duration::from_secs(1);

/// How often the supervisor reads the scoreboard when nothing else wakes
/// it (status, scaling and liveness see the children this fresh).
pub const READ_INTERVAL: Duration = Duration::from_millis(100);

/// How often it reads it while a connection may wait behind another on a
/// busy child's socket: a quarter of the 50 ms such a connection may wait
/// with a child idle.
pub const BEHIND_READ_INTERVAL: Duration = Duration::from_millis(12);

/// Whether a reservation stamped `at_ns` still holds its child at
/// `now_ns` (the kernel's `CLOCK_MONOTONIC`). A stamp after `now_ns`
/// (taken on another CPU a moment later) is young.
pub fn young(at_ns: u64, now_ns: u64) -> bool {
    now_ns.saturating_sub(at_ns) < nanos(RESERVATION_HOLD)
}

/// Whether the supervisor gives back a reservation stamped `at_ns` at
/// `now_ns`, with `defer_accept` set on the listeners.
pub fn given_back(at_ns: u64, now_ns: u64, defer_accept: Duration) -> bool {
    now_ns.saturating_sub(at_ns) >= nanos(GIVE_BACK_AFTER + defer_accept)
}

/// How long until a reservation stamped `at_ns` stops holding its child,
/// at `now_ns`: zero once it has.
pub fn hold_left(at_ns: u64, now_ns: u64) -> Duration {
    Duration::from_nanos(
        at_ns
            .saturating_add(nanos(RESERVATION_HOLD))
            .saturating_sub(now_ns),
    )
}

/// How long connections may wait behind another on a busy child after
/// the program last took a reservation over: its own connection may
/// still come that long after its SYN.
pub fn behind_window(defer_accept: Duration) -> Duration {
    GIVE_BACK_AFTER + defer_accept
}

/// When the board is read next, last read at `read_at`, with the window
/// for connections behind others open until `behind_until`.
pub fn next_read(read_at: Instant, behind_until: Option<Instant>) -> Instant {
    let interval = if behind_until.is_some_and(|until| read_at < until) {
        BEHIND_READ_INTERVAL
    } else {
        READ_INTERVAL
    };
    read_at + interval
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_reservation_holds_for_the_hold_then_dies() {
        let at = 1_000 * MS;
        assert!(young(at, at));
        assert!(young(at, at + 29 * MS));
        assert!(!young(at, at + 30 * MS));
        assert!(young(at + 5, at), "a stamp a moment later is young");
        assert_eq!(hold_left(at, at + 10 * MS), Duration::from_millis(20));
        assert_eq!(hold_left(at, at + 40 * MS), Duration::ZERO);
    }

    #[test]
    fn a_reservation_is_given_back_after_a_second_and_the_defer_time() {
        let at = 1_000 * MS;
        let none = Duration::ZERO;
        assert!(!given_back(at, at + 999 * MS, none));
        assert!(given_back(at, at + 1_000 * MS, none));
        let defer = Duration::from_secs(5);
        assert!(!given_back(at, at + 5_999 * MS, defer));
        assert!(given_back(at, at + 6_000 * MS, defer));
    }

    #[test]
    fn the_board_is_read_often_while_connections_may_wait_behind_others() {
        let t = Instant::now();
        assert_eq!(next_read(t, None), t + READ_INTERVAL);
        let until = t + Duration::from_secs(1);
        assert_eq!(next_read(t, Some(until)), t + BEHIND_READ_INTERVAL);
        assert_eq!(next_read(until, Some(until)), until + READ_INTERVAL);
    }

    proptest! {
        /// Young and given back never both hold, and a reservation is
        /// given back only long after it stopped holding its child.
        #[test]
        fn a_young_reservation_is_never_given_back(
            at in 0u64..u64::MAX / 2,
            age in 0u64..20_000 * MS,
            defer in 0u64..600,
        ) {
            let now = at + age;
            let defer = Duration::from_secs(defer);
            prop_assert!(!(young(at, now) && given_back(at, now, defer)));
            if given_back(at, now, defer) {
                prop_assert_eq!(hold_left(at, now), Duration::ZERO);
            }
            prop_assert_eq!(young(at, now), hold_left(at, now) > Duration::ZERO);
        }
    }
}
