//! The worker threads: wait for a job (taking a turn at the poll when
//! nothing is ready), run the session's hook, hand the session back.
//!
//! A fixed number of threads share one [`Poller`]; there is no other thread.
//! A worker runs at most one job at a time, so sessions that are due while
//! every worker is busy wait in the ledger's ready queue (or, unseen yet, in
//! the kernel) where shutdown and timeouts can still see them. Every hook
//! runs under `catch_unwind`: a panic closes that one session and the thread
//! goes on serving the others.

use std::any::Any;
use std::io;
use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use mio::Interest;
use tracing::{debug, error};

use super::messages::{Entry, Job, Next, SessionId};
use super::poller::{self, Poller};
use super::session::{CloseReason, Session, Step};
use super::stream::SessionStream;

/// What every worker of one pool shares.
pub(crate) struct Crew<S: Session> {
    pub(crate) poller: Arc<Poller<S>>,
}

/// What became of a session after a job.
enum Outcome<S> {
    /// Still open: it goes where [`Next`] says.
    Back(Entry<S>, Next),
    /// Closed (or never opened); its place is already released.
    Gone(SessionId),
}

/// Starts `count` workers named `<name>-w<i>`; each sends on `started` once
/// it runs.
pub(crate) fn spawn_workers<S: Session>(
    count: usize,
    crew: Crew<S>,
    started: &Sender<()>,
) -> io::Result<Vec<JoinHandle<()>>> {
    let crew = Arc::new(crew);
    (0..count)
        .map(|index| {
            let crew = Arc::clone(&crew);
            let started = started.clone();
            thread::Builder::new()
                .name(format!("{}-w{index}", crew.poller.name))
                .spawn(move || {
                    let _ = started.send(());
                    drop(started);
                    crew.work()
                })
        })
        .collect()
}

impl<S: Session> Crew<S> {
    fn work(&self) {
        let mut events = poller::events();
        while let Some(job) = self.poller.next_job(&mut events) {
            match self.run(job) {
                Outcome::Back(entry, next) => self.poller.hand_back(entry, next),
                Outcome::Gone(id) => self.poller.forget(id),
            }
        }
    }

    fn run(&self, job: Job<S>) -> Outcome<S> {
        let _running = self.poller.load.run_one();
        match job {
            Job::Open { id, stream } => {
                let opened = guarded(&self.poller.name, id, "open", || {
                    S::open(&self.poller.context, &stream)
                });
                let Some(session) = opened else {
                    drop(stream);
                    self.poller.load.release();
                    return Outcome::Gone(id);
                };
                debug!(pool = %self.poller.name, session = id, peer = %stream.peer(), "session opened");
                let mut entry = Entry {
                    id,
                    stream,
                    session,
                };
                let outcome = guarded(&self.poller.name, id, "on_open", || {
                    entry.session.on_open(&mut entry.stream)
                });
                self.settle(entry, outcome)
            }
            Job::Step(mut entry) => {
                let outcome = guarded(&self.poller.name, entry.id, "step", || {
                    entry.session.step(&mut entry.stream)
                });
                self.settle(entry, outcome)
            }
            Job::Close(entry, reason) => self.close(entry, reason),
        }
    }

    /// Turns what a hook returned into where the session goes next.
    fn settle(&self, entry: Entry<S>, outcome: Option<io::Result<Step>>) -> Outcome<S> {
        match outcome {
            Some(Ok(Step::Wait)) => Outcome::Back(entry, Next::Wait(Interest::READABLE)),
            Some(Ok(Step::WaitWritable)) => Outcome::Back(entry, Next::Wait(Interest::WRITABLE)),
            Some(Ok(Step::Continue)) => Outcome::Back(entry, Next::Continue),
            Some(Ok(Step::Close)) => self.close(entry, CloseReason::Finished),
            Some(Err(err)) => self.close(entry, CloseReason::Failed(err)),
            None => self.close(entry, CloseReason::Panicked),
        }
    }

    fn close(&self, mut entry: Entry<S>, reason: CloseReason) -> Outcome<S> {
        let id = entry.id;
        debug!(pool = %self.poller.name, session = id, %reason, "session closed");
        guarded(&self.poller.name, id, "on_close", || {
            entry.session.on_close(&mut entry.stream, &reason)
        });
        // Closing the descriptor also takes it out of the poll set: epoll
        // forgets a file once its last descriptor is closed.
        drop(entry);
        self.poller.load.release();
        Outcome::Gone(id)
    }
}

/// Runs one user hook; a panic is logged and becomes `None`.
fn guarded<T>(pool: &str, session: u64, hook: &str, f: impl FnOnce() -> T) -> Option<T> {
    match panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(value) => Some(value),
        Err(payload) => {
            error!(
                pool,
                session,
                hook,
                panic = panic_message(payload.as_ref()),
                "session hook panicked"
            );
            None
        }
    }
}

/// Lets [`Session::refuse`] explain to a peer beyond the cap; a panic is
/// logged and the connection closed all the same.
pub(crate) fn refuse<S: Session>(pool: &str, context: &S::Context, stream: &mut SessionStream) {
    if let Err(payload) = panic::catch_unwind(AssertUnwindSafe(|| S::refuse(context, stream))) {
        error!(
            pool,
            panic = panic_message(payload.as_ref()),
            "refuse hook panicked"
        );
    }
}

pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(text) = payload.downcast_ref::<&str>() {
        text
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text
    } else {
        "(not a string)"
    }
}
