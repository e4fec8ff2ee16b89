//! Signals: handlers only set a flag and write a byte to a pipe; the loop
//! reads the pipe, looks at the flags and does the real work. Nothing in a
//! handler touches the scoreboard (the lesson of spamd's bug 5422).

use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use signal_hook::consts::{SIGCHLD, SIGINT, SIGQUIT, SIGTERM};

/// The flags the handlers set.
pub(crate) struct Signals {
    terminate: Arc<AtomicBool>,
    interrupts: Arc<AtomicUsize>,
    quit: Arc<AtomicBool>,
    child_exited: Arc<AtomicBool>,
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
            wake_write: Some(write),
            wake_read: Some(read),
        };
        signal_hook::flag::register(SIGTERM, Arc::clone(&signals.terminate))?;
        signal_hook::flag::register(SIGQUIT, Arc::clone(&signals.quit))?;
        signal_hook::flag::register(SIGCHLD, Arc::clone(&signals.child_exited))?;
        let interrupts = Arc::clone(&signals.interrupts);
        // SAFETY: the closure only does an atomic add, which is
        // async-signal-safe.
        unsafe {
            signal_hook::low_level::register(SIGINT, move || {
                interrupts.fetch_add(1, Ordering::SeqCst);
            })
        }?;
        let write = signals.wake_write.as_ref().expect("set above");
        for sig in [SIGTERM, SIGINT, SIGQUIT, SIGCHLD] {
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

    /// SIGCHLD arrived since the last call.
    pub fn take_child_exited(&self) -> bool {
        self.child_exited.swap(false, Ordering::SeqCst)
    }
}

impl SignalPipe {
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
