//! Kernel dispatch: the kernel itself gives each new connection to the
//! lowest idle child, with no supervisor wake-up.
//!
//! Each slot has its own listening socket in the listener's
//! `SO_REUSEPORT` group ([`group`]); the supervisor's listener is the
//! group's overflow socket. A shared scoreboard ([`board`]) says which
//! slots are idle: children write it with plain atomic stores on mapped
//! memory, no system call. For each new connection an eBPF program
//! ([`program`], assembled by [`asm`]) picks the lowest idle slot,
//! reserves it with a compare-and-swap, and has the kernel queue the
//! connection on that slot's socket; with no idle slot, on the overflow
//! socket, which the supervisor serves as in `handoff`.

pub mod asm;
pub mod board;
pub mod group;
pub mod program;

use std::cell::Cell;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;

use super::Children;
use crate::core::sampled::ReservationLook;
use crate::listener::Listener;
use crate::policy::reservations;
use crate::protocol::ParentMessage;
use board::{Board, SlotWord};
use group::{refused, Group, Unavailable};

/// Kernel dispatch for a pool: the scoreboard, and one group per listener.
pub struct Kernel {
    board_map: OwnedFd,
    board: Board,
    groups: Vec<Group>,
}

impl Kernel {
    /// Sets kernel dispatch up over `listeners` (each bound with
    /// `SO_REUSEPORT`) for `slots` slots, or says why it cannot run.
    pub fn new(
        listeners: &[BorrowedFd<'_>],
        slots: usize,
        backlog: u32,
    ) -> Result<Kernel, Unavailable> {
        if slots == 0 || slots > program::MAX_SLOTS {
            return Err(Unavailable::TooManySlots(slots));
        }
        for &listener in listeners {
            Group::check(listener)?;
        }
        let (board_map, board) = Board::create(slots).map_err(|e| {
            refused(
                "creating the scoreboard map",
                Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
            )
        })?;
        let groups = listeners
            .iter()
            .map(|&l| Group::new(l, board_map.as_fd(), slots, backlog))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Kernel {
            board_map,
            board,
            groups,
        })
    }

    /// Looks at the reservations of the first `span` slots at `now_ns`
    /// (the kernel's clock): counts the young ones and when the oldest of
    /// them stops holding its child, gives back (idle again) those the
    /// rule says to (`policy::reservations`, with `defer_accept` set on
    /// the listeners), and reads the program's count of takeovers.
    pub fn look_at_reservations(
        &self,
        span: usize,
        now_ns: u64,
        defer_accept: Duration,
    ) -> ReservationLook {
        let mut look = ReservationLook {
            taken_over: self.board.taken_over(),
            ..ReservationLook::default()
        };
        for slot in 0..span.min(self.board.slots()) {
            let raw = self.board.raw(slot);
            let SlotWord::Reserved { at_ns } = SlotWord::from_raw(raw) else {
                continue;
            };
            if reservations::young(at_ns, now_ns) {
                look.young += 1;
                let left = reservations::hold_left(at_ns, now_ns);
                look.hold_left = Some(look.hold_left.map_or(left, |l: Duration| l.min(left)));
            } else if reservations::given_back(at_ns, now_ns, defer_accept)
                && self.board.release_stale(slot, raw)
            {
                look.released += 1;
            }
        }
        look
    }

    /// Connections queued on `slot`'s sockets, as the kernel counts them.
    pub fn queued_on(&self, slot: usize) -> u32 {
        self.sockets(slot)
            .map(|(_, fd)| crate::sys::socket::tcp_accept_queue_len(fd).unwrap_or(0))
            .sum()
    }

    /// The scoreboard map's descriptor (for a worker forked by a template,
    /// which is sent it).
    pub fn board_map(&self) -> BorrowedFd<'_> {
        self.board_map.as_fd()
    }

    /// The scoreboard.
    pub fn board(&self) -> &Board {
        &self.board
    }

    /// Makes `slot`'s socket in every group (before a child is forked
    /// into it).
    pub fn seat(&mut self, slot: usize) -> std::io::Result<()> {
        for group in &mut self.groups {
            group.seat(slot)?;
        }
        Ok(())
    }

    /// The child in `slot` must take no new connection (it is told to
    /// quit, or killed): its word is busy and its sockets leave the
    /// socket arrays, so the program passes the slot by even if the child
    /// stores idle before it reads its order. What was queued before
    /// stays for it, or for the supervisor once it is gone. [`Kernel::seat`]
    /// puts them back for the next child.
    pub fn take_off(&mut self, slot: usize) -> std::io::Result<()> {
        self.board.set_busy(slot);
        self.groups.iter_mut().try_for_each(|g| g.take_off(slot))
    }

    /// `TCP_DEFER_ACCEPT` changed on the `listeners` (a reload): each
    /// group's slot sockets follow.
    pub fn follow_defer_accept(&mut self, listeners: &[BorrowedFd<'_>]) -> std::io::Result<()> {
        for (group, &listener) in self.groups.iter_mut().zip(listeners) {
            group.follow_defer_accept(listener)?;
        }
        Ok(())
    }

    /// An upgrade begins: the listeners leave this pool's socket arrays
    /// so the new supervisor's can take them (see
    /// [`Group::release_overflow`]).
    pub fn release_listeners(&self) -> std::io::Result<()> {
        self.groups.iter().try_for_each(Group::release_overflow)
    }

    /// The upgrade failed: the listeners are this pool's overflow again.
    pub fn restore_listeners(&self, listeners: &[BorrowedFd<'_>]) -> std::io::Result<()> {
        self.groups
            .iter()
            .zip(listeners)
            .try_for_each(|(group, &listener)| group.restore_overflow(listener))
    }

    /// `slot`'s sockets, one per listener, where made.
    pub fn sockets(&self, slot: usize) -> impl Iterator<Item = (usize, BorrowedFd<'_>)> {
        self.groups
            .iter()
            .enumerate()
            .filter_map(move |(i, g)| g.existing(slot).map(|fd| (i, fd)))
    }

    /// In a child just forked into `slot`: its own sockets, as its
    /// listeners (in the pool's listener order), and the scoreboard. The
    /// other slots' sockets close when the rest is dropped.
    pub fn into_seat(mut self, slot: usize, pool: &[Listener]) -> std::io::Result<Seat> {
        let mut listeners = Vec::with_capacity(self.groups.len());
        for (group, listener) in self.groups.iter_mut().zip(pool) {
            let fd = group
                .take(slot)
                .ok_or_else(|| std::io::Error::other(format!("slot {slot} has no socket")))?;
            listeners.push(Listener::from_group_socket(fd, listener));
        }
        Ok(Seat {
            own: listeners,
            board: self.board,
            board_map: self.board_map,
        })
    }
}

/// What a child takes from kernel dispatch: its slot's sockets and the
/// scoreboard, mapped, and the map's descriptor (an exec'd worker maps it
/// again after `exec`).
#[derive(Debug)]
pub struct Seat {
    /// The slot's own socket for each pool listener, in the pool's order.
    pub own: Vec<Listener>,
    /// The scoreboard, mapped.
    pub board: Board,
    /// The scoreboard map's descriptor.
    pub board_map: OwnedFd,
}

/// The supervisor's children as dispatch sees them in kernel mode: a child
/// the core counts idle takes an overflow connection only if the kernel
/// has not just given it one, so each pick claims the child's slot on the
/// scoreboard first: idle to busy, or, where no slot is idle, a dead
/// reservation (one the program would take over itself) to busy. A claim
/// not used by the end of the pass is given back.
pub struct Claiming<'a, C> {
    /// The children (the core).
    pub children: &'a mut C,
    /// The scoreboard.
    pub board: &'a Board,
    claimed: Cell<Option<usize>>,
    /// The kernel's clock at the start of the pass, to tell a dead
    /// reservation.
    now_ns: u64,
}

impl<'a, C: Children> Claiming<'a, C> {
    /// The adapter for one dispatch pass.
    pub fn new(children: &'a mut C, board: &'a Board) -> Self {
        Claiming {
            children,
            board,
            claimed: Cell::new(None),
            now_ns: board::kernel_clock_ns(),
        }
    }

    fn claim_lowest(&self, lowest: Option<usize>) -> Option<usize> {
        if let Some(slot) = self.claimed.get() {
            return Some(slot);
        }
        // The core's idle children in slot order, from its lowest, within
        // the dispatch width: an idle one first, then one held by a dead
        // reservation.
        let first = lowest?;
        let end = self
            .board
            .bound()
            .unwrap_or(usize::MAX)
            .min(self.board.slots());
        let slot = (first..end)
            .find(|&s| {
                self.children.is_idle(s) && (!self.children.keeps_board(s) || self.board.claim(s))
            })
            .or_else(|| {
                (first..end).find(|&s| {
                    self.children.is_idle(s) && self.children.keeps_board(s) && self.claim_dead(s)
                })
            })?;
        if self.children.keeps_board(slot) {
            self.claimed.set(Some(slot));
        }
        Some(slot)
    }

    /// Whether `slot`'s word is a reservation the program itself would
    /// take over now.
    fn is_dead(&self, word: SlotWord) -> bool {
        word.dead_at(self.now_ns)
    }

    fn claim_dead(&self, slot: usize) -> bool {
        let raw = self.board.raw(slot);
        self.is_dead(SlotWord::from_raw(raw)) && self.board.claim_reserved(slot, raw)
    }
}

impl<C: Children> Children for Claiming<'_, C> {
    fn lowest_with_room(&self) -> Option<usize> {
        self.claim_lowest(self.children.lowest_with_room())
    }

    fn lowest_idle(&self) -> Option<usize> {
        self.claim_lowest(self.children.lowest_idle())
    }

    fn is_idle(&self, slot: usize) -> bool {
        self.children.is_idle(slot)
            && (!self.children.keeps_board(slot) || {
                let word = self.board.state(slot);
                word == SlotWord::Idle || self.is_dead(word)
            })
    }

    fn keeps_board(&self, slot: usize) -> bool {
        self.children.keeps_board(slot)
    }

    fn pid(&self, slot: usize) -> Option<i32> {
        self.children.pid(slot)
    }

    fn send(
        &self,
        slot: usize,
        msg: ParentMessage,
        fd: Option<BorrowedFd<'_>>,
    ) -> std::io::Result<()> {
        self.children.send(slot, msg, fd)
    }

    fn handed(&mut self, slot: usize, now: Instant) {
        if self.claimed.get() == Some(slot) {
            self.claimed.set(None);
        }
        self.children.handed(slot, now);
    }

    fn ordered(&mut self, slot: usize, listener: usize, now: Instant) {
        self.children.ordered(slot, listener, now);
    }
}

impl<C> Drop for Claiming<'_, C> {
    fn drop(&mut self) {
        if let Some(slot) = self.claimed.take() {
            self.board.set_idle(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{SocketAddr, TcpStream};
    use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
    use std::time::{Duration, Instant};

    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use socket2::{Domain, Socket, Type};

    use super::board::SlotWord;
    use super::group::Unavailable;
    use super::Kernel;

    /// A listener bound with SO_REUSEPORT on a free loopback port.
    fn overflow_listener() -> (OwnedFd, SocketAddr) {
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        socket.set_reuse_address(true).unwrap();
        socket.set_reuse_port(true).unwrap();
        socket
            .bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
            .unwrap();
        socket.listen(64).unwrap();
        socket.set_nonblocking(true).unwrap();
        let addr = socket.local_addr().unwrap().as_socket().unwrap();
        (socket.into(), addr)
    }

    fn under_ci() -> bool {
        std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false"))
    }

    /// The group, or None (with a NOT RUN line) where the kernel refuses
    /// for lack of privilege, outside CI; under CI=true that is a failure.
    fn group(overflow: BorrowedFd<'_>, slots: usize) -> Option<Kernel> {
        match Kernel::new(&[overflow], slots, 64) {
            Ok(group) => Some(group),
            Err(Unavailable::NotPermitted) if !under_ci() => {
                eprintln!("NOT RUN: kernel dispatch needs CAP_BPF (run as root); under CI=true this fails");
                None
            }
            Err(e) => panic!("kernel dispatch is unavailable: {e}"),
        }
    }

    /// Where the next connection is queued: `Some(slot)`, or `None` for
    /// the overflow socket. Waits at most 2 s.
    fn queued_on(group: &Kernel, overflow: BorrowedFd<'_>, slots: usize) -> Option<usize> {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let mut fds: Vec<PollFd> = (0..slots)
                .map(|s| PollFd::new(socket(group, s), PollFlags::POLLIN))
                .collect();
            fds.push(PollFd::new(overflow, PollFlags::POLLIN));
            poll(&mut fds, PollTimeout::from(100u16)).unwrap();
            if let Some(at) = fds.iter().position(|p| p.any().unwrap_or(false)) {
                return (at < slots).then_some(at);
            }
            assert!(
                Instant::now() < deadline,
                "no connection was queued anywhere"
            );
        }
    }

    fn socket(kernel: &Kernel, slot: usize) -> BorrowedFd<'_> {
        kernel.sockets(slot).next().expect("seated").1
    }

    /// Every slot of `kernel` seated, and the ones in `idle` idle.
    fn seat_all(kernel: &mut Kernel, slots: usize, idle: &[usize]) {
        for slot in 0..slots {
            kernel.seat(slot).unwrap();
        }
        for &slot in idle {
            kernel.board().set_idle(slot);
        }
    }

    fn accept_one(fd: BorrowedFd<'_>) -> OwnedFd {
        crate::sys::socket::accept(fd).expect("a queued connection")
    }

    #[test]
    fn sequential_connections_all_go_to_the_lowest_idle_slot() {
        let (overflow, addr) = overflow_listener();
        let Some(mut group) = group(overflow.as_fd(), 4) else {
            return;
        };
        seat_all(&mut group, 4, &(0..4).collect::<Vec<_>>());
        let mut landed = Vec::new();
        for _ in 0..30 {
            let client = TcpStream::connect(addr).unwrap();
            let slot = queued_on(&group, overflow.as_fd(), 4);
            landed.push(slot);
            let at = slot.expect("a slot, not the overflow");
            assert!(matches!(group.board().state(at), SlotWord::Reserved { .. }));
            // The child: accept, busy, serve, idle again.
            let conn = accept_one(socket(&group, at));
            group.board().set_busy(at);
            drop((conn, client));
            group.board().set_idle(at);
        }
        assert_eq!(landed, vec![Some(0); 30]);
    }

    #[test]
    fn a_burst_lands_one_per_idle_slot_and_the_rest_on_the_overflow() {
        let (overflow, addr) = overflow_listener();
        let Some(mut group) = group(overflow.as_fd(), 4) else {
            return;
        };
        for slot in 0..4 {
            group.seat(slot).unwrap();
        }
        // Slot 1 busy: the burst skips it.
        for slot in [0, 2, 3] {
            group.board().set_idle(slot);
        }
        assert!(!group.board().overflow_may_wait(), "nothing sent there yet");
        let clients: Vec<TcpStream> = (0..5).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let mut per_socket = [0usize; 5];
        for _ in 0..5 {
            let at = queued_on(&group, overflow.as_fd(), 4).unwrap_or(4);
            let fd = if at < 4 {
                socket(&group, at)
            } else {
                assert!(group.board().overflow_may_wait(), "the program counted it");
                group.board().count_overflow_taken(1);
                overflow.as_fd()
            };
            drop(accept_one(fd));
            per_socket[at] += 1;
        }
        assert_eq!(per_socket, [1, 0, 1, 1, 2]);
        assert!(!group.board().overflow_may_wait(), "both taken");
        drop(clients);
    }

    #[test]
    fn no_slot_beyond_the_bound_is_picked() {
        let (overflow, addr) = overflow_listener();
        let Some(mut group) = group(overflow.as_fd(), 4) else {
            return;
        };
        for slot in 0..4 {
            group.seat(slot).unwrap();
        }
        // Slots 0 and 3 idle, the width 2 slots: a connection to slot 0,
        // the next to the overflow though slot 3 idles; with no bound,
        // slot 3 takes one.
        group.board().set_idle(0);
        group.board().set_idle(3);
        group.board().set_bound(Some(2));
        let mut landed = Vec::new();
        let mut clients = Vec::new();
        for unbound_at in [None, None, Some(())] {
            if unbound_at.is_some() {
                group.board().set_bound(None);
            }
            clients.push(TcpStream::connect(addr).unwrap());
            let at = queued_on(&group, overflow.as_fd(), 4).unwrap_or(4);
            let fd = if at < 4 {
                socket(&group, at)
            } else {
                overflow.as_fd()
            };
            drop(accept_one(fd));
            landed.push(at);
        }
        assert_eq!(landed, [0, 4, 3]);
        // A bound of every slot is none (word 5 stays 0).
        group.board().set_bound(Some(4));
        assert_eq!(group.board().bound(), None);
        drop(clients);
    }

    /// Where `count` connections land with every slot busy: per slot
    /// socket, then the overflow last.
    fn landing(
        group: &Kernel,
        overflow: BorrowedFd<'_>,
        addr: SocketAddr,
        count: usize,
    ) -> Vec<usize> {
        let slots = group.board().slots();
        let mut per_socket = vec![0; slots + 1];
        for _ in 0..count {
            let client = TcpStream::connect(addr).unwrap();
            let at = queued_on(group, overflow, slots).unwrap_or(slots);
            let fd = if at < slots {
                socket(group, at)
            } else {
                overflow
            };
            drop(accept_one(fd));
            per_socket[at] += 1;
            drop(client);
        }
        per_socket
    }

    /// An upgrade: the old pool lets go of the listener so the new pool
    /// can take it (a socket is in one array at a time); meanwhile the
    /// kernel's hash picks. A failed upgrade takes it back.
    #[test]
    fn the_listener_moves_to_a_new_pool_and_back() {
        let (overflow, addr) = overflow_listener();
        let Some(mut old) = group(overflow.as_fd(), 4) else {
            return;
        };
        seat_all(&mut old, 4, &[]);
        assert_eq!(landing(&old, overflow.as_fd(), addr, 12), [0, 0, 0, 0, 12]);
        assert!(
            Kernel::new(&[overflow.as_fd()], 4, 64).is_err(),
            "the listener is in the old pool's array"
        );
        old.release_listeners().unwrap();
        let hashed = landing(&old, overflow.as_fd(), addr, 12);
        assert_ne!(
            hashed[4], 12,
            "the hash picks among every socket: {hashed:?}"
        );
        old.restore_listeners(&[overflow.as_fd()]).unwrap();
        assert_eq!(landing(&old, overflow.as_fd(), addr, 12), [0, 0, 0, 0, 12]);
        old.release_listeners().unwrap();
        let new = Kernel::new(&[overflow.as_fd()], 4, 64).expect("the new pool takes it");
        drop(new);
    }

    #[test]
    fn a_reservation_released_by_its_deadline_makes_the_slot_first_again() {
        let (overflow, addr) = overflow_listener();
        let Some(mut group) = group(overflow.as_fd(), 2) else {
            return;
        };
        seat_all(&mut group, 2, &(0..2).collect::<Vec<_>>());
        let first = TcpStream::connect(addr).unwrap();
        assert_eq!(queued_on(&group, overflow.as_fd(), 2), Some(0));
        let seen = group.board().raw(0);
        assert!(matches!(
            SlotWord::from_raw(seen),
            SlotWord::Reserved { .. }
        ));
        // Reserved and not yet accepted: the next one goes to slot 1.
        let second = TcpStream::connect(addr).unwrap();
        drop(accept_one(socket(&group, 0)));
        assert_eq!(queued_on(&group, overflow.as_fd(), 2), Some(1));
        drop(accept_one(socket(&group, 1)));
        // The supervisor gives back a reservation it saw unchanged ...
        assert!(group.board().release_stale(0, seen));
        assert_eq!(group.board().state(0), SlotWord::Idle);
        // ... but not one that moved since.
        assert!(!group.board().release_stale(0, seen));
        let third = TcpStream::connect(addr).unwrap();
        assert_eq!(queued_on(&group, overflow.as_fd(), 2), Some(0));
        drop((first, second, third));
    }

    /// A reservation stamped `age` ago (the kernel's clock).
    fn reservation_aged(age: Duration) -> u64 {
        (super::board::kernel_clock_ns() - age.as_nanos() as u64) | super::board::RESERVED_BIT
    }

    /// A connection that never came (its reservation older than the
    /// hold) holds its child from no one: an idle slot still comes
    /// first, and with none idle the next connection takes the dead
    /// reservation's slot over, and it is counted.
    #[test]
    fn a_dead_reservation_is_taken_over_when_no_slot_is_idle() {
        let (overflow, addr) = overflow_listener();
        let Some(mut group) = group(overflow.as_fd(), 3) else {
            return;
        };
        seat_all(&mut group, 3, &[1]);
        let dead = reservation_aged(crate::policy::reservations::RESERVATION_HOLD * 2);
        group.board().store_raw(0, dead);
        // Slot 2 busy, slot 1 idle: the idle one first.
        let first = TcpStream::connect(addr).unwrap();
        assert_eq!(queued_on(&group, overflow.as_fd(), 3), Some(1));
        drop(accept_one(socket(&group, 1)));
        group.board().set_busy(1);
        assert_eq!(group.board().taken_over(), 0);
        // None idle: the dead reservation's slot, reserved anew.
        let second = TcpStream::connect(addr).unwrap();
        assert_eq!(queued_on(&group, overflow.as_fd(), 3), Some(0));
        drop(accept_one(socket(&group, 0)));
        assert_eq!(group.board().taken_over(), 1);
        let SlotWord::Reserved { at_ns } = group.board().state(0) else {
            panic!("slot 0 is reserved anew: {:?}", group.board().state(0))
        };
        assert!(at_ns > dead, "a fresh stamp");
        // Now young: the next connection goes to the overflow.
        let third = TcpStream::connect(addr).unwrap();
        assert_eq!(queued_on(&group, overflow.as_fd(), 3), None);
        assert_eq!(group.board().taken_over(), 1);
        drop((first, second, third));
    }

    /// The supervisor's look: young reservations are counted, ones older
    /// than the give-back age are made idle again, the rest are left.
    #[test]
    fn the_look_at_reservations_counts_young_ones_and_gives_back_old_ones() {
        let (overflow, _addr) = overflow_listener();
        let Some(mut group) = group(overflow.as_fd(), 4) else {
            return;
        };
        seat_all(&mut group, 4, &[3]);
        let board = group.board();
        board.store_raw(0, reservation_aged(Duration::ZERO));
        board.store_raw(1, reservation_aged(Duration::from_millis(500)));
        board.store_raw(2, reservation_aged(Duration::from_secs(5)));
        let now_ns = super::board::kernel_clock_ns();
        let seen = group.look_at_reservations(4, now_ns, Duration::ZERO);
        assert_eq!((seen.young, seen.released), (1, 1));
        assert!(seen
            .hold_left
            .is_some_and(|left| left > Duration::from_millis(20)));
        assert!(matches!(board.state(0), SlotWord::Reserved { .. }));
        assert!(matches!(board.state(1), SlotWord::Reserved { .. }));
        assert_eq!(board.state(2), SlotWord::Idle);
        assert_eq!(board.state(3), SlotWord::Idle);
        // A reservation claimed by the supervisor is busy; a claim of a
        // word that moved fails.
        let raw = board.raw(1);
        assert!(board.claim_reserved(1, raw));
        assert_eq!(board.state(1), SlotWord::Busy);
        assert!(!board.claim_reserved(1, raw));
        assert!(
            !board.claim_reserved(3, super::board::IDLE),
            "idle is no reservation"
        );
    }

    /// A child told to quit may store idle before it reads the order: a
    /// slot taken off gets no new connection whatever its word says, and
    /// is picked again once seated for the next child.
    #[test]
    fn a_slot_taken_off_is_passed_by_until_seated_again() {
        let (overflow, addr) = overflow_listener();
        let Some(mut group) = group(overflow.as_fd(), 2) else {
            return;
        };
        seat_all(&mut group, 2, &[0, 1]);
        group.take_off(0).unwrap();
        assert_eq!(group.board().state(0), SlotWord::Busy);
        // The child finishes and goes idle before it reads its `Q`.
        group.board().set_idle(0);
        let first = TcpStream::connect(addr).unwrap();
        assert_eq!(queued_on(&group, overflow.as_fd(), 2), Some(1));
        drop(accept_one(socket(&group, 1)));
        group.board().set_busy(1);
        // With slot 1 busy too: the overflow, never slot 0.
        group.board().set_idle(0);
        let second = TcpStream::connect(addr).unwrap();
        assert_eq!(queued_on(&group, overflow.as_fd(), 2), None);
        drop(accept_one(overflow.as_fd()));
        // A new child in slot 0.
        group.seat(0).unwrap();
        group.board().set_idle(0);
        let third = TcpStream::connect(addr).unwrap();
        assert_eq!(queued_on(&group, overflow.as_fd(), 2), Some(0));
        drop((first, second, third));
    }

    #[test]
    fn a_claimed_slot_is_not_picked() {
        let (overflow, addr) = overflow_listener();
        let Some(mut group) = group(overflow.as_fd(), 2) else {
            return;
        };
        seat_all(&mut group, 2, &(0..2).collect::<Vec<_>>());
        assert!(group.board().claim(0));
        assert!(!group.board().claim(0), "claimed once");
        let client = TcpStream::connect(addr).unwrap();
        assert_eq!(queued_on(&group, overflow.as_fd(), 2), Some(1));
        drop(client);
    }

    /// The verifier accepts the scan at its largest (it walks every
    /// iteration), and what the kernel then holds per slot.
    #[test]
    fn the_program_loads_for_the_largest_pool_it_scans() {
        let (overflow, addr) = overflow_listener();
        let slots = super::program::MAX_SLOTS;
        let Some(mut group) = group(overflow.as_fd(), slots) else {
            return;
        };
        group.seat(slots - 1).unwrap();
        group.board().set_idle(slots - 1);
        // Every slot below busy or empty: the scan runs to the last one.
        let client = TcpStream::connect(addr).unwrap();
        let deadline = Instant::now() + Duration::from_secs(2);
        let fd = socket(&group, slots - 1);
        loop {
            let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
            poll(&mut fds, PollTimeout::from(100u16)).unwrap();
            if fds[0].any().unwrap_or(false) {
                break;
            }
            assert!(Instant::now() < deadline, "not queued on the last slot");
        }
        drop(client);
    }

    #[test]
    fn a_listener_without_so_reuseport_has_no_group() {
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        socket
            .bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
            .unwrap();
        socket.listen(8).unwrap();
        let fd = OwnedFd::from(socket);
        assert_eq!(
            Kernel::new(&[fd.as_fd()], 2, 8).err(),
            Some(Unavailable::NoGroup)
        );
    }
}
