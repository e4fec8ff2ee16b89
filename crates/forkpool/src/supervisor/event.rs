//! What can wake the supervisor's loop, as one typed [`Event`], and the one
//! place it is turned into a `mio::Token` and back.
//!
//! Every source the loop registers with the poll gets its token from
//! [`Event::token`], and every token the poll returns is read back with
//! [`Event::from_token`]. The numbering is private to this file: indexed
//! events each own a range of [`RANGE`] tokens, single events sit at the top
//! of the token space, and decoding checks each range's two ends, so the
//! order of the arms does not matter.

use std::io;
use std::os::fd::RawFd;

use mio::unix::SourceFd;
use mio::{Interest, Token};

/// One reason for the loop to wake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// Listener `i` has connections waiting.
    Listener(usize),
    /// The child in this slot sent reports (or closed its channel).
    Child(usize),
    /// The exec'd worker in this slot wrote to its stderr.
    Output(usize),
    /// The template of this generation (`--preload`) sent replies (or
    /// closed its channel).
    Template(usize),
    /// The template of this generation wrote to its stderr.
    TemplateOutput(usize),
    /// Kernel dispatch: the socket of empty slot `.0` for listener `.1`
    /// has a connection queued (its child left just as the kernel gave it
    /// one).
    SlotSocket(usize, usize),
    /// The supervisor's small servers (control socket, metrics, agent
    /// check) have something to do: their own poll is readable.
    Endpoints,
    /// A signal arrived (the self-pipe is readable).
    Signal,
    /// The supervisor started by a binary upgrade wrote to its ready pipe.
    Upgrade,
}

/// How many indices each indexed event can carry: far more listeners or
/// slots than any pool has.
pub(crate) const RANGE: usize = 1 << 20;

const CHILD_BASE: usize = RANGE;
const OUTPUT_BASE: usize = 2 * RANGE;
const TEMPLATE_BASE: usize = 3 * RANGE;
const TEMPLATE_OUTPUT_BASE: usize = 4 * RANGE;
const SLOT_SOCKET_BASE: usize = 5 * RANGE;
/// Listeners per slot a [`Event::SlotSocket`] token can tell apart.
pub(crate) const SLOT_SOCKET_LISTENERS: usize = 256;
const SIGNAL: usize = usize::MAX - 1;
const ENDPOINTS: usize = usize::MAX - 2;
const UPGRADE: usize = usize::MAX - 3;

impl Event {
    /// The token to register this event's source with.
    ///
    /// # Panics
    /// If an index is [`RANGE`] or more (no pool gets near it; a token
    /// outside its range would be read back as another event).
    pub(crate) const fn token(self) -> Token {
        let (base, i) = match self {
            Event::Listener(i) => (0, i),
            Event::Child(i) => (CHILD_BASE, i),
            Event::Output(i) => (OUTPUT_BASE, i),
            Event::Template(i) => (TEMPLATE_BASE, i),
            Event::TemplateOutput(i) => (TEMPLATE_OUTPUT_BASE, i),
            Event::SlotSocket(slot, listener) => {
                assert!(
                    listener < SLOT_SOCKET_LISTENERS,
                    "event index out of its token range"
                );
                (SLOT_SOCKET_BASE, slot * SLOT_SOCKET_LISTENERS + listener)
            }
            Event::Endpoints => return Token(ENDPOINTS),
            Event::Signal => return Token(SIGNAL),
            Event::Upgrade => return Token(UPGRADE),
        };
        assert!(i < RANGE, "event index out of its token range");
        Token(base + i)
    }

    /// The event a token stands for; `None` for a token no source uses.
    pub(crate) fn from_token(token: Token) -> Option<Event> {
        let t = token.0;
        let event = match t {
            SIGNAL => Event::Signal,
            ENDPOINTS => Event::Endpoints,
            UPGRADE => Event::Upgrade,
            _ if t < CHILD_BASE => Event::Listener(t),
            _ if (CHILD_BASE..OUTPUT_BASE).contains(&t) => Event::Child(t - CHILD_BASE),
            _ if (OUTPUT_BASE..TEMPLATE_BASE).contains(&t) => Event::Output(t - OUTPUT_BASE),
            _ if (TEMPLATE_BASE..TEMPLATE_OUTPUT_BASE).contains(&t) => {
                Event::Template(t - TEMPLATE_BASE)
            }
            _ if (TEMPLATE_OUTPUT_BASE..SLOT_SOCKET_BASE).contains(&t) => {
                Event::TemplateOutput(t - TEMPLATE_OUTPUT_BASE)
            }
            _ if (SLOT_SOCKET_BASE..SLOT_SOCKET_BASE + RANGE).contains(&t) => {
                let i = t - SLOT_SOCKET_BASE;
                Event::SlotSocket(i / SLOT_SOCKET_LISTENERS, i % SLOT_SOCKET_LISTENERS)
            }
            _ => return None,
        };
        Some(event)
    }
}

/// What wakes the loop, as the supervisor holds it.
pub(super) struct Wake {
    /// The poll every source is registered with.
    pub poll: mio::Poll,
    /// The signals the supervisor handles.
    pub signals: super::signals::Signals,
    /// Where the signal handlers write, watched by the poll.
    pub signal_pipe: super::signals::SignalPipe,
    /// Children with reports left unread last turn.
    pub unread: Vec<usize>,
    /// Kernel dispatch: empty slots' sockets watched, as (slot, listener).
    pub orphaned_sockets: Vec<(usize, usize)>,
}

impl Wake {
    /// Watches `fd` for reading; the poll reports it as `event`.
    pub fn watch(&self, fd: RawFd, event: Event) -> io::Result<()> {
        let token = event.token();
        self.poll
            .registry()
            .register(&mut SourceFd(&fd), token, Interest::READABLE)
    }

    /// Watches `fd` again: the poll is edge-triggered, so what a turn left
    /// unread is reported in the next one, after every other source.
    pub fn rewatch(&self, fd: RawFd, event: Event) -> io::Result<()> {
        let token = event.token();
        self.poll
            .registry()
            .reregister(&mut SourceFd(&fd), token, Interest::READABLE)
    }

    /// Stops watching `fd` (one not watched is no error: there is nothing
    /// to undo).
    pub fn forget(&self, fd: RawFd) {
        let _ = self.poll.registry().deregister(&mut SourceFd(&fd));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every variant, at the ends of its range where it has one.
    fn every_variant() -> Vec<Event> {
        let mut all = vec![Event::Endpoints, Event::Signal, Event::Upgrade];
        for i in [0, 1, RANGE - 1] {
            all.extend([
                Event::Listener(i),
                Event::Child(i),
                Event::Output(i),
                Event::Template(i),
                Event::TemplateOutput(i),
            ]);
        }
        for (slot, listener) in [(0, 0), (1, 255), (RANGE / SLOT_SOCKET_LISTENERS - 1, 3)] {
            all.push(Event::SlotSocket(slot, listener));
        }
        all
    }

    #[test]
    fn every_variant_round_trips() {
        for event in every_variant() {
            assert_eq!(Event::from_token(event.token()), Some(event), "{event:?}");
        }
    }

    #[test]
    fn no_two_variants_share_a_token() {
        let all = every_variant();
        let mut tokens: Vec<usize> = all.iter().map(|e| e.token().0).collect();
        tokens.sort_unstable();
        tokens.dedup();
        assert_eq!(tokens.len(), all.len());
    }

    #[test]
    fn unused_tokens_are_no_event() {
        assert_eq!(Event::from_token(Token(SLOT_SOCKET_BASE + RANGE)), None);
        assert_eq!(Event::from_token(Token(usize::MAX)), None);
    }

    #[test]
    #[should_panic(expected = "out of its token range")]
    fn an_index_past_its_range_is_refused() {
        let _ = Event::Child(RANGE).token();
    }

    proptest! {
        #[test]
        fn indexed_events_round_trip(i in 0..RANGE, kind in 0..5u8) {
            let event = match kind {
                0 => Event::Listener(i),
                1 => Event::Child(i),
                2 => Event::Output(i),
                3 => Event::Template(i),
                _ => Event::TemplateOutput(i),
            };
            prop_assert_eq!(Event::from_token(event.token()), Some(event));
        }

        #[test]
        fn every_token_decodes_to_itself_or_nothing(t in any::<usize>()) {
            if let Some(event) = Event::from_token(Token(t)) {
                prop_assert_eq!(event.token(), Token(t));
            }
        }
    }
}
