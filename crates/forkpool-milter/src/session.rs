//! A milter conversation on forkpool's session pool: the [`Session`] that
//! reads packets, drives a [`Conversation`] and writes its replies.

use std::fmt;
use std::io::{self, Read};
use std::sync::Arc;
use std::time::Duration;

use forkpool_sessions::{CloseReason, Session, SessionStream, Step};

use crate::command::Command;
use crate::consts::DEFAULT_MAX_PACKET;
use crate::conversation::{Conversation, ConversationError, Flow};
use crate::filter::Filter;
use crate::reply::Reply;
use crate::watchdog::Watchdog;
use crate::wire::Decoder;

/// How much one step reads before letting other sessions run.
const READ_PER_STEP: usize = 1024 * 1024;

/// What one step's reading ended with.
enum Filled {
    /// Everything the socket had was read.
    Drained,
    /// The step's share was read; more may be waiting.
    MoreWaiting,
    /// The MTA closed its side.
    PeerClosed,
}

/// What every conversation of one session pool shares: the filter's shared
/// value, the protocol's limits and the step deadline.
#[derive(Debug)]
pub struct MilterContext<S> {
    /// Given to [`Filter::new`] for each conversation.
    pub shared: Arc<S>,
    /// The longest packet accepted from the MTA (command byte included).
    pub max_packet: usize,
    /// Tempfails and closes a conversation whose hook runs too long.
    pub watchdog: Option<Watchdog>,
}

impl<S> MilterContext<S> {
    /// The context for `shared`, with the default packet bound and no step
    /// deadline.
    pub fn new(shared: S) -> Self {
        MilterContext {
            shared: Arc::new(shared),
            max_packet: DEFAULT_MAX_PACKET,
            watchdog: None,
        }
    }

    /// The context for `shared`, tempfailing and closing a conversation
    /// whose hook is still running `deadline` after its command arrived.
    /// Starts one watching thread.
    pub fn with_step_deadline(shared: S, deadline: Duration) -> io::Result<Self> {
        Ok(MilterContext {
            watchdog: Some(Watchdog::start(deadline)?),
            ..MilterContext::new(shared)
        })
    }
}

/// One MTA connection served by a [`Filter`].
pub struct MilterSession<F: Filter> {
    context: Arc<MilterContext<F::Shared>>,
    conversation: Conversation<F>,
    decoder: Decoder,
    output: Vec<u8>,
    closing: bool,
    peer: String,
}

impl<F: Filter> fmt::Debug for MilterSession<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MilterSession")
            .field("peer", &self.peer)
            .field("conversation", &self.conversation)
            .field("closing", &self.closing)
            .finish_non_exhaustive()
    }
}

impl<F: Filter> MilterSession<F> {
    /// The conversation inside.
    pub fn conversation(&self) -> &Conversation<F> {
        &self.conversation
    }

    /// Reads what has arrived into the decoder.
    fn fill(&mut self, stream: &mut SessionStream) -> io::Result<Filled> {
        let mut chunk = [0u8; 16 * 1024];
        let mut read = 0;
        while read < READ_PER_STEP {
            match stream.read(&mut chunk) {
                Ok(0) => return Ok(Filled::PeerClosed),
                Ok(n) => {
                    read += n;
                    self.decoder.push(&chunk[..n]);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Filled::Drained),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(Filled::MoreWaiting)
    }

    /// Handles every whole packet in hand.
    fn answer(&mut self, stream: &SessionStream) -> Result<Flow, ConversationError> {
        let mut replies = Vec::new();
        while let Some(packet) = self.decoder.next_packet()? {
            let command = Command::decode(&packet)?;
            let watchdog = self.context.watchdog.as_ref();
            let owes = self.conversation.expects_reply(&command);
            let watched = watchdog.and_then(|w| w.begin(stream, owes));
            let flow = self.conversation.handle(command, &mut replies);
            if let Some(step) = watched {
                if !step.end() {
                    // Too late: the MTA was tempfailed and the socket shut.
                    return Ok(Flow::Close);
                }
            }
            for reply in replies.drain(..) {
                reply.encode(&mut self.output)?;
            }
            if flow? == Flow::Close {
                return Ok(Flow::Close);
            }
        }
        Ok(Flow::Go)
    }

    /// Writes what it can; `true` once nothing is left.
    fn flush(&mut self, stream: &mut SessionStream) -> io::Result<bool> {
        stream.write_pending(&mut self.output)
    }
}

impl<F: Filter> Session for MilterSession<F> {
    type Context = MilterContext<F::Shared>;

    fn open(context: &Arc<Self::Context>, stream: &SessionStream) -> Self {
        MilterSession {
            context: Arc::clone(context),
            conversation: Conversation::new(Arc::clone(&context.shared)),
            decoder: Decoder::new(context.max_packet),
            output: Vec::new(),
            closing: false,
            peer: stream.peer(),
        }
    }

    fn step(&mut self, stream: &mut SessionStream) -> io::Result<Step> {
        if !self.flush(stream)? {
            return Ok(Step::WaitWritable);
        }
        if self.closing {
            return Ok(Step::Close);
        }
        let filled = self.fill(stream)?;
        match self.answer(stream) {
            Ok(Flow::Go) => {}
            Ok(Flow::Close) => self.closing = true,
            Err(e) => {
                tracing::warn!(peer = %self.peer, "milter conversation ended: {e}");
                self.closing = true;
            }
        }
        if !self.flush(stream)? {
            return Ok(Step::WaitWritable);
        }
        Ok(match filled {
            _ if self.closing => Step::Close,
            Filled::PeerClosed => Step::Close,
            // This step read its share; let other conversations run first.
            Filled::MoreWaiting => Step::Continue,
            // `answer` took every whole packet in hand: wait for more.
            Filled::Drained => Step::Wait,
        })
    }

    fn on_close(&mut self, stream: &mut SessionStream, reason: &CloseReason) {
        if let CloseReason::Panicked = reason {
            // The hook that panicked left the MTA waiting: tempfail that
            // command rather than let it wait for its timeout. The
            // filter's state may be half updated, so no hook runs again.
            if self.conversation.owes_reply() {
                let mut out = Vec::new();
                if Reply::Tempfail.encode(&mut out).is_ok() {
                    self.output.extend_from_slice(&out);
                }
            }
            let _ = self.flush(stream);
            return;
        }
        let _ = self.flush(stream);
        self.conversation.end_session();
    }
}
