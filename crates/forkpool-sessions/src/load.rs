//! The open-session count: the cap is enforced here, and every change is
//! reported to the [`LoadHook`].
//!
//! A place is *reserved* before a connection enters the pool and *released*
//! after its socket is closed, so the count is exactly "descriptors the pool
//! holds" and two threads adding at once cannot both take the last place.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use super::config::LoadHook;

/// The answer to a request for a place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reserve {
    /// The place is yours; release it when the connection is closed.
    Taken,
    /// The pool is at its cap.
    Full,
    /// The pool is shutting down and takes nothing more.
    Closed,
}

#[derive(Debug)]
struct Count {
    open: usize,
    closed: bool,
}

/// One session's hook being run (see [`Load::run_one`]).
pub(crate) struct Running<'a>(&'a AtomicUsize);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

pub(crate) struct Load {
    max: usize,
    count: Mutex<Count>,
    room: Condvar,
    /// A copy of `count.open` readable without the lock, so the hook itself
    /// may ask for the count.
    open: AtomicUsize,
    /// Sessions a worker is running a hook of right now.
    running: AtomicUsize,
    hook: Option<LoadHook>,
}

impl Load {
    pub(crate) fn new(max: usize, hook: Option<LoadHook>) -> Self {
        Load {
            max,
            count: Mutex::new(Count {
                open: 0,
                closed: false,
            }),
            room: Condvar::new(),
            open: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            hook,
        }
    }

    /// Sessions a worker is running a hook of right now (one atomic read).
    pub(crate) fn running(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }

    /// A worker begins running a session's hook; the count goes back down
    /// when the returned guard is dropped (also on a panic).
    pub(crate) fn run_one(&self) -> Running<'_> {
        self.running.fetch_add(1, Ordering::Relaxed);
        Running(&self.running)
    }

    pub(crate) fn max(&self) -> usize {
        self.max
    }

    pub(crate) fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    pub(crate) fn has_capacity(&self) -> bool {
        let count = self.lock();
        !count.closed && count.open < self.max
    }

    pub(crate) fn try_reserve(&self) -> Reserve {
        let mut count = self.lock();
        self.take(&mut count)
    }

    /// Like [`try_reserve`](Load::try_reserve) but waits while the pool is
    /// full; never answers [`Reserve::Full`].
    pub(crate) fn reserve_waiting(&self) -> Reserve {
        let mut count = self.lock();
        while !count.closed && count.open >= self.max {
            count = self
                .room
                .wait(count)
                .unwrap_or_else(PoisonError::into_inner);
        }
        self.take(&mut count)
    }

    /// Takes a place only if `make`, run under the lock, produces something
    /// to put in it: the poller accepts a connection only when it has a
    /// place for it, so the others stay in the kernel's backlog.
    pub(crate) fn reserve_with<T>(
        &self,
        make: impl FnOnce() -> Option<T>,
    ) -> Result<Option<T>, Reserve> {
        let mut count = self.lock();
        if count.closed {
            return Err(Reserve::Closed);
        }
        if count.open >= self.max {
            return Err(Reserve::Full);
        }
        let made = make();
        if made.is_some() {
            self.take(&mut count);
        }
        Ok(made)
    }

    pub(crate) fn release(&self) {
        let mut count = self.lock();
        debug_assert!(count.open > 0, "released more places than reserved");
        count.open = count.open.saturating_sub(1);
        self.changed(&count);
        self.room.notify_one();
    }

    /// Refuses every later reservation and wakes every waiter.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.room.notify_all();
    }

    fn take(&self, count: &mut Count) -> Reserve {
        if count.closed {
            Reserve::Closed
        } else if count.open >= self.max {
            Reserve::Full
        } else {
            count.open += 1;
            self.changed(count);
            Reserve::Taken
        }
    }

    /// Runs with the lock held so hook calls arrive in the order of the
    /// changes.
    fn changed(&self, count: &Count) {
        self.open.store(count.open, Ordering::Release);
        if let Some(hook) = &self.hook {
            hook.call(count.open);
        }
    }

    fn lock(&self) -> MutexGuard<'_, Count> {
        // A panicking load hook poisons the lock; the count itself is still
        // consistent, so keep going.
        self.count.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{mpsc, Arc};
    use std::time::Duration;

    #[test]
    fn reserves_up_to_the_cap_then_reports_full() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let load = Load::new(2, Some(LoadHook::new(move |n| log.lock().unwrap().push(n))));
        assert_eq!(load.try_reserve(), Reserve::Taken);
        assert_eq!(load.try_reserve(), Reserve::Taken);
        assert!(!load.has_capacity());
        assert_eq!(load.try_reserve(), Reserve::Full);
        load.release();
        assert_eq!(load.open(), 1);
        assert!(load.has_capacity());
        assert_eq!(*seen.lock().unwrap(), vec![1, 2, 1]);
    }

    #[test]
    fn reserve_with_takes_a_place_only_for_something() {
        let load = Load::new(1, None);
        assert_eq!(load.reserve_with(|| None::<u8>), Ok(None));
        assert_eq!(load.open(), 0);
        assert_eq!(load.reserve_with(|| Some(7)), Ok(Some(7)));
        assert_eq!(load.open(), 1);
        let mut called = false;
        let full = load.reserve_with(|| {
            called = true;
            Some(8)
        });
        assert_eq!(full, Err(Reserve::Full));
        assert!(!called, "nothing is taken from the backlog when full");
    }

    #[test]
    fn a_waiting_reservation_gets_the_released_place() {
        let load = Arc::new(Load::new(1, None));
        assert_eq!(load.try_reserve(), Reserve::Taken);
        let (tx, rx) = mpsc::channel();
        let waiter = Arc::clone(&load);
        let thread = std::thread::spawn(move || tx.send(waiter.reserve_waiting()).unwrap());
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        load.release();
        let got = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(got, Reserve::Taken);
        assert_eq!(load.open(), 1);
        thread.join().unwrap();
    }

    #[test]
    fn closing_wakes_waiters_and_refuses_everyone() {
        let load = Arc::new(Load::new(1, None));
        assert_eq!(load.try_reserve(), Reserve::Taken);
        let waiter = Arc::clone(&load);
        let thread = std::thread::spawn(move || waiter.reserve_waiting());
        load.close();
        assert_eq!(thread.join().unwrap(), Reserve::Closed);
        load.release();
        assert_eq!(load.try_reserve(), Reserve::Closed);
    }
}
