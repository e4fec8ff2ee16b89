//! The shell's half of the core: carrying out what the core asked for,
//! and feeding back what that said (a failed send).

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tracing::warn;

use super::children::{is_peer_gone, signal_child};
use super::{notify, Supervisor};
use crate::core::{Effect, Input};
use crate::dispatch::order;
use crate::protocol::ParentMessage;
use crate::sys::process::ExitStatus;

impl Supervisor {
    /// Carries out every effect the core has asked for, in order, until it
    /// asks for nothing more (a failed send is fed back, and may ask for a
    /// kill).
    pub(super) fn carry_out(&mut self, now: Instant) {
        // Each round's effects come from the last round's inputs; the core
        // is finite in what one input can ask, so this ends. The bound is
        // a guard, not a rule.
        for _ in 0..1024 {
            let mut effects = self.core.take_effects();
            if effects.is_empty() {
                self.core.give_back(effects);
                return;
            }
            for effect in effects.drain(..) {
                self.carry_out_one(effect, now);
            }
            self.core.give_back(effects);
        }
        warn!("the core kept asking for effects; left the rest for the next turn");
    }

    fn carry_out_one(&mut self, effect: Effect<super::ChildLink>, now: Instant) {
        if let Effect::Send {
            slot,
            msg: ParentMessage::Quit,
        }
        | Effect::Terminate { slot }
        | Effect::Kill { slot } = effect
        {
            self.take_off_kernel_dispatch(slot);
        }
        match effect {
            Effect::Send { slot, msg } => self.send_to(slot, msg, now),
            Effect::Terminate { slot } => self.terminate(slot, now),
            Effect::Kill { slot } => self.kill_verified(slot),
            Effect::GiveUpUnverified { slot, detail } => {
                self.give_up_unverified(slot, &detail, now)
            }
            Effect::StopReading { slot } => self.stop_reading(slot),
            Effect::OwnGroup { slot } => self.own_group(slot),
            Effect::Seat { slot } => self.send_seat(slot, now),
            Effect::Room => self.child_available(now),
            Effect::MarkBoard { slot, idle } => self.mark_board(slot, idle),
            Effect::OrderAnswered { listener } => {
                order::order_answered(listener, &mut self.listeners)
            }
            Effect::OrderDropped { listener } => {
                order::order_dropped(listener, &mut self.listeners)
            }
            Effect::ConnectionEnded { slot, pid, took } => {
                self.connection_ended(slot, pid, took, now)
            }
            Effect::Served { slot } => self.recycle_after_connection(slot, now),
            Effect::BusyTooLong {
                slot,
                reason,
                detail,
            } => self.busy_too_long(slot, reason, detail, now),
            Effect::Redispatch { listener } => self.redispatch(listener, now),
            Effect::Gone(gone) => self.child_gone(gone),
            Effect::StopListening => self.stop_listening(),
            Effect::Abandoned(abandoned) => self.close_abandoned(abandoned.slot, &abandoned.link),
            Effect::SendTemplate {
                generation,
                request,
            } => self.send_to_template(generation, request, now),
            Effect::KillTemplate { generation } => self.signal_template(generation),
            Effect::TemplateGone {
                generation,
                pid,
                failure,
            } => self.template_gone(generation, pid, failure, now),
            Effect::Rewatch { was_watching } => self.rewatch(was_watching, now),
            Effect::Status(status) => notify::ready_with_status(&status),
            Effect::ReloadFailed(failed) => self.log_reload_failed(&failed, &[]),
            Effect::BecameTemplate {
                generation,
                pid,
                link,
            } => self.became_template(generation, pid, link, now),
            Effect::Stranger { pid, status } => self.stranger_reaped(pid, status),
            Effect::SuccessorGone { pid, status } => self.successor_gone(pid, status),
        }
    }

    /// A child on its way out (told to quit, terminated or killed) gets no
    /// more connections from the kernel, even if it goes idle on the board
    /// before it reads its order. What was queued on it before is its to
    /// serve; what is left when it is gone is handed on (`kernel.rs`).
    fn take_off_kernel_dispatch(&mut self, slot: usize) {
        let Some(kernel) = &mut self.kernel else {
            return;
        };
        if let Err(e) = kernel.take_off(slot) {
            warn!(
                slot,
                "kernel dispatch: cannot take the slot off the socket array: {e}"
            );
        }
    }

    /// SIGTERM to the child in `slot`; a failure goes back to the core.
    fn terminate(&mut self, slot: usize, now: Instant) {
        let sent = self
            .core
            .board()
            .get(slot)
            .map(|e| signal_child(&e.link, e.pid, Signal::SIGTERM));
        if let Some(Err(e)) = sent {
            self.core.on(
                Input::SendFailed {
                    slot,
                    peer_gone: false,
                    detail: format!("cannot send SIGTERM: {e}"),
                },
                now,
            );
        }
    }

    /// Stops watching the channel of the child in `slot`.
    fn stop_reading(&mut self, slot: usize) {
        if let Some(link) = self.core.board().link(slot) {
            self.deregister_channel(&link.channel);
        }
    }

    /// Puts the child in `slot` in a process group of its own, so that
    /// what it starts can be swept with it (`containment.rs`).
    fn own_group(&self, slot: usize) {
        if let Some(e) = self.core.board().get(slot) {
            let _ = crate::sys::process::own_process_group(e.pid);
        }
    }

    /// A child finished a connection: the CPU watches hear it, and one the
    /// supervisor handed off counts in the service-time histogram.
    fn connection_ended(&mut self, slot: usize, pid: i32, took: Option<Duration>, now: Instant) {
        self.core.connection_ended_at(now);
        if let Some(took) = took {
            self.resources.service_time.observe(took.as_secs_f64());
            self.handed_peer(slot, pid, None);
        }
    }

    /// Dispatches from `listener` again, if it is watched.
    fn redispatch(&mut self, listener: usize, now: Instant) {
        if self.listeners.get(listener).is_some_and(|l| l.watched) {
            self.dispatch(listener, now);
        }
    }

    /// A stop: the listeners are no longer watched, and connections parked
    /// for a child are closed.
    fn stop_listening(&mut self) {
        if !self.handover.handed_over {
            notify::stopping();
        }
        self.unwatch_listeners();
        let parked = self.dispatcher.close_parked();
        if parked > 0 {
            warn!(
                count = parked,
                "closing connections that were waiting for a child"
            );
        }
    }

    /// A process reaped that held no slot, and not the upgrade's
    /// successor: perhaps a worker whose template has not said its pid yet
    /// (it died at once), kept for that answer.
    fn stranger_reaped(&mut self, pid: i32, status: ExitStatus) {
        self.core.remember_orphan(pid, status);
        tracing::debug!(pid, %status, "reaped a process that held no slot");
    }

    /// Sends `msg` to the child in `slot`; a failure goes back to the core.
    fn send_to(&mut self, slot: usize, msg: ParentMessage, now: Instant) {
        let Some(link) = self.core.board().link(slot) else {
            return;
        };
        if let Err(e) = link.send(msg, None) {
            let what = match msg {
                ParentMessage::Ping { .. } => "a ping",
                ParentMessage::Quit => "quit",
                _ => "a message",
            };
            self.core.on(
                Input::SendFailed {
                    slot,
                    peer_gone: is_peer_gone(&e),
                    detail: format!("cannot send {what}: {e}"),
                },
                now,
            );
        }
    }
}
