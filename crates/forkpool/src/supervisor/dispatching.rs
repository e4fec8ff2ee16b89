//! The supervisor's side of dispatch: it lends the dispatcher the slot
//! table and a listener, then acts on how the pass ended — stops watching
//! a saturated listener, pauses one out of descriptors, kills a child that
//! could not be reached and goes again.

use std::time::Instant;

use crate::config::DispatchMode;
use crate::core::Counted;
use crate::dispatch::kernel::Claiming;
use crate::dispatch::TurnEnd;
use crate::status::KillReason;

use super::Supervisor;

impl Supervisor {
    /// Dispatches on each watched listener marked in this turn (it became
    /// readable, or an order on it was answered), after all of the turn's
    /// reports.
    pub(crate) fn dispatch_marked(&mut self, now: Instant) {
        for i in 0..self.listeners.len() {
            if std::mem::take(&mut self.listeners[i].recheck) && self.listeners[i].watched {
                self.dispatch(i, now);
            }
        }
    }

    /// A watched listener became readable (or is looked at again).
    pub(crate) fn dispatch(&mut self, listener: usize, now: Instant) {
        if listener >= self.listeners.len() {
            return;
        }
        // Each pass that finds a child unreachable kills it, which takes
        // it out of the children with room: at most one pass per slot.
        for _ in 0..=self.core.board().span() {
            let end = match self.core.config().dispatch {
                DispatchMode::Handoff | DispatchMode::Kernel => {
                    let mut accepted = 0;
                    let mut peers = std::mem::take(&mut self.resources.peers_handed);
                    let handed = |slot, pid, peer: Option<&socket2::SockAddr>| {
                        peers.push((slot, pid, peer.cloned()))
                    };
                    let end = match &self.kernel {
                        // The overflow: what no idle child could take.
                        Some(kernel) => self.dispatcher.accept_and_hand_off(
                            listener,
                            &self.listeners[listener],
                            &mut Claiming::new(&mut self.core, kernel.board()),
                            now,
                            &mut accepted,
                            handed,
                        ),
                        None => self.dispatcher.accept_and_hand_off(
                            listener,
                            &self.listeners[listener],
                            &mut self.core,
                            now,
                            &mut accepted,
                            handed,
                        ),
                    };
                    self.note_peers(peers);
                    self.core.count(Counted::Accepted(accepted));
                    if let Some(kernel) = &self.kernel {
                        kernel.board().count_overflow_handed(accepted);
                    }
                    end
                }
                DispatchMode::Order => self.dispatcher.order_accepts(
                    listener,
                    &mut self.listeners[listener],
                    &mut self.core,
                    now,
                ),
                DispatchMode::Shared | DispatchMode::None => TurnEnd::Done,
                #[cfg(feature = "herd")]
                DispatchMode::Herd => TurnEnd::Done,
            };
            match end {
                TurnEnd::Done => return,
                TurnEnd::Saturated => return self.unwatch_listener(listener),
                TurnEnd::Pause(until) => return self.pause_listener(listener, until),
                TurnEnd::Unreachable { slot, why } => {
                    self.kill(slot, KillReason::ChannelFailed, why, now);
                    self.child_available(now);
                }
            }
        }
    }

    /// A child became idle (or has room again): it takes a parked
    /// connection first, if any. Paused listeners are watched again by the
    /// loop.
    pub(crate) fn child_available(&mut self, now: Instant) {
        for _ in 0..=self.core.board().span() {
            let mut peers = std::mem::take(&mut self.resources.peers_handed);
            let handed = |slot, pid, peer: Option<&socket2::SockAddr>| {
                peers.push((slot, pid, peer.cloned()))
            };
            let end = match &self.kernel {
                Some(kernel) => self.dispatcher.hand_parked(
                    &mut Claiming::new(&mut self.core, kernel.board()),
                    now,
                    handed,
                ),
                None => self.dispatcher.hand_parked(&mut self.core, now, handed),
            };
            self.note_peers(peers);
            match end {
                TurnEnd::Unreachable { slot, why } => {
                    self.kill(slot, KillReason::ChannelFailed, why, now)
                }
                _ => return,
            }
        }
    }

    /// Each child handed a connection keeps its client's address in its
    /// figures (status, slow captures); `peers` is emptied for the next
    /// pass, its memory kept.
    fn note_peers(&mut self, mut peers: Vec<(usize, i32, Option<socket2::SockAddr>)>) {
        for (slot, pid, peer) in peers.drain(..) {
            self.handed_peer(slot, pid, peer);
        }
        self.resources.peers_handed = peers;
    }

    fn pause_listener(&mut self, listener: usize, until: Instant) {
        self.unwatch_listener(listener);
        self.listeners[listener].resume_at = Some(until);
    }
}
