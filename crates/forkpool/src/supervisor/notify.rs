//! systemd's readiness protocol (`sd_notify`), when `NOTIFY_SOCKET` is set:
//! `READY=1` once the first children are ready, `STATUS=` with the
//! scoreboard line, `RELOADING=1` around a SIGHUP, `STOPPING=1` on shutdown.
//! Without `NOTIFY_SOCKET` every call here does nothing.

use sd_notify::NotifyState;
use tracing::debug;

use super::Supervisor;

fn send(states: &[NotifyState]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    if let Err(e) = sd_notify::notify(states) {
        debug!("sd_notify failed: {e}");
    }
}

/// `READY=1`.
pub fn ready() {
    send(&[NotifyState::Ready]);
}

/// `MAINPID=` this process: a new supervisor taking over after an upgrade.
pub fn main_pid() {
    send(&[NotifyState::MainPid(std::process::id())]);
}

/// `RELOADING=1` with the monotonic timestamp systemd asks for.
pub fn reloading() {
    match sd_notify::NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now]),
        Err(_) => send(&[NotifyState::Reloading]),
    }
}

/// `STOPPING=1`.
pub fn stopping() {
    send(&[NotifyState::Stopping]);
}

/// `READY=1` with a `STATUS=` line: the end of a reload, done or failed.
pub fn ready_with_status(line: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(line)]);
}

/// `STATUS=child states: ...`.
pub fn status(line: &str) {
    send(&[NotifyState::Status(&format!("child states: {line}"))]);
}

impl Supervisor {
    /// Tells systemd the service is up once `min_children` are ready (or at
    /// least one, for a pool that may start empty).
    pub(super) fn notify_ready_once(&mut self) {
        if self.notify.told_ready {
            return;
        }
        let counts = self.core.board().counts();
        if ready_at(counts.idle + counts.busy, self.core.config().min_children) {
            self.notify.told_ready = true;
            ready();
            self.tell_predecessor_ready();
            tracing::info!("pool ready");
        }
    }
}

/// What the supervisor keeps of systemd's side.
pub(super) struct Notify {
    /// Whether systemd has been told the pool is ready.
    pub told_ready: bool,
    /// systemd's watchdog, when the unit asks for one.
    pub watchdog: Option<super::watchdog::Watchdog>,
}

/// Whether a pool of `min_children` with `serving` children ready is
/// ready: all of them, or one for a pool that may start empty.
fn ready_at(serving: u32, min_children: u32) -> bool {
    serving >= min_children.max(1)
}

#[cfg(test)]
mod tests {
    use super::ready_at;

    #[test]
    fn a_pool_is_ready_with_its_minimum_or_one_child() {
        assert!(!ready_at(2, 3));
        assert!(ready_at(3, 3));
        assert!(!ready_at(0, 0));
        assert!(ready_at(1, 0));
    }
}
