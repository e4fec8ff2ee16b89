//! Being a good backend for a load balancer: the pure decisions.
//!
//! A balancer in front of many machines needs three things from each pool:
//! how much more work it can take (HAProxy's agent check, [`agent`]),
//! whether it is alive and whether it should get traffic at all (`/live`
//! and `/ready`, [`health`]), and a warning before it stops, long enough
//! for the balancer to stop sending ([`drain`]). [`request`] reads the
//! request line of a health probe.
//!
//! Nothing here does I/O or reads a clock: the supervisor fills in a
//! [`Capacity`] from its slot table, asks, and writes the answer. That
//! keeps every rule testable on plain numbers.

pub mod agent;
pub mod drain;
pub mod health;
pub mod request;

/// Where the pool is in its life, as a balancer should see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The supervisor is up but the pool has not become ready yet (its
    /// first children are still starting).
    Starting,
    /// Serving normally.
    Serving,
    /// Still serving, but about to stop or to hand over to a `USR2`
    /// successor: the balancer should send no new work (the drain delay).
    Draining,
    /// Stopping: listeners closed or closing, children finishing.
    Stopping,
}

/// The pool's capacity at one moment: everything the agent reply and the
/// health answers are computed from. Plain numbers the supervisor already
/// keeps, so filling it in is one line per field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Children that are ready and waiting for a connection.
    pub idle: u32,
    /// Children that are ready and serving a connection (or told to
    /// accept one).
    pub busy: u32,
    /// Children forked but not ready yet.
    pub starting: u32,
    /// Connections waiting for a child: in the listeners' backlogs (the
    /// kernel dispatch overflow) while no child is idle. Each takes a
    /// place a new connection would otherwise have.
    pub waiting: u32,
    /// The pool's ceiling (`max_children`); children leaving do not count.
    pub max_children: u32,
    /// True while the supervisor holds new children back (workers failing
    /// at start-up, fork failing, or replacements of workers that died
    /// waiting for `max_spawn_rate`): room below `max_children` is then no
    /// capacity.
    pub spawn_held_back: bool,
    /// Where the pool is in its life.
    pub phase: Phase,
}

impl Capacity {
    /// Children that count against `max_children`.
    pub fn live(&self) -> u32 {
        self.idle
            .saturating_add(self.busy)
            .saturating_add(self.starting)
    }

    /// Children that have finished starting (idle or busy).
    pub fn ready_children(&self) -> u32 {
        self.idle.saturating_add(self.busy)
    }

    /// Room to grow: children the supervisor may still start, zero while
    /// it holds spawns back.
    pub fn room(&self) -> u32 {
        if self.spawn_held_back {
            0
        } else {
            self.max_children.saturating_sub(self.live())
        }
    }

    /// Spare capacity: idle children plus room to grow, less the
    /// connections already waiting for a child, never above
    /// `max_children`.
    pub fn spare(&self) -> u32 {
        self.idle
            .saturating_add(self.room())
            .saturating_sub(self.waiting)
            .min(self.max_children)
    }

    /// True when every child the pool may have is busy or starting: a new
    /// connection waits in the listen backlog.
    pub fn saturated(&self) -> bool {
        self.spare() == 0
    }

    /// True when a new connection will be served soon: a child is ready,
    /// or one is on its way up (or may be started) and spawns are not held
    /// back. Says nothing about the phase.
    pub fn can_take_work(&self) -> bool {
        self.ready_children() > 0
            || (!self.spawn_held_back && (self.starting > 0 || self.room() > 0))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A serving pool with the given idle, busy and ceiling.
    pub(crate) fn serving(idle: u32, busy: u32, max_children: u32) -> Capacity {
        Capacity {
            idle,
            busy,
            starting: 0,
            waiting: 0,
            max_children,
            spawn_held_back: false,
            phase: Phase::Serving,
        }
    }

    #[test]
    fn spare_is_idle_plus_room() {
        let c = serving(2, 3, 10);
        assert_eq!(c.live(), 5);
        assert_eq!(c.room(), 5);
        assert_eq!(c.spare(), 7);
        assert!(!c.saturated());
    }

    #[test]
    fn starting_children_take_room_but_are_not_idle() {
        let c = Capacity {
            starting: 4,
            ..serving(0, 0, 4)
        };
        assert_eq!(c.spare(), 0);
        assert!(c.saturated());
        assert!(c.can_take_work(), "children on their way up will serve");
    }

    #[test]
    fn held_back_spawns_are_no_room() {
        let c = Capacity {
            spawn_held_back: true,
            ..serving(0, 0, 8)
        };
        assert_eq!(c.room(), 0);
        assert!(!c.can_take_work());
        let c = Capacity {
            spawn_held_back: true,
            ..serving(1, 0, 8)
        };
        assert_eq!(c.spare(), 1);
        assert!(c.can_take_work());
    }

    #[test]
    fn scaled_to_zero_can_still_take_work() {
        let c = serving(0, 0, 4);
        assert_eq!(c.ready_children(), 0);
        assert!(c.can_take_work());
        assert_eq!(c.spare(), 4);
    }

    #[test]
    fn over_the_ceiling_counts_as_saturated() {
        // During a reload both generations may be alive for a moment.
        let c = serving(0, 9, 4);
        assert_eq!(c.room(), 0);
        assert!(c.saturated());
        let c = serving(9, 0, 4);
        assert_eq!(c.spare(), 4, "spare never exceeds the ceiling");
    }
}
