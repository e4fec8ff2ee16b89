//! A pool under test: `forkpool run` serving one of the Python apps in
//! `bench/apps/` through `forkpool_wsgi`, with its own control socket so
//! the benchmark can read the supervisor's status snapshots.
//!
//! The `forkpool` executable is the one built beside `forkpool-bench`
//! (`target/release/forkpool`); the apps and the Python helper are read
//! from this source tree.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use forkpool::status::Snapshot;

use super::pool_process::PoolProcess;
use super::procstat::{self, Memory};
use super::{POOL_START, POOL_STOP};

/// The source tree's root, where `bench/apps` and `clients/python` are.
fn source_root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// `forkpool`, built beside this executable.
fn forkpool_exe() -> Result<PathBuf, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find the forkpool-bench executable: {e}"))?;
    let forkpool = exe.with_file_name("forkpool");
    if !forkpool.exists() {
        return Err(format!(
            "{} is missing: build it with `cargo build --release -p forkpool-cli`",
            forkpool.display()
        ));
    }
    Ok(forkpool)
}

/// A running `forkpool run -- python3 -m forkpool_wsgi bench/apps/APP`.
pub struct AppPool {
    pool: PoolProcess,
    control: PathBuf,
}

impl AppPool {
    /// Starts `app` (`module:name` in `bench/apps`) with the pool options
    /// `options`, and waits until the pool is ready with no child starting.
    pub fn start(app: &str, options: &[&str], timeout: Duration) -> Result<AppPool, String> {
        let root = source_root();
        let control = std::env::temp_dir().join(format!(
            "forkpool-bench-{}-{}.sock",
            std::process::id(),
            app.replace(':', "-")
        ));
        let mut args: Vec<String> = ["run", "--listen", "127.0.0.1:0", "--control"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.push(control.display().to_string());
        // A Python start on a loaded 2-core machine can take seconds; it
        // must not be taken for a hung worker.
        args.extend(["--ping-timeout", "30s"].map(String::from));
        args.extend(options.iter().map(|s| s.to_string()));
        args.extend(
            [
                "--",
                "python3",
                "-m",
                "forkpool_wsgi",
                "--no-access-log",
                "--chdir",
            ]
            .map(String::from),
        );
        args.push(root.join("bench/apps").display().to_string());
        args.push(app.to_string());
        let env = [(
            "PYTHONPATH",
            root.join("clients/python").display().to_string(),
        )];
        let pool = PoolProcess::start_with_env(&forkpool_exe()?, &args, &env, POOL_START)?;
        let pool = AppPool { pool, control };
        pool.wait_for("ready, nothing starting", timeout, |s| {
            s.ready && s.starting == 0
        })?;
        Ok(pool)
    }

    /// The address it listens on.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.pool.addr()
    }

    /// The supervisor's pid.
    pub fn pid(&self) -> i32 {
        self.pool.pid()
    }

    /// One status snapshot.
    pub fn status(&self) -> Result<Snapshot, String> {
        forkpool_cli::status::fetch(&self.control)
    }

    /// Polls the status until `cond` holds, for at most `timeout`; returns
    /// the snapshot that satisfied it.
    pub fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        cond: impl Fn(&Snapshot) -> bool,
    ) -> Result<Snapshot, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = self.status();
            if let Ok(snapshot) = &last {
                if cond(snapshot) {
                    return last;
                }
            }
            if Instant::now() >= deadline {
                // The whole snapshot (each slot's state and counts, the
                // totals) and the pool's stderr: a pool that never gets
                // there under one machine's load is read from this alone.
                let seen = match last {
                    Ok(s) => format!(
                        "last status line: {}; the snapshot: {}",
                        s.line,
                        serde_json::to_string(&s).unwrap_or_default()
                    ),
                    Err(e) => e,
                };
                return Err(format!(
                    "the pool was not {what} within {timeout:?} ({seen}){}",
                    self.pool.stderr_excerpt()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The memory of every process of the pool: the supervisor, the
    /// template and each worker (all of them its children).
    pub fn memory(&self) -> Result<PoolMemory, String> {
        let read = |pid: i32| {
            procstat::memory_of(pid).map_err(|e| format!("cannot read memory of pid {pid}: {e}"))
        };
        let snapshot = self.status()?;
        let workers = snapshot
            .slots
            .iter()
            .map(|slot| read(slot.pid))
            .collect::<Result<Vec<_>, _>>()?;
        let templates = snapshot
            .templates
            .iter()
            .map(|t| read(t.pid))
            .collect::<Result<Vec<_>, _>>()?;
        let supervisor = read(self.pid())?;
        let total_pss_kib = supervisor.pss_kib
            + workers.iter().map(|m| m.pss_kib).sum::<u64>()
            + templates.iter().map(|m| m.pss_kib).sum::<u64>();
        Ok(PoolMemory {
            workers: workers.len(),
            worker_mean: Memory::mean(&workers),
            template: templates.first().copied(),
            total_pss_kib,
        })
    }

    /// Stops the pool with SIGTERM and waits for it to exit cleanly.
    pub fn stop(self) -> Result<(), String> {
        let result = self.pool.stop(POOL_STOP).map(|_| ());
        let _ = std::fs::remove_file(&self.control);
        result
    }
}

/// The memory of a whole pool at one moment.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct PoolMemory {
    /// Workers measured.
    pub workers: usize,
    /// The mean over the workers.
    pub worker_mean: Memory,
    /// The template, under `--preload`.
    pub template: Option<Memory>,
    /// PSS of the supervisor, the template and every worker together.
    pub total_pss_kib: u64,
}

/// One `GET path` to `addr`, close per request: `Ok` for a 200 answer.
pub fn get(addr: std::net::SocketAddr, path: &str, timeout: Duration) -> Result<(), String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|_| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| e.to_string())?;
    let target = super::target::Target::at(addr, path);
    stream
        .write_all(&super::http::request(&target, false))
        .map_err(|e| format!("send: {e}"))?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .map_err(|e| format!("receive: {e}"))?;
    match super::http::parse_response(&answer)? {
        Some(response) if response.status == 200 => Ok(()),
        Some(response) => Err(format!("status {}", response.status)),
        None => Err(format!("incomplete answer ({} bytes)", answer.len())),
    }
}
