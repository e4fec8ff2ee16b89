//! Refork (`--refork-after N[,N2,...]`): the warmest worker becomes the
//! template, so what real traffic warmed in it (caches, lazily imported
//! modules, compiled code) is shared by the workers forked after.
//!
//! When it is due is the core's rule (`Core::refork_due`, in
//! `core/rollout.rs`): the lowest slot gets every connection while it is
//! idle, so it is the warmest worker; once it has served the next
//! threshold's count of connections, and is idle, and no reload is
//! rolling, the supervisor:
//! 1. sends it `T` (BecomeTemplate) with a new template channel, and
//!    tells the core ([`crate::core::Input::Refork`]), which vacates its
//!    slot (it gets no more work) and rolls the pool to a new generation
//!    whose template it is;
//! 2. stops reading it as a worker and talks to it as the template
//!    ([`crate::core::Effect::BecameTemplate`]); its stderr pipe stays
//!    with it, now as the template's. Once it says `R` on the new channel,
//!    a canary is forked from it, then one old worker after another is
//!    replaced, and the old template is told to quit when the rollout is
//!    done.
//!
//! If it never becomes a working template, the rollout fails like any
//! reload and the old generation, with its template, keeps serving. Each
//! threshold is used once, failed or not.

use std::os::fd::AsFd;
use std::time::Instant;

use tracing::warn;

use super::{ChildLink, Supervisor};
use crate::channel::Channel;
use crate::core::Input;
use crate::protocol::WorkerOrder;

impl Supervisor {
    /// Starts a refork if the core says one is due.
    pub(super) fn consider_refork(&mut self, now: Instant) {
        let Some(slot) = self.core.refork_due() else {
            return;
        };
        // Kernel dispatch: the core's idle is as of its last reading of the
        // scoreboard. The worker is claimed there (idle to busy) if it is
        // idle, so the kernel gives it nothing more and it reads `T` at
        // once; one serving a connection the kernel gave it reads `T` when
        // that is done (its channel stays open until then: see
        // `keep_worker_channel`).
        let claimed = self.claim_for_refork(slot);
        let (ours, theirs) = match Channel::pair() {
            Ok(pair) => pair,
            Err(e) => {
                warn!("cannot create a template channel for the refork: {e}");
                self.unclaim_for_refork(slot, claimed);
                return;
            }
        };
        let Some(entry) = self.core.board().get(slot) else {
            self.unclaim_for_refork(slot, claimed);
            return;
        };
        let sent = entry
            .link
            .channel
            .send_order(WorkerOrder::BecomeTemplate, Some(theirs.as_fd()));
        if let Err(e) = sent {
            warn!(pid = entry.pid, "cannot send the refork order: {e}");
            self.unclaim_for_refork(slot, claimed);
            return;
        }
        drop(theirs);
        self.templates.refork_channel = Some(ours);
        self.core.on(Input::Refork { slot }, now);
        self.carry_out(now);
    }

    /// Carries out [`crate::core::Effect::BecameTemplate`]: the worker's
    /// channel is no longer read; the template channel sent with `T`, its
    /// stderr and its pidfd are the template's now.
    pub(super) fn became_template(
        &mut self,
        generation: u32,
        pid: i32,
        mut link: ChildLink,
        now: Instant,
    ) {
        self.deregister_channel(&link.channel);
        let output = link.output.take();
        if let Some(output) = &output {
            self.forget_output(output);
        }
        let Some(channel) = self.templates.refork_channel.take() else {
            warn!(pid, "the refork's template channel is missing");
            self.template_broken(generation, "its template channel is missing".into(), now);
            return;
        };
        let pidfd = link.pidfd.take();
        if let Err(e) = self.adopt_template(pid, pidfd, generation, channel, output) {
            warn!(pid, "cannot watch the new template: {e}");
            self.template_broken(generation, format!("cannot watch its channel: {e}"), now);
            return;
        }
        self.keep_worker_channel(generation, link.channel);
    }
}
