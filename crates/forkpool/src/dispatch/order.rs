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

use crate::protocol::ParentMessage;
use crate::status::KillReason;
use crate::supervisor::Supervisor;
use crate::sys;

impl Supervisor {
    pub(crate) fn order_accepts(&mut self, listener: usize, now: Instant) {
        let watched = &self.listeners[listener];
        let waiting = if watched.listener.is_tcp() {
            watched.listener.queued()
        } else {
            u32::from(sys::socket::readable_now(watched.listener.as_fd()))
        };
        let mut wanted = waiting.saturating_sub(watched.orders_out);
        while wanted > 0 {
            let Some(slot) = self.board.lowest_idle() else {
                self.unwatch_listener(listener);
                return;
            };
            let msg = ParentMessage::Accept {
                listener: listener as u16,
            };
            let Some(link) = self.board.link_mut(slot) else {
                return;
            };
            if let Err(e) = link.send(msg, None) {
                self.kill(
                    slot,
                    KillReason::ChannelFailed,
                    format!("cannot send an accept order: {e}"),
                    now,
                );
                continue;
            }
            link.ordered_on = Some(listener);
            let _ = self.board.order_accept(slot, now);
            self.dispatch_latency.observe(now.elapsed().as_secs_f64());
            self.listeners[listener].orders_out += 1;
            wanted -= 1;
        }
    }

    /// A child answered its accept order (`Busy` or `Missed`): the listener
    /// may hold more connections than orders now outstanding.
    pub(crate) fn order_answered(&mut self, slot: usize) {
        let ordered = self
            .board
            .link_mut(slot)
            .and_then(|link| link.ordered_on.take());
        if let Some(listener) = ordered {
            let l = &mut self.listeners[listener];
            l.orders_out = l.orders_out.saturating_sub(1);
            // Decided after all of this turn's reports are read, so an
            // `Idle` queued behind this report is seen first.
            l.recheck = true;
        }
    }
}
