//! Signals: handlers only set a flag and write a byte to a pipe; the loop
//! reads the pipe, looks at the flags and does the real work. Nothing in a
//! handler touches the scoreboard (the lesson of spamd's bug 5422).

use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use signal_hook::consts::{SIGCHLD, SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGTTIN, SIGTTOU, SIGUSR2};

/// The flags the handlers set.
pub(crate) struct Signals {
    terminate: Arc<AtomicBool>,
    interrupts: Arc<AtomicUsize>,
    quit: Arc<AtomicBool>,
    child_exited: Arc<AtomicBool>,
    reload: Arc<AtomicBool>,
    upgrade: Arc<AtomicBool>,
    more_spare: Arc<AtomicUsize>,
    fewer_spare: Arc<AtomicUsize>,
    wake_write: Option<OwnedFd>,
    wake_read: Option<UnixStream>,
}

/// The read end of the self-pipe, watched by the event loop.
pub(crate) struct SignalPipe {
    read: UnixStream,
}

impl Signals {
    /// Installs the handlers.
    pub fn register() -> io::Result<Signals> {
        let (read, write) = UnixStream::pair()?;
        read.set_nonblocking(true)?;
        write.set_nonblocking(true)?;
        let write: OwnedFd = write.into();
        let signals = Signals {
            terminate: Arc::new(AtomicBool::new(false)),
            interrupts: Arc::new(AtomicUsize::new(0)),
            quit: Arc::new(AtomicBool::new(false)),
            child_exited: Arc::new(AtomicBool::new(false)),
            reload: Arc::new(AtomicBool::new(false)),
            upgrade: Arc::new(AtomicBool::new(false)),
            more_spare: Arc::new(AtomicUsize::new(0)),
            fewer_spare: Arc::new(AtomicUsize::new(0)),
            wake_write: Some(write),
            wake_read: Some(read),
        };
        signal_hook::flag::register(SIGTERM, Arc::clone(&signals.terminate))?;
        signal_hook::flag::register(SIGQUIT, Arc::clone(&signals.quit))?;
        signal_hook::flag::register(SIGCHLD, Arc::clone(&signals.child_exited))?;
        signal_hook::flag::register(SIGHUP, Arc::clone(&signals.reload))?;
        signal_hook::flag::register(SIGUSR2, Arc::clone(&signals.upgrade))?;
        count_signal(SIGINT, &signals.interrupts)?;
        count_signal(SIGTTIN, &signals.more_spare)?;
        count_signal(SIGTTOU, &signals.fewer_spare)?;
        let write = signals.wake_write.as_ref().expect("set above");
        for sig in [
            SIGTERM, SIGINT, SIGQUIT, SIGCHLD, SIGHUP, SIGUSR2, SIGTTIN, SIGTTOU,
        ] {
            signal_hook::low_level::pipe::register_raw(sig, write.try_clone()?)?;
        }
        Ok(signals)
    }

    /// The pipe to watch; callable once.
    pub fn pipe(&self) -> io::Result<SignalPipe> {
        let read = self
            .wake_read
            .as_ref()
            .ok_or_else(|| io::Error::other("signal pipe already taken"))?
            .try_clone()?;
        Ok(SignalPipe { read })
    }

    /// SIGTERM arrived since the last call.
    pub fn take_terminate(&self) -> bool {
        self.terminate.swap(false, Ordering::SeqCst)
    }

    /// SIGQUIT arrived since the last call.
    pub fn take_quit(&self) -> bool {
        self.quit.swap(false, Ordering::SeqCst)
    }

    /// How many SIGINTs arrived since the last call.
    pub fn take_interrupts(&self) -> usize {
        self.interrupts.swap(0, Ordering::SeqCst)
    }

    /// SIGHUP arrived since the last call.
    pub fn take_reload(&self) -> bool {
        self.reload.swap(false, Ordering::SeqCst)
    }

    /// SIGUSR2 arrived since the last call.
    pub fn take_upgrade(&self) -> bool {
        self.upgrade.swap(false, Ordering::SeqCst)
    }

    /// SIGTTIN count minus SIGTTOU count since the last call.
    pub fn take_spare_change(&self) -> i64 {
        let up = self.more_spare.swap(0, Ordering::SeqCst) as i64;
        let down = self.fewer_spare.swap(0, Ordering::SeqCst) as i64;
        up - down
    }

    /// SIGCHLD arrived since the last call.
    pub fn take_child_exited(&self) -> bool {
        self.child_exited.swap(false, Ordering::SeqCst)
    }
}

/// Counts deliveries of `sig` in `counter`.
fn count_signal(sig: i32, counter: &Arc<AtomicUsize>) -> io::Result<()> {
    crate::sys::signal::count_deliveries(sig, Arc::clone(counter))
}

impl SignalPipe {
    /// Waits up to `pause` for a signal, in `poll` on the pipe: the loop's
    /// one pause that is not its main poll (`REPORT_BATCH`) ends at once
    /// when a signal comes. Returns whether one did.
    pub fn wait(&self, pause: std::time::Duration) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use std::os::fd::AsFd;
        let timeout = PollTimeout::try_from(pause).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(self.read.as_fd(), PollFlags::POLLIN)];
        matches!(poll(&mut fds, timeout), Ok(n) if n > 0)
    }

    /// Empties the pipe so the next signal wakes the loop again.
    pub fn drain(&mut self) {
        let mut buf = [0u8; 64];
        while matches!(self.read.read(&mut buf), Ok(n) if n > 0) {}
    }
}

impl AsRawFd for SignalPipe {
    fn as_raw_fd(&self) -> RawFd {
        self.read.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::Duration;

    #[test]
    fn a_pause_ends_when_a_signal_is_waiting() {
        let (read, mut write) = UnixStream::pair().unwrap();
        read.set_nonblocking(true).unwrap(); // as `register` sets it
        let mut pipe = SignalPipe { read };
        assert!(!pipe.wait(Duration::ZERO), "nothing waiting yet");
        write.write_all(&[1]).unwrap();
        // Far longer than any test may wait: it must return at once.
        assert!(pipe.wait(Duration::from_secs(600)));
        pipe.drain();
        assert!(!pipe.wait(Duration::ZERO), "drained");
    }
}
