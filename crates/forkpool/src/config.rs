//! Every knob of a pool, its default, and validation that names the fix.
//!
//! A [`PoolConfig`] is plain data: build it, call [`PoolConfig::validate`],
//! then hand it to the supervisor. Nothing here touches a process or socket.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How a new connection reaches a child.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DispatchMode {
    /// The supervisor accepts and passes the connection's descriptor to the
    /// lowest-numbered idle child over its back-channel (`SCM_RIGHTS`).
    /// What [`DispatchMode::Kernel`] falls back to.
    Handoff,
    /// Children hold the listeners; the supervisor orders the lowest-numbered
    /// idle child to accept one connection (SpamAssassin spamd's scheme).
    Order,
    /// Children wait on the listeners themselves, one woken per connection
    /// (`EPOLLEXCLUSIVE`); the supervisor only scales. No hot-child ordering.
    Shared,
    /// The kernel picks: each slot has its own listening socket in the
    /// listener's `SO_REUSEPORT` group, and an eBPF program gives each new
    /// connection to the lowest-numbered idle child's socket (or, with none
    /// idle, to the supervisor's, which hands it on as in `Handoff`). Needs
    /// Linux 5.12+ and `CAP_BPF`; where it cannot run, or for children it
    /// does not serve yet (many-connection children), the pool falls back
    /// to `Handoff` and says why. The default.
    #[default]
    Kernel,
    /// Like `Shared` but every child polls the listeners non-exclusively, so
    /// every connection wakes every idle child. Exists only so the benchmark
    /// can show the thundering herd the other modes avoid: only built with
    /// the `herd` cargo feature, which the `forkpool-bench` crate enables.
    #[cfg(feature = "herd")]
    Herd,
    /// For exec'd programs that speak no protocol and only know systemd
    /// socket activation: each worker gets the listeners (`LISTEN_FDS`) and
    /// accepts on them itself; there is no back-channel. The supervisor
    /// cannot tell an idle worker from a busy one, so the pool is fixed at
    /// `min_children` and does not scale; it only restarts workers that die
    /// and stops them with SIGTERM, then SIGKILL after `shutdown_timeout`.
    /// Only [`Pool::run_command`](crate::Pool::run_command) accepts it.
    None,
}

impl DispatchMode {
    /// The name used on the command line and in config files.
    pub fn name(self) -> &'static str {
        match self {
            DispatchMode::Handoff => "handoff",
            DispatchMode::Order => "order",
            DispatchMode::Shared => "shared",
            DispatchMode::Kernel => "kernel",
            #[cfg(feature = "herd")]
            DispatchMode::Herd => "herd",
            DispatchMode::None => "none",
        }
    }

    /// Whether the supervisor watches the listeners (`handoff`, `order`,
    /// and `kernel`, where its listener takes what no idle child could).
    pub fn parent_watches_listeners(self) -> bool {
        matches!(
            self,
            DispatchMode::Handoff | DispatchMode::Order | DispatchMode::Kernel
        )
    }

    /// Whether children receive the listening sockets.
    pub fn children_hold_listeners(self) -> bool {
        !matches!(self, DispatchMode::Handoff)
    }

    /// Whether children speak the back-channel protocol (every mode but
    /// `none`).
    pub fn speaks_protocol(self) -> bool {
        !matches!(self, DispatchMode::None)
    }
}

impl fmt::Display for DispatchMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DispatchMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "handoff" => Ok(DispatchMode::Handoff),
            "order" => Ok(DispatchMode::Order),
            "shared" => Ok(DispatchMode::Shared),
            "kernel" => Ok(DispatchMode::Kernel),
            #[cfg(feature = "herd")]
            "herd" => Ok(DispatchMode::Herd),
            "none" => Ok(DispatchMode::None),
            other => Err(format!(
                "unknown dispatch mode '{other}': use handoff, order, shared or kernel \
                 (or none, for `forkpool run` programs that speak no protocol)"
            )),
        }
    }
}

/// The settings of one pool.
///
/// The defaults suit a modern machine running a blocking handler: two warm
/// children at rest, room to grow to 64 under load (each child is one
/// process, so the ceiling is a memory budget, not a CPU count), and spare
/// bounds wide enough that a steady load does not cause spawn/retire churn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolConfig {
    /// Never fewer children than this, even when all are idle. Default 2.
    pub min_children: u32,
    /// Never more live children than this; beyond it connections wait in the
    /// kernel's listen backlog. Default 64.
    pub max_children: u32,
    /// Spawn children while fewer than this many are idle. Default 2.
    pub min_spare: u32,
    /// Retire the highest-numbered idle children while more than this many
    /// have been idle for `retire_grace`. Default 8.
    pub max_spare: u32,
    /// A child that has served this many connections is replaced after its
    /// current one; 0 means never. Default 0.
    pub max_requests_per_child: u64,
    /// How often an idle child is pinged. Default 5 s.
    #[serde(with = "humantime_serde_compat")]
    pub ping_interval: Duration,
    /// A child that has not answered a ping after this long is killed and
    /// replaced; an accept order (`order` dispatch) must be answered within
    /// it too. Default 5 s: an idle child that is merely waiting for a CPU
    /// on a saturated machine answers well within it (see
    /// `docs/operations.md`, "Deadlines").
    #[serde(with = "humantime_serde_compat")]
    pub ping_timeout: Duration,
    /// A new child (or a `preload` template) must say `Ready` within this
    /// of being started, and a template must answer a fork order within it.
    /// Default 60 s: a large application's imports and set-up (a spam
    /// filter compiling its rule set, a framework loading its plugins) take
    /// seconds, more on a loaded machine.
    #[serde(with = "humantime_serde_compat")]
    pub start_timeout: Duration,
    /// A child that closed its back-channel (it is on its way out, asked
    /// or not), or a template told to quit or that closed its channel,
    /// must have exited this long after; then it is killed and counted as
    /// `exit_timeout`. Default 10 s: tearing down a large interpreter heap
    /// takes seconds (Perl frees a 250 MB heap in about 0.5 s on an idle
    /// machine, 2 s on a saturated one, and a 2.5 GB heap in 7 s). Never
    /// extends a stop: a child told to quit keeps the earlier of this and
    /// its `shutdown_timeout`.
    #[serde(with = "humantime_serde_compat")]
    pub exit_timeout: Duration,
    /// On shutdown, busy children get this long to finish before SIGKILL.
    /// Default 30 s.
    #[serde(with = "humantime_serde_compat")]
    pub shutdown_timeout: Duration,
    /// A child busy on one connection longer than this is killed and
    /// replaced; zero means no limit. Default 0 (off): a keep-alive or
    /// long-polling handler is legitimately busy for long, so only the
    /// operator knows the right bound.
    #[serde(with = "humantime_serde_compat")]
    pub busy_timeout: Duration,
    /// Surplus idle children must last this long before any is retired, so a
    /// bursty load does not make the pool flap. Default 1 s.
    #[serde(with = "humantime_serde_compat")]
    pub retire_grace: Duration,
    /// At most this many children are started per scaling round; the rate
    /// doubles each round the pool is still short, from 1 up to this cap
    /// (Apache's idle-spawn-rate ramp). Also the most replacements a
    /// second for workers that had started and died (a burst of this many,
    /// then this many a second: `policy::backoff`). Default 32.
    pub max_spawn_rate: u32,
    /// How connections reach children. Default `handoff`.
    pub dispatch: DispatchMode,
    /// The `listen()` backlog of sockets the pool binds. Default 1024.
    pub backlog: u32,
    /// `TCP_DEFER_ACCEPT` on the pool's TCP listeners: a connection reaches
    /// the pool only once the client has sent its first bytes, or after
    /// about this long without any. The connection then needs one wake-up
    /// less, because its request is already there when a child reads it.
    /// Whole seconds; zero turns it off. Default 0 (off): a protocol where
    /// the server speaks first (SMTP, a greeting line) must leave it off,
    /// or each connection waits this long for its greeting. Apache httpd
    /// turns it on for HTTP (`AcceptFilter http data`).
    #[serde(with = "humantime_serde_compat")]
    pub defer_accept: Duration,
    /// Spread `max_requests_per_child`: each child gets a limit of
    /// `max_requests_per_child` plus a random 0..=N, so children started
    /// together do not all restart together. Default 0.
    pub max_requests_jitter: u64,
    /// A child whose unshared memory (USS, from `/proc/PID/smaps_rollup`)
    /// is above this many bytes is replaced after its current connection;
    /// 0 means no limit. In `kernel` dispatch the child checks it itself
    /// after each connection, before it goes idle. In a config file: a
    /// number of bytes or a size such as `"512MiB"`. Default 0.
    #[serde(with = "size_serde")]
    pub max_child_memory: u64,
    /// A child older than this is replaced after its current connection
    /// (each child gets up to a tenth more, at random, so a pool started at
    /// once does not restart at once); zero means no limit. In `kernel`
    /// dispatch the child checks it itself after each connection, before it
    /// goes idle. Default 0.
    #[serde(with = "humantime_serde_compat")]
    pub max_child_lifetime: Duration,
    /// A child busy on one connection longer than this is captured (its
    /// stack and where it waits in the kernel) and logged, without being
    /// stopped; zero means off. Default 0.
    #[serde(with = "humantime_serde_compat")]
    pub slow_threshold: Duration,
    /// On `TERM`/`INT` (or a `USR2` hand-over), report `drain` on the agent
    /// port and `503` on `/ready` for this long while still serving
    /// normally, so the balancer stops sending first; then stop (or hand
    /// over) as usual. Only when an agent port or the metrics address is
    /// served; a second `TERM`/`INT` skips the rest. Default 0 (off).
    #[serde(with = "humantime_serde_compat")]
    pub drain_delay: Duration,
    /// `/ready` answers `503` while the pool is saturated (every child it
    /// may have is busy or starting), so the balancer sends new work
    /// elsewhere until a child frees. Default false.
    pub ready_unless_saturated: bool,
    /// Hold the pool, short of spare children, while its busy children
    /// already wait for the CPUs (see `policy/scaling.rs`): a child more
    /// would only take turns with them on the same CPUs, so the connection
    /// waits in the backlog for the next child to finish instead. Only
    /// while children keep finishing connections: behind long requests the
    /// pool grows one child at a time, so a short request does not wait
    /// for them. Default true; false grows the pool whenever it is short
    /// of spare children, as Apache does.
    pub hold_when_cpu_bound: bool,
    /// On a graceful stop, first accept and serve the connections already
    /// queued in the listen backlog (and any parked), within
    /// `shutdown_timeout`, then close the listeners. Not done for listeners
    /// from systemd socket activation, which outlive the pool. Default true.
    pub serve_backlog_on_stop: bool,
    /// Start the worker program once as a *template* and fork every worker
    /// from it, so what the program loads before it serves is loaded once
    /// and shared copy-on-write (`forkpool run --preload`; see
    /// `docs/workers.md`, "Preloading"). Only for
    /// [`Pool::run_command`](crate::Pool::run_command) with a dispatch mode
    /// that speaks the protocol. Default false.
    pub preload: bool,
    /// With `preload`: each time the lowest slot's worker has served this
    /// many connections, it becomes the template and the pool rolls onto
    /// workers forked from it, so what real traffic warmed is shared too
    /// (refork). Increasing thresholds, one refork each. Default empty
    /// (never).
    pub refork_after: Vec<u64>,
    /// Let the kernel merge the children's identical private pages (its
    /// same-page merging, KSM): the supervisor marks itself with
    /// `prctl(PR_SET_MEMORY_MERGE)`, which every child it starts inherits.
    /// For interpreters whose reference counts write, copy-on-write, to
    /// most of what a template shared, and put most of it back as it was
    /// (docs/operations.md, *Merging the children's pages*). Needs Linux
    /// 6.7 or later, and `ksmd` running (`/sys/kernel/mm/ksm/run` = 1).
    /// Default false.
    pub merge_pages: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            min_children: 2,
            max_children: 64,
            min_spare: 2,
            max_spare: 8,
            max_requests_per_child: 0,
            ping_interval: Duration::from_secs(5),
            ping_timeout: Duration::from_secs(5),
            start_timeout: Duration::from_secs(60),
            exit_timeout: Duration::from_secs(10),
            shutdown_timeout: Duration::from_secs(30),
            busy_timeout: Duration::ZERO,
            retire_grace: Duration::from_secs(1),
            max_spawn_rate: 32,
            dispatch: DispatchMode::Kernel,
            backlog: 1024,
            defer_accept: Duration::ZERO,
            max_requests_jitter: 0,
            max_child_memory: 0,
            max_child_lifetime: Duration::ZERO,
            slow_threshold: Duration::ZERO,
            drain_delay: Duration::ZERO,
            ready_unless_saturated: false,
            hold_when_cpu_bound: true,
            serve_backlog_on_stop: true,
            preload: false,
            refork_after: Vec::new(),
            merge_pages: false,
        }
    }
}

/// The largest pool forkpool manages; a guard against a typo like
/// `max_children = 1000000` forking the machine to death.
pub const MAX_CHILDREN_LIMIT: u32 = 4096;

/// The longest `defer_accept`: beyond it a silent client is held for
/// minutes, which no protocol wants.
pub const MAX_DEFER_ACCEPT: Duration = Duration::from_secs(600);

/// The longest `drain_delay`: a balancer checks every few seconds, so
/// minutes of draining only delay a stop.
pub const MAX_DRAIN_DELAY: Duration = Duration::from_secs(300);

/// A configuration value that cannot work, with the field and the fix
/// (the same type the session pool's settings use).
pub use forkpool_sessions::ConfigError;

fn error(field: &'static str, message: String) -> Result<(), ConfigError> {
    Err(ConfigError { field, message })
}

impl PoolConfig {
    /// Checks that the settings can work together; the error names the field
    /// and what to change.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_pool_size()?;
        self.validate_timing()?;
        self.validate_limits()?;
        self.validate_preload()
    }

    /// How many children, spare children and spawns a second.
    fn validate_pool_size(&self) -> Result<(), ConfigError> {
        if self.max_children == 0 {
            return error(
                "max_children",
                "max_children must be at least 1".to_string(),
            );
        }
        if self.max_children > MAX_CHILDREN_LIMIT {
            return error(
                "max_children",
                format!(
                    "max_children {} is above the limit of {MAX_CHILDREN_LIMIT}; lower it",
                    self.max_children
                ),
            );
        }
        if self.min_children > self.max_children {
            return error(
                "min_children",
                format!(
                    "min_children {} is above max_children {}; lower min_children or raise max_children",
                    self.min_children, self.max_children
                ),
            );
        }
        if self.dispatch == DispatchMode::None && self.min_children == 0 {
            return error(
                "min_children",
                "dispatch 'none' runs a fixed pool of min_children workers, and \
                 min_children is 0; set it to the number of workers wanted"
                    .to_string(),
            );
        }
        if self.min_spare > self.max_spare {
            return error(
                "min_spare",
                format!(
                    "min_spare {} is above max_spare {}; lower min_spare or raise max_spare",
                    self.min_spare, self.max_spare
                ),
            );
        }
        if self.min_spare > self.max_children {
            return error(
                "min_spare",
                format!(
                    "min_spare {} is above max_children {}; the pool could never keep that many idle",
                    self.min_spare, self.max_children
                ),
            );
        }
        if self.max_spawn_rate == 0 {
            return error(
                "max_spawn_rate",
                "max_spawn_rate must be at least 1, or the pool could never grow".to_string(),
            );
        }
        Ok(())
    }

    /// Pings, draining and deferred accepts.
    fn validate_timing(&self) -> Result<(), ConfigError> {
        if self.ping_interval.is_zero() {
            return error(
                "ping_interval",
                "ping_interval must be longer than 0 (try 5s)".to_string(),
            );
        }
        if self.ping_timeout.is_zero() {
            return error(
                "ping_timeout",
                "ping_timeout must be longer than 0 (try 5s)".to_string(),
            );
        }
        if self.start_timeout.is_zero() {
            return error(
                "start_timeout",
                "start_timeout must be longer than 0 (try 60s)".to_string(),
            );
        }
        if self.exit_timeout.is_zero() {
            return error(
                "exit_timeout",
                "exit_timeout must be longer than 0: a child needs a moment between \
                 closing its channel and the kernel reporting its exit (try 10s)"
                    .to_string(),
            );
        }
        if self.drain_delay > MAX_DRAIN_DELAY {
            return error(
                "drain_delay",
                format!(
                    "drain_delay {:?} is above the limit of {}s; a few balancer check \
                     intervals are enough (try 5s)",
                    self.drain_delay,
                    MAX_DRAIN_DELAY.as_secs()
                ),
            );
        }
        if self.defer_accept.subsec_nanos() != 0 || self.defer_accept > MAX_DEFER_ACCEPT {
            return error(
                "defer_accept",
                format!(
                    "defer_accept must be whole seconds from 0 (off) to {}s, got {:?} (try 5s)",
                    MAX_DEFER_ACCEPT.as_secs(),
                    self.defer_accept
                ),
            );
        }
        Ok(())
    }

    /// Per-child recycling limits and the listen backlog.
    fn validate_limits(&self) -> Result<(), ConfigError> {
        if self.max_requests_jitter > 0 && self.max_requests_per_child == 0 {
            return error(
                "max_requests_jitter",
                "max_requests_jitter spreads max_requests_per_child, which is 0 (never); \
                 set max_requests_per_child too, or drop the jitter"
                    .to_string(),
            );
        }
        if self.max_child_memory > 0 && self.max_child_memory < MIN_CHILD_MEMORY {
            return error(
                "max_child_memory",
                format!(
                    "max_child_memory {} bytes is below {} (1MiB): every child would be \
                     replaced after each connection; write a size like 512MiB",
                    self.max_child_memory, MIN_CHILD_MEMORY
                ),
            );
        }
        if self.backlog == 0 {
            return error(
                "backlog",
                "backlog must be at least 1 (try 1024)".to_string(),
            );
        }
        Ok(())
    }

    /// Preloading and reforking.
    fn validate_preload(&self) -> Result<(), ConfigError> {
        if self.preload && !self.dispatch.speaks_protocol() {
            return error(
                "preload",
                "preload needs a dispatch mode that speaks the back-channel protocol \
                 (handoff, order or shared): a template is ordered to fork on it; \
                 drop preload or change dispatch"
                    .to_string(),
            );
        }
        if !self.refork_after.is_empty() && !self.preload {
            return error(
                "refork_after",
                "refork_after makes a warmed worker the template, and there is no \
                 template without preload; set preload too, or drop refork_after"
                    .to_string(),
            );
        }
        let increasing = self.refork_after.windows(2).all(|w| w[0] < w[1]);
        if self.refork_after.contains(&0) || !increasing {
            return error(
                "refork_after",
                format!(
                    "refork_after must be connection counts above 0, each larger than the \
                     one before (like 1000,10000), got {:?}",
                    self.refork_after
                ),
            );
        }
        Ok(())
    }
}

impl PoolConfig {
    /// [`validate`](PoolConfig::validate), plus what a pool whose children
    /// serve many connections at once
    /// ([`Pool::run_sessions`](crate::Pool::run_sessions)) needs: `handoff`
    /// dispatch, since the supervisor must count every connection it gives
    /// a child.
    pub fn validate_for_sessions(&self) -> Result<(), ConfigError> {
        self.validate()?;
        if !matches!(self.dispatch, DispatchMode::Handoff | DispatchMode::Kernel) {
            return error(
                "dispatch",
                format!(
                    "dispatch {} cannot serve children that hold many connections: the \
                     supervisor must count every connection it gives them; use handoff",
                    self.dispatch
                ),
            );
        }
        Ok(())
    }
}

/// The smallest `max_child_memory` accepted: below it the limit is
/// surely a unit mistake (bytes written for MiB).
pub const MIN_CHILD_MEMORY: u64 = 1 << 20;

/// Parses a size in bytes: a plain number, or a number with a unit
/// (`KiB`, `MiB`, `GiB`, `TiB` as powers of 1024, `kB`, `MB`, `GB`, `TB`
/// as powers of 1000, `K`/`M`/`G`/`T` as powers of 1024, `B`).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let bad = || format!("'{text}' is not a size; write it like 512MiB, 2GiB or 800MB");
    let number: u64 = number.parse().map_err(|_| bad())?;
    let multiplier: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KiB" | "k" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "T" | "TiB" => 1 << 40,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        _ => return Err(bad()),
    };
    number
        .checked_mul(multiplier)
        .ok_or_else(|| format!("'{text}' is too large"))
}

/// Serde glue so config files write sizes as `"512MiB"` or a number.
mod size_serde {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(*value)
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Bytes(u64),
        Text(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        match Size::deserialize(d)? {
            Size::Bytes(n) => Ok(n),
            Size::Text(t) => super::parse_size(&t).map_err(serde::de::Error::custom),
        }
    }
}

/// Parses a human duration such as `250ms`, `5s` or `1m 30s`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("'{text}' is not a duration ({e}); write it like 500ms, 5s or 2m"))
}

/// Serde glue so config files write durations as `"5s"`.
mod humantime_serde_compat {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*value).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_duration(&text).map_err(serde::de::Error::custom)
    }
}

/// The user and group children run as (see [`crate::Pool::run_children_as`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credentials {
    /// The user id.
    pub uid: u32,
    /// The group id (also the only supplementary group).
    pub gid: u32,
}

/// The limits a `kernel` dispatch child is given to check itself (none
/// in other modes, where the supervisor sees every connection end).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SelfLimits {
    /// `max_child_memory`: bytes of USS it may hold; 0: no limit.
    pub max_memory: u64,
    /// Its lifetime, counted from its start (its `K`); zero: no limit.
    pub lifetime: Duration,
}

impl SelfLimits {
    /// Whether there is nothing to check.
    pub fn is_none(&self) -> bool {
        self.max_memory == 0 && self.lifetime.is_zero()
    }

    /// The lifetime in whole milliseconds, rounded up (what
    /// `FORKPOOL_MAX_CHILD_LIFETIME_MS` says): a worker that leaves at
    /// that age is never younger than the lifetime it was drawn.
    pub fn lifetime_ms(&self) -> u64 {
        let ms = self.lifetime.as_nanos().div_ceil(1_000_000);
        u64::try_from(ms).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid(change: impl FnOnce(&mut PoolConfig)) -> ConfigError {
        let mut config = PoolConfig::default();
        change(&mut config);
        config.validate().expect_err("config should be rejected")
    }

    #[test]
    fn sizes_take_binary_and_decimal_units() {
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("800MB"), Ok(800_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size(" 1 G "), Ok(1 << 30));
        assert!(parse_size("12 parsecs").unwrap_err().contains("512MiB"));
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("99999999999TiB").is_err());
    }

    #[test]
    fn memory_and_jitter_limits_name_the_fix() {
        let e = invalid(|c| c.max_child_memory = 512);
        assert_eq!(e.field, "max_child_memory");
        assert!(e.message.contains("512MiB"), "{}", e.message);
        let e = invalid(|c| c.max_requests_jitter = 10);
        assert_eq!(e.field, "max_requests_jitter");
    }

    #[test]
    fn defaults_are_valid() {
        PoolConfig::default().validate().unwrap();
    }

    #[test]
    fn spare_bounds_inverted() {
        let err = invalid(|c| {
            c.min_spare = 8;
            c.max_spare = 4;
        });
        assert_eq!(err.field, "min_spare");
        assert!(err.to_string().contains("min_spare 8 is above max_spare 4"));
    }

    #[test]
    fn zero_max_children() {
        let err = invalid(|c| c.max_children = 0);
        assert_eq!(err.to_string(), "max_children must be at least 1");
    }

    #[test]
    fn max_children_above_limit() {
        let err = invalid(|c| c.max_children = MAX_CHILDREN_LIMIT + 1);
        assert_eq!(err.field, "max_children");
    }

    #[test]
    fn min_children_above_max() {
        let err = invalid(|c| {
            c.min_children = 10;
            c.max_children = 4;
        });
        assert_eq!(err.field, "min_children");
        assert!(err
            .to_string()
            .contains("min_children 10 is above max_children 4"));
    }

    #[test]
    fn min_spare_above_max_children() {
        let err = invalid(|c| {
            c.max_children = 2;
            c.min_children = 1;
            c.min_spare = 3;
            c.max_spare = 3;
        });
        assert_eq!(err.field, "min_spare");
        assert!(err.to_string().contains("above max_children 2"));
    }

    #[test]
    fn zero_spawn_rate() {
        assert_eq!(invalid(|c| c.max_spawn_rate = 0).field, "max_spawn_rate");
    }

    #[test]
    fn zero_ping_interval_and_timeout() {
        assert_eq!(
            invalid(|c| c.ping_interval = Duration::ZERO).field,
            "ping_interval"
        );
        assert_eq!(
            invalid(|c| c.ping_timeout = Duration::ZERO).field,
            "ping_timeout"
        );
    }

    #[test]
    fn zero_start_and_exit_timeouts_name_the_fix() {
        let e = invalid(|c| c.start_timeout = Duration::ZERO);
        assert_eq!(e.field, "start_timeout");
        assert!(e.message.contains("try 60s"), "{}", e.message);
        let e = invalid(|c| c.exit_timeout = Duration::ZERO);
        assert_eq!(e.field, "exit_timeout");
        assert!(e.message.contains("try 10s"), "{}", e.message);
        let short = PoolConfig {
            start_timeout: Duration::from_millis(1),
            exit_timeout: Duration::from_millis(1),
            ..PoolConfig::default()
        };
        assert!(short.validate().is_ok());
    }

    #[test]
    fn the_deadlines_default_to_what_a_large_interpreter_meets() {
        let c = PoolConfig::default();
        // Measured on a saturated 2-core machine (docs/operations.md,
        // "Deadlines"): a 250 MB Perl heap took up to 2 s to tear down, an
        // idle child up to 0.8 s to answer a ping.
        assert!(c.exit_timeout >= Duration::from_secs(5), "{c:?}");
        assert!(c.ping_timeout >= Duration::from_secs(4), "{c:?}");
        assert!(c.start_timeout >= Duration::from_secs(30), "{c:?}");
    }

    #[test]
    fn deadlines_read_from_a_config_file() {
        let c: PoolConfig = serde_json::from_str(
            r#"{"exit_timeout": "7s", "start_timeout": "2m", "ping_timeout": "3s"}"#,
        )
        .unwrap();
        assert_eq!(c.exit_timeout, Duration::from_secs(7));
        assert_eq!(c.start_timeout, Duration::from_secs(120));
        assert_eq!(c.ping_timeout, Duration::from_secs(3));
    }

    #[test]
    fn dispatch_none_needs_workers() {
        let err = invalid(|c| {
            c.dispatch = DispatchMode::None;
            c.min_children = 0;
        });
        assert_eq!(err.field, "min_children");
        assert!(err.to_string().contains("fixed pool of min_children"));
    }

    #[test]
    fn many_connection_children_need_handoff() {
        PoolConfig::default().validate_for_sessions().unwrap();
        let err = PoolConfig {
            dispatch: DispatchMode::Shared,
            ..PoolConfig::default()
        }
        .validate_for_sessions()
        .unwrap_err();
        assert_eq!(err.field, "dispatch");
        assert!(err.to_string().contains("use handoff"));
    }

    #[test]
    fn drain_delay_has_a_ceiling() {
        let e = invalid(|c| c.drain_delay = MAX_DRAIN_DELAY + Duration::from_secs(1));
        assert_eq!(e.field, "drain_delay");
        assert!(e.message.contains("try 5s"), "{}", e.message);
        let ok = PoolConfig {
            drain_delay: MAX_DRAIN_DELAY,
            ..PoolConfig::default()
        };
        assert!(ok.validate().is_ok());
    }

    #[test]
    fn defer_accept_in_whole_seconds_up_to_the_limit() {
        assert_eq!(
            invalid(|c| c.defer_accept = Duration::from_millis(1500)).field,
            "defer_accept"
        );
        let e = invalid(|c| c.defer_accept = MAX_DEFER_ACCEPT + Duration::from_secs(1));
        assert!(e.to_string().contains("try 5s"), "{e}");
        let ok = PoolConfig {
            defer_accept: MAX_DEFER_ACCEPT,
            ..PoolConfig::default()
        };
        assert!(ok.validate().is_ok());
    }

    #[test]
    fn zero_backlog() {
        assert_eq!(invalid(|c| c.backlog = 0).field, "backlog");
    }

    #[test]
    fn durations_parse_and_name_the_format() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_duration("soon").unwrap_err().contains("500ms"));
    }

    #[test]
    fn dispatch_names_round_trip() {
        for mode in [
            DispatchMode::Handoff,
            DispatchMode::Order,
            DispatchMode::Shared,
            DispatchMode::Kernel,
            #[cfg(feature = "herd")]
            DispatchMode::Herd,
            DispatchMode::None,
        ] {
            assert_eq!(mode.name().parse::<DispatchMode>().unwrap(), mode);
        }
        assert!("fast"
            .parse::<DispatchMode>()
            .unwrap_err()
            .contains("handoff"));
    }
}
