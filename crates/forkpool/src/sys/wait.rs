//! Waiting on a child's listeners and its back-channel at once (`epoll`),
//! for the `shared` and `herd` dispatch modes, where children accept by
//! themselves.

use std::os::fd::BorrowedFd;

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

/// What woke a [`ListenerWait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woken {
    /// The back-channel has a message.
    Channel,
    /// The listener at this index has a connection (or had: another child
    /// may take it first).
    Listener(usize),
}

/// One epoll set: the channel, and every listener.
pub struct ListenerWait {
    epoll: Epoll,
    events: [EpollEvent; 8],
}

/// The channel's token: no listener index reaches it.
const CHANNEL: u64 = u64::MAX;

impl ListenerWait {
    /// Watches `channel` and `listeners` (in order: a listener's index is
    /// its place here). With `exclusive`, the kernel wakes one waiting
    /// child per connection (`EPOLLEXCLUSIVE`); without, every child.
    pub fn new<'a>(
        channel: BorrowedFd<'_>,
        listeners: impl IntoIterator<Item = BorrowedFd<'a>>,
        exclusive: bool,
    ) -> Result<ListenerWait, String> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)
            .map_err(|e| format!("epoll_create failed: {e}"))?;
        epoll
            .add(channel, EpollEvent::new(EpollFlags::EPOLLIN, CHANNEL))
            .map_err(|e| format!("epoll_ctl on the channel failed: {e}"))?;
        let mut flags = EpollFlags::EPOLLIN;
        if exclusive {
            flags |= EpollFlags::EPOLLEXCLUSIVE;
        }
        for (i, listener) in listeners.into_iter().enumerate() {
            epoll
                .add(listener, EpollEvent::new(flags, i as u64))
                .map_err(|e| format!("epoll_ctl on listener {i} failed: {e}"))?;
        }
        Ok(ListenerWait {
            epoll,
            events: [EpollEvent::empty(); 8],
        })
    }

    /// Sleeps until something is ready and puts what into `woken`
    /// (emptied first). `EINTR` is returned as is, for the caller to retry.
    pub fn wait(&mut self, woken: &mut Vec<Woken>) -> Result<(), Errno> {
        woken.clear();
        let n = self.epoll.wait(&mut self.events, EpollTimeout::NONE)?;
        woken.extend(self.events[..n].iter().map(|event| match event.data() {
            CHANNEL => Woken::Channel,
            i => Woken::Listener(i as usize),
        }));
        // The supervisor first: a quit, or an order to become the template,
        // goes before another connection, however busy the listeners are.
        if let Some(at) = woken.iter().position(|w| *w == Woken::Channel) {
            woken.swap(0, at);
        }
        Ok(())
    }
}
