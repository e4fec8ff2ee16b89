//! `order` (SpamAssassin spamd's scheme): children inherited the listeners;
//! the supervisor tells the lowest-numbered idle child to accept one
//! connection, and the child answers `Busy` (it got one) or `Missed`.
//!
//! The supervisor sends one order per waiting connection, counting the
//! orders not yet answered so a backlog of n connections wakes n children,
//! not the whole pool. On TCP the kernel tells how many connections wait
//! (`TCP_INFO`); on Unix sockets one order is outstanding at a time.

use std::os::fd::AsFd;
use std::time::Instant;

use super::{Children, Dispatcher, TurnEnd, WatchedListener};
use crate::protocol::ParentMessage;
use crate::sys;

impl Dispatcher {
    /// The listener numbered `index` is readable: order as many idle
    /// children to accept as connections wait without an order.
    pub fn order_accepts(
        &mut self,
        index: usize,
        listener: &mut WatchedListener,
        children: &mut impl Children,
        now: Instant,
    ) -> TurnEnd {
        let waiting = if listener.listener.is_tcp() {
            listener.listener.queued()
        } else {
            u32::from(sys::socket::readable_now(listener.listener.as_fd()))
        };
        let mut wanted = waiting.saturating_sub(listener.orders_out);
        while wanted > 0 {
            let Some(slot) = children.lowest_idle() else {
                return TurnEnd::Saturated;
            };
            let msg = ParentMessage::Accept {
                listener: index as u16,
            };
            if let Err(e) = children.send(slot, msg, None) {
                return TurnEnd::Unreachable {
                    slot,
                    why: format!("cannot send an accept order: {e}"),
                };
            }
            children.ordered(slot, index, now);
            self.latency.observe(now.elapsed().as_secs_f64());
            listener.orders_out += 1;
            wanted -= 1;
        }
        TurnEnd::Done
    }
}

/// A child answered its accept order on `listener` (`Busy` or `Missed`):
/// the listener may hold more connections than orders now outstanding, so
/// it is looked at again in this turn's dispatch pass (after all of the
/// turn's reports, so an `Idle` queued behind this one is seen first).
pub(crate) fn order_answered(listener: usize, listeners: &mut [WatchedListener]) {
    if let Some(l) = listeners.get_mut(listener) {
        l.orders_out = l.orders_out.saturating_sub(1);
        l.recheck = true;
    }
}

/// An accept order on `listener` will never be answered (its child was
/// killed): one fewer is out.
pub(crate) fn order_dropped(listener: usize, listeners: &mut [WatchedListener]) {
    if let Some(l) = listeners.get_mut(listener) {
        l.orders_out = l.orders_out.saturating_sub(1);
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
    use crate::supervisor::ChildLink;

    #[test]
    fn one_order_per_waiting_connection_and_an_answer_frees_the_count() {
        let now = Instant::now();
        let mut core: Core<ChildLink> = Core::new(crate::config::PoolConfig::default());
        let mut children = Vec::new();
        for slot in 0..2 {
            let (ours, theirs) = Channel::pair().unwrap();
            let pid = 1000 + slot as i32;
            core.adopt(slot, pid, 1, ChildLink::new(ours, None, now, true, 1), now);
            core.report(slot, ChildMessage::Ready { pid: pid as u32 }, now);
            children.push(theirs);
        }
        let addr: ListenAddr = "127.0.0.1:0".parse().unwrap();
        let mut listeners = vec![WatchedListener::new(Listener::bind(&addr, 16).unwrap())];
        let _client = TcpStream::connect(listeners[0].listener.local_addr().to_string()).unwrap();
        let mut dispatcher = Dispatcher::default();

        let end = dispatcher.order_accepts(0, &mut listeners[0], &mut core, now);
        assert_eq!(end, TurnEnd::Done);
        assert_eq!(listeners[0].orders_out, 1);
        assert_eq!(core.board().get(0).unwrap().state, SlotState::Ordered);
        match children[0].recv_from_parent().unwrap() {
            Incoming::Message(ParentMessage::Accept { listener: 0 }, None) => {}
            other => panic!("slot 0 got {other:?}"),
        }
        // The same connection still waits: no second child is woken for it.
        let end = dispatcher.order_accepts(0, &mut listeners[0], &mut core, now);
        assert_eq!(end, TurnEnd::Done);
        assert_eq!(listeners[0].orders_out, 1);
        assert_eq!(core.board().get(1).unwrap().state, SlotState::Idle);

        let ordered_on = core.link_mut(0).unwrap().child.role.ordered_on.take();
        assert_eq!(ordered_on, Some(0), "the child remembers its listener");
        order_answered(0, &mut listeners);
        assert_eq!(listeners[0].orders_out, 0);
        assert!(
            listeners[0].recheck,
            "the listener is looked at again this turn"
        );
    }
}
