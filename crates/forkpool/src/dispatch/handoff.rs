//! `handoff`: the supervisor accepts, then passes each connection's
//! descriptor to the lowest-numbered child with room for it (an idle one,
//! or, when children serve many connections, one under its capacity) with
//! `SCM_RIGHTS`.
//!
//! It accepts in a batch (the connections waiting when the turn began, or
//! until `EAGAIN`) while a child has room, counts the connection against the
//! child as it sends (one-connection children are marked busy), and never
//! waits for an answer.
//! A connection whose child cannot take it is parked, and goes to the next
//! child with room once the supervisor has dealt with the unreachable one:
//! an accepted connection is never dropped because a child died.

use std::os::fd::AsFd;

use socket2::SockAddr;
use std::time::Instant;

use nix::errno::Errno;
use tracing::{debug, error, warn};

use super::{Accepted, Children, Dispatcher, TurnEnd, WatchedListener};
use crate::policy::backoff::ACCEPT_PAUSE;
use crate::protocol::ParentMessage;
use crate::sys;

impl Dispatcher {
    /// The listener numbered `index` is readable: accept what waits and
    /// hand each connection on. `accepted` counts each accept, `handed`
    /// hears of each connection sent (slot, pid, descriptor).
    pub fn accept_and_hand_off(
        &mut self,
        index: usize,
        listener: &WatchedListener,
        children: &mut impl Children,
        now: Instant,
        accepted: &mut u64,
        mut handed: impl FnMut(usize, i32, Option<&SockAddr>),
    ) -> TurnEnd {
        // On TCP, take only the connections already waiting when this turn
        // began. Ones that arrive meanwhile fire the listener's event again
        // and are taken next turn, after the children's reports: a child
        // that has just finished is then known to be idle, and gets them.
        let l = &listener.listener;
        let mut budget = if l.is_tcp() { l.queued() } else { u32::MAX };
        while budget > 0 {
            budget -= 1;
            let Some(slot) = children.lowest_with_room() else {
                return TurnEnd::Saturated;
            };
            match sys::socket::accept_with_peer(l.as_fd()) {
                Ok((fd, peer)) => {
                    *accepted += 1;
                    let connection = Accepted {
                        listener: index,
                        fd,
                        peer,
                    };
                    if let Err(end) = self.hand_off(children, slot, connection, now, &mut handed) {
                        return end;
                    }
                }
                Err(Errno::EAGAIN) => return TurnEnd::Done,
                Err(Errno::ECONNABORTED | Errno::EPROTO) => continue,
                Err(e @ (Errno::EMFILE | Errno::ENFILE | Errno::ENOBUFS | Errno::ENOMEM)) => {
                    warn!(
                        listener = index,
                        "accept failed: {e}; the supervisor is out of descriptors or memory \
                         (raise `ulimit -n` / LimitNOFILE); pausing accepts for {ACCEPT_PAUSE:?}"
                    );
                    return TurnEnd::Pause(now + ACCEPT_PAUSE);
                }
                Err(e) => {
                    error!(
                        listener = index,
                        "accept failed: {e}; pausing accepts for {ACCEPT_PAUSE:?}"
                    );
                    return TurnEnd::Pause(now + ACCEPT_PAUSE);
                }
            }
        }
        TurnEnd::Done
    }

    /// Sends `connection` to the child in `slot` and counts it there; a
    /// child that cannot take it ends the pass, with the connection parked.
    pub(super) fn hand_off(
        &mut self,
        children: &mut impl Children,
        slot: usize,
        connection: Accepted,
        now: Instant,
        handed: &mut impl FnMut(usize, i32, Option<&SockAddr>),
    ) -> Result<(), TurnEnd> {
        let listener = connection.listener;
        let msg = ParentMessage::Connection {
            listener: listener as u16,
        };
        let sent = children.send(slot, msg, Some(connection.fd.as_fd()));
        if let Err(e) = sent {
            self.parked.push_back(connection);
            return Err(TurnEnd::Unreachable {
                slot,
                why: format!("cannot hand it a connection: {e}"),
            });
        }
        if let Some(pid) = children.pid(slot) {
            handed(slot, pid, Some(&connection.peer));
        }
        // The child has its own copy now; ours closes on drop.
        children.handed(slot, now);
        self.latency.observe(now.elapsed().as_secs_f64());
        debug!(slot, listener, "connection handed off");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpStream;

    use super::*;
    use crate::channel::{Channel, Incoming};
    use crate::core::Core;
    use crate::listener::{ListenAddr, Listener};
    use crate::protocol::ChildMessage;
    use crate::scoreboard::SlotState;
    use crate::status::KillReason;
    use crate::supervisor::ChildLink;

    /// A loopback listener with one client connected and waiting.
    fn listener_with_a_client() -> (WatchedListener, TcpStream) {
        let addr: ListenAddr = "127.0.0.1:0".parse().unwrap();
        let listener = Listener::bind(&addr, 16).unwrap();
        let client = TcpStream::connect(listener.local_addr().to_string()).unwrap();
        (WatchedListener::new(listener), client)
    }

    /// Puts an idle child on `slot` of `core`; returns the child's end.
    fn idle_child(core: &mut Core<ChildLink>, slot: usize, now: Instant) -> Channel {
        let (ours, theirs) = Channel::pair().unwrap();
        let link = ChildLink::new(ours, None, now, true, 1);
        let pid = 1000 + slot as i32;
        core.adopt(slot, pid, 1, link, now);
        core.report(slot, ChildMessage::Ready { pid: pid as u32 }, now);
        assert_eq!(core.board().get(slot).unwrap().state, SlotState::Idle);
        theirs
    }

    fn core() -> Core<ChildLink> {
        Core::new(crate::config::PoolConfig::default())
    }

    #[test]
    fn a_connection_its_child_cannot_take_is_parked_then_goes_to_the_next_child() {
        let now = Instant::now();
        let mut board = core();
        drop(idle_child(&mut board, 0, now)); // the child's end is gone
        let second = idle_child(&mut board, 1, now);
        let (listener, _client) = listener_with_a_client();
        let mut dispatcher = Dispatcher::default();
        let (mut accepted, mut handed) = (0, Vec::new());

        let end = dispatcher.accept_and_hand_off(
            0,
            &listener,
            &mut board,
            now,
            &mut accepted,
            |slot, pid, _| handed.push((slot, pid)),
        );
        assert!(
            matches!(end, TurnEnd::Unreachable { slot: 0, .. }),
            "{end:?}"
        );
        assert_eq!((accepted, dispatcher.parked()), (1, 1));
        assert!(handed.is_empty());

        // The supervisor kills the unreachable child; the parked
        // connection then goes to the next child with room.
        board.kill(0, KillReason::ChannelFailed, String::new(), now);
        let end = dispatcher.hand_parked(&mut board, now, |slot, pid, _| handed.push((slot, pid)));
        assert_eq!(end, TurnEnd::Done);
        assert_eq!(dispatcher.parked(), 0);
        assert_eq!(handed, vec![(1, 1001)]);
        assert_eq!(board.board().get(1).unwrap().state, SlotState::Busy);
        match second.recv_from_parent().unwrap() {
            Incoming::Message(ParentMessage::Connection { listener: 0 }, Some(_fd)) => {}
            other => panic!("the second child got {other:?}"),
        }
    }

    #[test]
    fn with_no_child_with_room_the_listener_is_saturated_and_nothing_is_accepted() {
        let now = Instant::now();
        let mut board = core();
        let _child = idle_child(&mut board, 0, now);
        board.handed(0, now);
        let (listener, _client) = listener_with_a_client();
        let mut dispatcher = Dispatcher::default();
        let mut accepted = 0;
        let end = dispatcher.accept_and_hand_off(
            0,
            &listener,
            &mut board,
            now,
            &mut accepted,
            |_, _, _| {},
        );
        assert_eq!(end, TurnEnd::Saturated);
        assert_eq!(accepted, 0);
        assert_eq!(
            listener.listener.queued(),
            1,
            "the client waits in the backlog"
        );
    }
}
