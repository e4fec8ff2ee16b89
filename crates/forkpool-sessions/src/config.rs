//! The knobs of a session pool, their defaults, and validation that names
//! the fix.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A configuration value that cannot work, with the field and the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The offending field, as spelled in config files (`max_spare`).
    pub field: &'static str,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

/// The most worker threads one pool may have; far above any sensible value,
/// it only catches typos.
pub const MAX_WORKERS: usize = 1024;

/// The longest pool name: thread names are `<name>-w<i>`, and Linux keeps
/// only 15 bytes of a thread name.
pub const MAX_NAME_LEN: usize = 9;

/// What the pool does with a new connection while it already holds
/// [`SessionConfig::max_sessions`] sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CapPolicy {
    /// Take no more connections until a session closes: a served listener is
    /// not accepted from, so new peers wait in the kernel's listen backlog,
    /// and [`SessionPool::add`](super::SessionPool::add) blocks its caller.
    /// Right for a preforked child, whose supervisor should send the work to
    /// a less loaded sibling instead.
    #[default]
    Backlog,
    /// Accept the connection, let [`Session::refuse`](super::Session::refuse)
    /// write a short explanation, and close it. Right when a quick "busy, try
    /// later" beats a peer waiting without a word.
    Refuse,
}

/// A function told the number of open sessions each time it changes, so a
/// preforked child can report its load to its supervisor.
///
/// It is called on whichever pool thread changed the count, with the pool's
/// load lock held so that calls arrive in order: keep it short (store a
/// number, send a message), and do not call
/// [`SessionPool::add`](super::SessionPool::add) from it.
#[derive(Clone)]
pub struct LoadHook(Arc<dyn Fn(usize) + Send + Sync>);

impl LoadHook {
    /// Wraps a callback.
    pub fn new(hook: impl Fn(usize) + Send + Sync + 'static) -> Self {
        LoadHook(Arc::new(hook))
    }

    /// Calls the callback with the number of open sessions (the pool does;
    /// a wrapper that chains hooks does too).
    pub fn call(&self, open_sessions: usize) {
        (self.0)(open_sessions)
    }
}

impl fmt::Debug for LoadHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LoadHook(..)")
    }
}

/// Everything a [`SessionPool`](super::SessionPool) needs to know.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Worker threads that run session steps and take turns watching the
    /// waiting sessions; the pool has no other thread. Fixed for the pool's
    /// life: it never grows with the number of sessions.
    pub workers: usize,
    /// The most sessions open at once, idle or not.
    pub max_sessions: usize,
    /// What happens to a connection beyond `max_sessions`.
    pub cap_policy: CapPolicy,
    /// Close a session that has waited this long for its peer. `None` lets
    /// idle sessions stay forever.
    pub idle_timeout: Option<Duration>,
    /// Names the pool's threads (`<name>-w0`, `<name>-w1`, ...) and its log
    /// lines. At most [`MAX_NAME_LEN`] bytes.
    pub name: String,
    /// Told the open-session count whenever it changes.
    pub on_load: Option<LoadHook>,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            workers: 4,
            max_sessions: 1024,
            cap_policy: CapPolicy::Backlog,
            idle_timeout: Some(Duration::from_secs(300)),
            name: "sessions".to_string(),
            on_load: None,
        }
    }
}

fn error(field: &'static str, message: String) -> Result<(), ConfigError> {
    Err(ConfigError { field, message })
}

impl SessionConfig {
    /// Checks that the settings can work; the error names the field and what
    /// to change.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.workers == 0 || self.workers > MAX_WORKERS {
            return error(
                "workers",
                format!(
                    "workers is {}; it must be between 1 and {MAX_WORKERS}",
                    self.workers
                ),
            );
        }
        if self.max_sessions == 0 {
            return error(
                "max_sessions",
                "max_sessions must be at least 1".to_string(),
            );
        }
        if self.idle_timeout == Some(Duration::ZERO) {
            return error(
                "idle_timeout",
                "idle_timeout of zero would close every session at once; use None to disable it"
                    .to_string(),
            );
        }
        if self.name.is_empty()
            || self.name.len() > MAX_NAME_LEN
            || !self.name.bytes().all(|b| b.is_ascii_graphic())
        {
            return error(
                "name",
                format!(
                    "name {:?} must be 1 to {MAX_NAME_LEN} printable ASCII characters without spaces",
                    self.name
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid(change: impl FnOnce(&mut SessionConfig)) -> ConfigError {
        let mut config = SessionConfig::default();
        change(&mut config);
        config.validate().expect_err("config should be rejected")
    }

    #[test]
    fn default_is_valid() {
        SessionConfig::default().validate().unwrap();
    }

    #[test]
    fn bad_values_name_their_field() {
        assert_eq!(invalid(|c| c.workers = 0).field, "workers");
        assert_eq!(invalid(|c| c.workers = MAX_WORKERS + 1).field, "workers");
        assert_eq!(invalid(|c| c.max_sessions = 0).field, "max_sessions");
        assert_eq!(
            invalid(|c| c.idle_timeout = Some(Duration::ZERO)).field,
            "idle_timeout"
        );
        assert_eq!(invalid(|c| c.name = String::new()).field, "name");
        assert_eq!(invalid(|c| c.name = "much-too-long".into()).field, "name");
        assert_eq!(invalid(|c| c.name = "a b".into()).field, "name");
    }
}
