//! Settings of a running pool: a TOML file (`--config`) with command-line
//! flags on top. Flags always win, also when SIGHUP re-reads the file.
//!
//! ```toml
//! listen = ["public=127.0.0.1:8080", "unix:/run/app.sock"]
//! unix_mode = "0660"
//! control = "/run/forkpool.sock"
//! metrics = "127.0.0.1:9187"
//! agent = "127.0.0.1:9188"
//! user = "www-data"
//! group = "www-data"
//!
//! [pool]
//! min_children = 2
//! max_children = 64
//! busy_timeout = "30s"
//! exit_timeout = "10s"
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::Args;
use forkpool::{ListenAddr, PoolConfig};
use serde::Deserialize;

use crate::pool_args::PoolArgs;

/// Options every pool-running command shares.
#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// Read settings from this TOML file; flags given here override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Where to listen: [NAME=]HOST:PORT, [NAME=][IPv6]:PORT or
    /// [NAME=]unix:PATH; repeatable [default: 127.0.0.1:8080].
    // The doc comment is the --help text, brackets and all.
    #[allow(rustdoc::broken_intra_doc_links)]
    #[arg(long, value_name = "ADDR")]
    pub listen: Vec<String>,
    /// Permission bits of Unix listener socket files, in octal (0660).
    #[arg(long, value_name = "MODE")]
    pub unix_mode: Option<String>,
    /// The control socket `forkpool status` reads
    /// [default: $XDG_RUNTIME_DIR/forkpool.sock or /tmp/forkpool-UID/forkpool.sock].
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Serve Prometheus metrics over HTTP at this address.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
    /// Answer HAProxy's agent check (`agent-check`) at this address.
    #[arg(long, value_name = "ADDR")]
    pub agent: Option<SocketAddr>,
    /// Run children as this user (the supervisor must start as root).
    #[arg(long, value_name = "USER")]
    pub user: Option<String>,
    /// Run children with this group [default: the user's primary group].
    #[arg(long, value_name = "GROUP")]
    pub group: Option<String>,
    /// The pool's knobs given as flags.
    #[command(flatten)]
    pub pool: PoolArgs,
    /// `defer_accept` when neither a flag nor the file sets it: a command
    /// whose clients always speak first (`forkpool demo`'s HTTP) sets it.
    #[arg(skip)]
    pub default_defer_accept: std::time::Duration,
}

/// What a config file may hold. Unknown keys are errors.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSettings {
    /// Listen addresses, like `--listen`.
    #[serde(default)]
    pub listen: Vec<String>,
    /// Unix socket file mode, octal string.
    pub unix_mode: Option<String>,
    /// Control socket path.
    pub control: Option<PathBuf>,
    /// Metrics address.
    pub metrics: Option<SocketAddr>,
    /// Agent-check address.
    pub agent: Option<SocketAddr>,
    /// Children's user.
    pub user: Option<String>,
    /// Children's group.
    pub group: Option<String>,
    /// Pool settings.
    #[serde(default)]
    pub pool: PoolConfig,
    /// `forkpool run`: the worker command and its arguments.
    pub command: Option<Vec<String>>,
    /// Whether the file's `[pool]` sets `defer_accept` (a default cannot
    /// tell a `0s` written there from one left out).
    #[serde(skip)]
    pub sets_defer_accept: bool,
}

/// One listener to bind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenSpec {
    /// Its name (empty if none).
    pub name: String,
    /// Where.
    pub addr: ListenAddr,
}

/// Everything resolved: file, then flags.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Listeners in order.
    pub listen: Vec<ListenSpec>,
    /// Unix socket file mode.
    pub unix_mode: Option<u32>,
    /// Control socket path, and whether it was chosen explicitly.
    pub control: (PathBuf, bool),
    /// Metrics address.
    pub metrics: Option<SocketAddr>,
    /// Agent-check address.
    pub agent: Option<SocketAddr>,
    /// Children's user and group ids.
    pub credentials: Option<forkpool::Credentials>,
    /// The pool configuration.
    pub pool: PoolConfig,
    /// The worker command from the file, if any (`forkpool run`).
    pub command: Option<Vec<String>>,
}

impl ServeArgs {
    /// Reads the file (if any), applies the flags, checks everything.
    pub fn resolve(&self) -> Result<Settings, String> {
        let file = match &self.config {
            Some(path) => read_file(path)?,
            None => FileSettings::default(),
        };
        let listen_texts = if self.listen.is_empty() {
            if file.listen.is_empty() {
                vec!["127.0.0.1:8080".to_string()]
            } else {
                file.listen.clone()
            }
        } else {
            self.listen.clone()
        };
        let listen = listen_texts
            .iter()
            .map(|t| parse_listen(t))
            .collect::<Result<Vec<_>, _>>()?;
        let unix_mode = self
            .unix_mode
            .clone()
            .or(file.unix_mode.clone())
            .map(|m| parse_mode(&m))
            .transpose()?;
        let control = match self.control.clone().or(file.control.clone()) {
            Some(path) => (path, true),
            None => (default_control_path(), false),
        };
        let user = self.user.clone().or(file.user.clone());
        let group = self.group.clone().or(file.group.clone());
        let credentials = resolve_credentials(user.as_deref(), group.as_deref())?;
        let mut pool = self.pool.apply(file.pool.clone());
        if self.pool.defer_accept.is_none() && !file.sets_defer_accept {
            pool.defer_accept = self.default_defer_accept;
        }
        if let Err(e) = pool.validate() {
            let place = self
                .config
                .as_deref()
                .and_then(|path| line_of(path, e.field))
                .map(|(path, line)| format!("{}:{line}: ", path.display()))
                .unwrap_or_default();
            return Err(format!("{place}invalid configuration: {e}"));
        }
        Ok(Settings {
            listen,
            unix_mode,
            control,
            metrics: self.metrics.or(file.metrics),
            agent: self.agent.or(file.agent),
            credentials,
            pool,
            command: file.command,
        })
    }

    /// What SIGHUP calls: the file read again, the same flags on top.
    pub fn reloader(&self) -> impl FnMut() -> Result<PoolConfig, String> + 'static {
        let args = self.clone();
        move || args.resolve().map(|s| s.pool)
    }
}

fn read_file(path: &Path) -> Result<FileSettings, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
    let mut file: FileSettings =
        toml::from_str(&text).map_err(|e| format!("config file {}: {e}", path.display()))?;
    let table: toml::Table = toml::from_str(&text).unwrap_or_default();
    file.sets_defer_accept = table
        .get("pool")
        .and_then(|pool| pool.get("defer_accept"))
        .is_some();
    Ok(file)
}

/// The line of `key = ...` in the file, for errors found after parsing.
fn line_of(path: &Path, key: &str) -> Option<(PathBuf, usize)> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .position(|l| {
            let l = l.trim_start();
            l.strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with('='))
        })
        .map(|i| (path.to_path_buf(), i + 1))
}

/// `[NAME=]ADDR`.
pub fn parse_listen(text: &str) -> Result<ListenSpec, String> {
    let (name, addr) = match text.split_once('=') {
        Some((name, addr))
            if !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') =>
        {
            (name.to_string(), addr)
        }
        _ => (String::new(), text),
    };
    Ok(ListenSpec {
        name,
        addr: addr.parse()?,
    })
}

fn parse_mode(text: &str) -> Result<u32, String> {
    let mode = u32::from_str_radix(text.trim_start_matches("0o"), 8)
        .map_err(|_| format!("unix_mode '{text}' is not an octal mode; write it like 0660"))?;
    if mode > 0o777 {
        return Err(format!("unix_mode '{text}' is above 0777"));
    }
    Ok(mode)
}

/// `$XDG_RUNTIME_DIR/forkpool.sock`, else `/tmp/forkpool-UID/forkpool.sock`
/// (a private directory the supervisor makes).
pub fn default_control_path() -> PathBuf {
    forkpool::control_path::default_path()
}

fn resolve_credentials(
    user: Option<&str>,
    group: Option<&str>,
) -> Result<Option<forkpool::Credentials>, String> {
    use nix::unistd::{Group, User};
    let Some(user) = user else {
        if group.is_some() {
            return Err("group is set but user is not: set user too".into());
        }
        return Ok(None);
    };
    let found = User::from_name(user)
        .map_err(|e| format!("cannot look up user '{user}': {e}"))?
        .ok_or_else(|| format!("no such user '{user}': create it or fix the user setting"))?;
    let gid = match group {
        None => found.gid.as_raw(),
        Some(group) => Group::from_name(group)
            .map_err(|e| format!("cannot look up group '{group}': {e}"))?
            .ok_or_else(|| format!("no such group '{group}': create it or fix the group setting"))?
            .gid
            .as_raw(),
    };
    Ok(Some(forkpool::Credentials {
        uid: found.uid.as_raw(),
        gid,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_names_are_optional() {
        let spec = parse_listen("public=127.0.0.1:80").unwrap();
        assert_eq!(spec.name, "public");
        let spec = parse_listen("[::1]:80").unwrap();
        assert_eq!(spec.name, "");
        assert!(parse_listen("x=nowhere").is_err());
    }

    #[test]
    fn modes_are_octal() {
        assert_eq!(parse_mode("0660").unwrap(), 0o660);
        assert!(parse_mode("rw").unwrap_err().contains("0660"));
        assert!(parse_mode("1777").is_err());
    }

    #[test]
    fn deadlines_come_from_the_file_flags_win_and_a_reload_rereads_them() {
        let path = std::env::temp_dir().join(format!(
            "forkpool-settings-deadlines-{}.toml",
            std::process::id()
        ));
        let write = |exit: &str| {
            let text = format!(
                "[pool]\nexit_timeout = \"{exit}\"\nstart_timeout = \"90s\"\nping_timeout = \"3s\"\n"
            );
            std::fs::write(&path, text).unwrap();
        };
        write("12s");
        let args = ServeArgs {
            config: Some(path.clone()),
            pool: PoolArgs {
                start_timeout: Some(std::time::Duration::from_secs(120)),
                ..PoolArgs::default()
            },
            ..ServeArgs::default()
        };
        let pool = args.resolve().unwrap().pool;
        let secs = std::time::Duration::from_secs;
        assert_eq!(pool.exit_timeout, secs(12));
        assert_eq!(pool.ping_timeout, secs(3));
        assert_eq!(pool.start_timeout, secs(120), "the flag wins");
        let mut reload = args.reloader();
        write("20s");
        let reloaded = reload().unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(reloaded.exit_timeout, secs(20));
        assert_eq!(reloaded.start_timeout, secs(120));
    }

    #[test]
    fn a_commands_defer_accept_yields_to_the_file_and_the_flag_even_at_zero() {
        let path = std::env::temp_dir().join(format!(
            "forkpool-settings-defer-{}.toml",
            std::process::id()
        ));
        let secs = std::time::Duration::from_secs;
        let resolve = |file: Option<&str>, flag: Option<u64>| {
            if let Some(text) = file {
                std::fs::write(&path, text).unwrap();
            }
            let args = ServeArgs {
                config: file.map(|_| path.clone()),
                pool: PoolArgs {
                    defer_accept: flag.map(secs),
                    ..PoolArgs::default()
                },
                default_defer_accept: secs(5),
                ..ServeArgs::default()
            };
            args.resolve().unwrap().pool.defer_accept
        };
        assert_eq!(resolve(None, None), secs(5));
        assert_eq!(resolve(Some("[pool]\nmin_children = 2\n"), None), secs(5));
        assert_eq!(
            resolve(Some("[pool]\ndefer_accept = \"0s\"\n"), None),
            secs(0)
        );
        assert_eq!(
            resolve(Some("[pool]\ndefer_accept = \"2s\"\n"), Some(0)),
            secs(0)
        );
        assert_eq!(resolve(None, Some(3)), secs(3));
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn unknown_user_is_named() {
        let err = resolve_credentials(Some("no-such-user-forkpool"), None).unwrap_err();
        assert!(
            err.contains("no such user 'no-such-user-forkpool'"),
            "{err}"
        );
        assert!(resolve_credentials(None, Some("root")).is_err());
    }
}
