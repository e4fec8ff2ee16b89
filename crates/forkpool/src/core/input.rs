//! What the shell feeds the core.

use crate::config::PoolConfig;
use crate::policy::shutdown::Stop;
use crate::protocol::{ChildMessage, TemplateReply};
use crate::status::KillReason;
use crate::sys::process::ExitStatus;

/// One thing that happened, for [`super::Core::on`].
#[derive(Debug)]
pub(crate) enum Input {
    /// The child in `slot` sent `msg` (decoded; from a process the kernel
    /// vouched for).
    Report {
        /// The child.
        slot: usize,
        /// What it said.
        msg: ChildMessage,
    },
    /// The child in `slot` sent something that does not decode, or its
    /// channel failed: it is killed for `reason`.
    Broken {
        /// The child.
        slot: usize,
        /// Why, for the totals.
        reason: KillReason,
        /// Why, for the log.
        detail: String,
    },
    /// A 0-byte read on the channel of the child in `slot`: `hung_up`
    /// when its end is closed (it is exiting), not when it sent an empty
    /// datagram. A worker never verified whose claimed process is gone is
    /// freed at once: nothing will ever come from it, nor be reaped.
    ChannelClosed {
        /// The child.
        slot: usize,
        /// Whether the kernel says its end is closed.
        hung_up: bool,
        /// For a worker not verified yet: whether the process its template
        /// claimed is still the supervisor's child (`/proc`); true when
        /// nothing is claimed.
        claimed_is_child: bool,
    },
    /// The child in `slot`, whose channel read 0 bytes without its end
    /// closed (an empty datagram), has now closed its end.
    HungUp {
        /// The child.
        slot: usize,
    },
    /// A send to the child in `slot` failed; `peer_gone` when its end was
    /// closed (it is exiting, not misbehaving).
    SendFailed {
        /// The child.
        slot: usize,
        /// Whether its end of the channel is closed.
        peer_gone: bool,
        /// What the send said.
        detail: String,
    },
    /// The process `pid` (a worker, a template, or a process the core
    /// does not know) was reaped with `status`.
    Reaped {
        /// Its pid.
        pid: i32,
        /// How it ended.
        status: ExitStatus,
    },
    /// The template of `generation` replied.
    TemplateReply {
        /// The template.
        generation: u32,
        /// What it said.
        reply: TemplateReply,
    },
    /// The template of `generation` closed its channel.
    TemplateClosed {
        /// The template.
        generation: u32,
    },
    /// The template of `generation` sent what does not decode, its
    /// channel failed, a send to it failed, or it floods its stderr: it is
    /// killed.
    TemplateBroken {
        /// The template.
        generation: u32,
        /// Why, for the log.
        detail: String,
    },
    /// SIGHUP: the configuration read again (or why it could not be
    /// read, or is unfit for this pool in a way only the shell can tell):
    /// the pool rolls to it as a new generation, or refuses it.
    Reload(Result<Box<PoolConfig>, String>),
    /// The worker in `slot`, which [`super::Core::refork_due`] named, was
    /// sent `T` (become the template): it is the template of a new
    /// generation the pool rolls onto.
    Refork {
        /// Its slot.
        slot: usize,
    },
    /// The operator asked for a stop.
    Stop(Stop),
    /// Time passed: deadlines and pings.
    Tick,
}
