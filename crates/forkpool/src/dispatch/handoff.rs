//! `handoff`: the supervisor accepts, then passes each connection's
//! descriptor to the lowest-numbered child with room for it (an idle one,
//! or, when children serve many connections, one under its capacity) with
//! `SCM_RIGHTS`.
//!
//! It accepts in a batch (the connections waiting when the turn began, or
//! until `EAGAIN`) while a child has room, counts the connection against the
//! child as it sends (one-connection children are marked busy), and never
//! waits for an answer.
//! A connection whose child turns out to be dead goes to the next idle
//! child, or is parked until one is free: an accepted connection is never
//! dropped because a child died.

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use tracing::{debug, error, warn};

use crate::protocol::ParentMessage;
use crate::status::KillReason;
use crate::supervisor::Supervisor;
use crate::sys;

/// How long to stop accepting after running out of descriptors or memory.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

impl Supervisor {
    pub(crate) fn accept_and_hand_off(&mut self, listener: usize, now: Instant) {
        // On TCP, take only the connections already waiting when this turn
        // began. Ones that arrive meanwhile fire the listener's event again
        // and are taken next turn, after the children's reports: a child
        // that has just finished is then known to be idle, and gets them.
        let l = &self.listeners[listener].listener;
        let mut budget = if l.is_tcp() { l.queued() } else { u32::MAX };
        while budget > 0 {
            budget -= 1;
            let Some(slot) = self.board.lowest_with_room() else {
                // Back-pressure: the rest wait in the kernel's backlog.
                self.unwatch_listener(listener);
                return;
            };
            let accepted = sys::socket::accept(self.listeners[listener].listener.as_fd());
            match accepted {
                Ok(fd) => {
                    self.totals.accepted += 1;
                    self.hand_off(slot, listener, fd, now);
                }
                Err(Errno::EAGAIN) => return,
                Err(Errno::ECONNABORTED | Errno::EPROTO) => continue,
                Err(e @ (Errno::EMFILE | Errno::ENFILE | Errno::ENOBUFS | Errno::ENOMEM)) => {
                    warn!(
                        listener,
                        "accept failed: {e}; the supervisor is out of descriptors or memory \
                         (raise `ulimit -n` / LimitNOFILE); pausing accepts for {ACCEPT_BACKOFF:?}"
                    );
                    self.pause_listener(listener, now + ACCEPT_BACKOFF);
                    return;
                }
                Err(e) => {
                    error!(
                        listener,
                        "accept failed: {e}; pausing accepts for {ACCEPT_BACKOFF:?}"
                    );
                    self.pause_listener(listener, now + ACCEPT_BACKOFF);
                    return;
                }
            }
        }
    }

    /// Sends `fd` to the child in `slot`; if that child cannot take it, to
    /// the next child with room; if none has room, parks it.
    pub(crate) fn hand_off(&mut self, mut slot: usize, listener: usize, fd: OwnedFd, now: Instant) {
        loop {
            let msg = ParentMessage::Connection {
                listener: listener as u16,
            };
            let sent = match self.board.link(slot) {
                Some(link) => link.send(msg, Some(fd.as_fd())),
                None => Err(std::io::Error::other("no channel")),
            };
            match sent {
                Ok(()) => {
                    self.note_handoff(slot, &fd);
                    // The child has its own copy now; ours closes on drop.
                    let _ = self.board.hand_connection(slot, now);
                    self.dispatch_latency.observe(now.elapsed().as_secs_f64());
                    debug!(slot, listener, "connection handed off");
                    return;
                }
                Err(e) => {
                    self.kill(
                        slot,
                        KillReason::ChannelFailed,
                        format!("cannot hand it a connection: {e}"),
                        now,
                    );
                    match self.board.lowest_with_room() {
                        Some(next) => slot = next,
                        None => {
                            self.parked.push_back((listener, fd));
                            return;
                        }
                    }
                }
            }
        }
    }

    fn pause_listener(&mut self, listener: usize, until: Instant) {
        self.unwatch_listener(listener);
        self.listeners[listener].resume_at = Some(until);
    }
}
