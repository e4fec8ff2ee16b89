//! The worker threads: take a job, run the session's hook, hand the session
//! back.
//!
//! A fixed number of threads share one job channel. The dispatcher never
//! queues more jobs than there are workers, so a job is picked up as soon as
//! it is sent, and sessions that are due but find every worker busy wait in
//! the dispatcher's ready queue where shutdown and timeouts can still see
//! them. Every hook runs under `catch_unwind`: a panic closes that one
//! session and the thread goes on serving the others.

use std::any::Any;
use std::io;
use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};

use mio::Interest;
use tracing::{debug, error};

use super::load::Load;
use super::messages::{Entry, Inbox, Job, Message, Next};
use super::session::{CloseReason, Session, Step};
use super::stream::SessionStream;

/// What every worker of one pool shares.
pub(crate) struct Crew<S: Session> {
    pub(crate) name: String,
    pub(crate) jobs: Mutex<Receiver<Job<S>>>,
    pub(crate) inbox: Inbox<S>,
    pub(crate) load: Arc<Load>,
    pub(crate) context: Arc<S::Context>,
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
                .name(format!("{}-w{index}", crew.name))
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
        while let Some(job) = self.next_job() {
            let report = self.run(job);
            // Only fails once the dispatcher has exited, and it waits for
            // every job it handed out before it exits.
            let _ = self.inbox.send(report);
        }
    }

    /// Blocks until there is a job; `None` once the dispatcher is gone.
    fn next_job(&self) -> Option<Job<S>> {
        let jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        jobs.recv().ok()
    }

    fn run(&self, job: Job<S>) -> Message<S> {
        match job {
            Job::Open { id, stream } => {
                let opened = guarded(&self.name, id, "open", || S::open(&self.context, &stream));
                let Some(session) = opened else {
                    drop(stream);
                    self.load.release();
                    return Message::Gone(id);
                };
                debug!(pool = %self.name, session = id, peer = %stream.peer(), "session opened");
                let mut entry = Entry {
                    id,
                    stream,
                    session,
                };
                let outcome = guarded(&self.name, id, "on_open", || {
                    entry.session.on_open(&mut entry.stream)
                });
                self.settle(entry, outcome)
            }
            Job::Step(mut entry) => {
                let outcome = guarded(&self.name, entry.id, "step", || {
                    entry.session.step(&mut entry.stream)
                });
                self.settle(entry, outcome)
            }
            Job::Close(entry, reason) => self.close(entry, reason),
        }
    }

    /// Turns what a hook returned into where the session goes next.
    fn settle(&self, entry: Entry<S>, outcome: Option<io::Result<Step>>) -> Message<S> {
        match outcome {
            Some(Ok(Step::Wait)) => Message::Back(entry, Next::Wait(Interest::READABLE)),
            Some(Ok(Step::WaitWritable)) => Message::Back(entry, Next::Wait(Interest::WRITABLE)),
            Some(Ok(Step::Continue)) => Message::Back(entry, Next::Continue),
            Some(Ok(Step::Close)) => self.close(entry, CloseReason::Finished),
            Some(Err(err)) => self.close(entry, CloseReason::Failed(err)),
            None => self.close(entry, CloseReason::Panicked),
        }
    }

    fn close(&self, mut entry: Entry<S>, reason: CloseReason) -> Message<S> {
        let id = entry.id;
        debug!(pool = %self.name, session = id, %reason, "session closed");
        guarded(&self.name, id, "on_close", || {
            entry.session.on_close(&mut entry.stream, &reason)
        });
        // Closing the descriptor also takes it out of the dispatcher's poll
        // set: epoll forgets a file once its last descriptor is closed.
        drop(entry);
        self.load.release();
        Message::Gone(id)
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
