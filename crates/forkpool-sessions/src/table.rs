//! The ledger: where every open session is right now.
//!
//! A session is in exactly one [`Place`]: parked (the ledger holds it and
//! the poll watches its socket), ready (its next job waits for a worker), or
//! busy (a worker holds it and the ledger keeps only its number, and whether
//! its socket became ready meanwhile). The ledger is plain data with no I/O,
//! so the rules below are tested on their own.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Instant;

use super::messages::{Entry, Job, SessionId};
use super::session::CloseReason;
use super::stream::SessionStream;

#[derive(Debug)]
enum Place<S> {
    /// Waiting for its socket; closed for idleness at `deadline`, if any.
    Parked {
        entry: Entry<S>,
        deadline: Option<Instant>,
    },
    /// Its job sits in the ready queue.
    Ready(Job<S>),
    /// A worker holds it. `woken`: its socket was reported ready meanwhile,
    /// so it is stepped again rather than parked when it comes back.
    Busy { woken: bool },
}

#[derive(Debug)]
pub(crate) struct Table<S> {
    places: HashMap<SessionId, Place<S>>,
    /// Ready sessions, oldest first.
    ready: VecDeque<SessionId>,
    /// Idle deadlines of parked sessions, soonest first.
    deadlines: BTreeSet<(Instant, SessionId)>,
    next_id: SessionId,
}

impl<S> Default for Table<S> {
    fn default() -> Self {
        Table {
            places: HashMap::new(),
            ready: VecDeque::new(),
            deadlines: BTreeSet::new(),
            next_id: 0,
        }
    }
}

impl<S> Table<S> {
    /// Number the next session will get; [`Table::admit`] takes it.
    pub(crate) fn next_id(&self) -> SessionId {
        self.next_id
    }

    /// A new connection: it becomes ready to be opened.
    pub(crate) fn admit(&mut self, stream: SessionStream) -> SessionId {
        let id = self.next_id;
        self.next_id += 1;
        self.make_ready(Job::Open { id, stream });
        id
    }

    /// Puts a job at the back of the ready queue.
    pub(crate) fn make_ready(&mut self, job: Job<S>) {
        let id = job.id();
        self.places.insert(id, Place::Ready(job));
        self.ready.push_back(id);
    }

    /// Parks a session until its socket is ready or `deadline` passes; but
    /// if its socket was reported ready while a worker held it, the session
    /// is queued to step again at once instead (that report may be the only
    /// one). Returns whether it was parked.
    pub(crate) fn park(&mut self, entry: Entry<S>, deadline: Option<Instant>) -> bool {
        let id = entry.id;
        if let Some(Place::Busy { woken: true }) = self.places.get(&id) {
            self.make_ready(Job::Step(entry));
            return false;
        }
        if let Some(at) = deadline {
            self.deadlines.insert((at, id));
        }
        self.places.insert(id, Place::Parked { entry, deadline });
        true
    }

    /// Its socket is ready: a parked session becomes ready to step, a busy
    /// one is marked to step again when it comes back. Sessions already
    /// ready, or closed, are left alone.
    pub(crate) fn wake(&mut self, id: SessionId) {
        match self.places.get_mut(&id) {
            Some(Place::Parked { .. }) => {
                let entry = self.unpark(id);
                self.make_ready(Job::Step(entry));
            }
            Some(Place::Busy { woken }) => *woken = true,
            Some(Place::Ready(_)) | None => {}
        }
    }

    /// Takes the oldest ready job and marks its session busy.
    pub(crate) fn next_job(&mut self) -> Option<Job<S>> {
        while let Some(id) = self.ready.pop_front() {
            match self.places.insert(id, Place::Busy { woken: false }) {
                Some(Place::Ready(job)) => return Some(job),
                // Not ready after all (cannot happen: ids are queued only as
                // they become ready); put back what was there.
                Some(other) => {
                    self.places.insert(id, other);
                }
                None => {
                    self.places.remove(&id);
                }
            }
        }
        None
    }

    /// The session is closed: forget it.
    pub(crate) fn forget(&mut self, id: SessionId) {
        if let Some(Place::Parked {
            deadline: Some(at), ..
        }) = self.places.remove(&id)
        {
            self.deadlines.remove(&(at, id));
        }
    }

    /// The soonest idle deadline.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|&(at, _)| at)
    }

    /// Parked sessions whose deadline is not after `now` become ready to
    /// close for idleness. Returns how many.
    pub(crate) fn expire(&mut self, now: Instant) -> usize {
        let mut expired = 0;
        while let Some(&(at, id)) = self.deadlines.first() {
            if at > now {
                break;
            }
            let entry = self.unpark(id);
            self.make_ready(Job::Close(entry, CloseReason::IdleTimeout));
            expired += 1;
        }
        expired
    }

    /// Shutdown: every session the ledger holds is to be closed. Parked and
    /// ready-to-step sessions get a close job; connections never opened are
    /// returned for the caller to drop (they have no session to tell). Busy
    /// sessions are closed when they come back.
    pub(crate) fn close_all(&mut self) -> Vec<SessionStream> {
        let mut unopened = Vec::new();
        for id in std::mem::take(&mut self.ready) {
            match self.places.remove(&id) {
                Some(Place::Ready(Job::Open { stream, .. })) => unopened.push(stream),
                Some(Place::Ready(Job::Step(entry))) => {
                    self.make_ready(Job::Close(entry, CloseReason::Shutdown))
                }
                Some(Place::Ready(job @ Job::Close(..))) => self.make_ready(job),
                Some(other) => {
                    self.places.insert(id, other);
                }
                None => {}
            }
        }
        let parked: Vec<SessionId> = self
            .places
            .iter()
            .filter(|(_, place)| matches!(place, Place::Parked { .. }))
            .map(|(&id, _)| id)
            .collect();
        for id in parked {
            let entry = self.unpark(id);
            self.make_ready(Job::Close(entry, CloseReason::Shutdown));
        }
        unopened
    }

    /// Sessions in the ledger, in any place.
    pub(crate) fn len(&self) -> usize {
        self.places.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.places.is_empty()
    }

    /// Sessions waiting for a worker.
    pub(crate) fn ready_len(&self) -> usize {
        self.ready.len()
    }

    /// Takes a parked session out of its place (the caller puts it in
    /// another). Panics if it is not parked: callers check first.
    fn unpark(&mut self, id: SessionId) -> Entry<S> {
        match self.places.remove(&id) {
            Some(Place::Parked { entry, deadline }) => {
                if let Some(at) = deadline {
                    self.deadlines.remove(&(at, id));
                }
                entry
            }
            _ => unreachable!("session {id} is not parked"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

    fn stream() -> SessionStream {
        let (a, _b) = UnixStream::pair().unwrap();
        SessionStream::from(a)
    }

    fn entry(id: SessionId) -> Entry<&'static str> {
        Entry {
            id,
            stream: stream(),
            session: "state",
        }
    }

    #[test]
    fn a_session_runs_in_one_place_at_a_time() {
        let mut table: Table<&str> = Table::default();
        let id = table.admit(stream());
        assert!(matches!(table.next_job(), Some(Job::Open { .. })));
        assert!(table.park(entry(id), None));
        table.wake(id);
        table.wake(id);
        assert!(matches!(table.next_job(), Some(Job::Step(e)) if e.id == id));
        assert!(table.next_job().is_none(), "woken twice, queued once");
        table.forget(id);
        assert!(table.is_empty());
    }

    #[test]
    fn readiness_reported_while_busy_steps_the_session_again() {
        let mut table: Table<&str> = Table::default();
        let id = table.admit(stream());
        assert!(matches!(table.next_job(), Some(Job::Open { .. })));
        // Busy: nothing becomes ready, but the report is kept.
        table.wake(id);
        assert!(table.next_job().is_none());
        let deadline = Instant::now() + Duration::from_secs(1);
        assert!(
            !table.park(entry(id), Some(deadline)),
            "stepped, not parked"
        );
        assert_eq!(table.next_deadline(), None);
        assert!(matches!(table.next_job(), Some(Job::Step(e)) if e.id == id));
        // The report was used up: the next return parks it.
        assert!(table.park(entry(id), Some(deadline)));
        assert!(table.next_job().is_none());
        assert_eq!(table.next_deadline(), Some(deadline));
    }

    #[test]
    fn ready_sessions_run_oldest_first() {
        let mut table: Table<&str> = Table::default();
        for id in 0..3 {
            table.make_ready(Job::Step(entry(id)));
        }
        let order: Vec<_> = std::iter::from_fn(|| table.next_job().map(|j| j.id())).collect();
        assert_eq!(order, vec![0, 1, 2]);
    }

    #[test]
    fn expired_sessions_are_closed_for_idleness_and_others_keep_waiting() {
        let mut table: Table<&str> = Table::default();
        let now = Instant::now();
        table.park(entry(1), Some(now + Duration::from_secs(1)));
        table.park(entry(2), Some(now + Duration::from_secs(5)));
        table.park(entry(3), None);
        assert_eq!(table.next_deadline(), Some(now + Duration::from_secs(1)));
        assert_eq!(table.expire(now), 0);
        assert_eq!(table.expire(now + Duration::from_secs(2)), 1);
        assert!(matches!(
            table.next_job(),
            Some(Job::Close(e, CloseReason::IdleTimeout)) if e.id == 1
        ));
        assert_eq!(table.next_deadline(), Some(now + Duration::from_secs(5)));
        // Waking a session drops its deadline.
        table.wake(2);
        assert_eq!(table.next_deadline(), None);
        assert_eq!(table.expire(now + Duration::from_secs(60)), 0);
    }

    #[test]
    fn close_all_closes_parked_and_ready_and_returns_unopened() {
        let mut table: Table<&str> = Table::default();
        table.park(entry(10), Some(Instant::now()));
        table.make_ready(Job::Step(entry(11)));
        table.admit(stream());
        table.make_ready(Job::Step(entry(12)));
        let _busy = table.next_job(); // 11 goes to a worker
        let unopened = table.close_all();
        assert_eq!(unopened.len(), 1);
        let mut closing = Vec::new();
        while let Some(job) = table.next_job() {
            assert!(matches!(job, Job::Close(_, CloseReason::Shutdown)));
            closing.push(job.id());
        }
        closing.sort();
        assert_eq!(closing, vec![10, 12]);
        assert_eq!(table.next_deadline(), None);
        assert_eq!(table.len(), 3, "10 and 12 busy closing, 11 still busy");
    }
}
