//! A pool under test: `forkpool demo` run as a subprocess.
//!
//! The demo prints `forkpool: listening on ADDR` once it has bound, and
//! `forkpool: totals {json}` just before a graceful exit on SIGTERM; this
//! module waits for the first, asks for the second, and makes sure the
//! process never outlives the benchmark: dropping a [`PoolProcess`] (also
//! while unwinding from a panic) SIGKILLs the parent and the children it
//! had, and the parent is started with `PR_SET_PDEATHSIG` so that even a
//! benchmark killed outright takes it along.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::procstat;

const LISTENING: &str = "forkpool: listening on ";
const TOTALS: &str = "forkpool: totals ";

/// How many of the pool's last stderr lines an error message quotes.
const STDERR_TAIL: usize = 20;

/// The pool's own counts, from its `totals` line.
pub use forkpool::Totals;

/// Reads the address from a `forkpool: listening on ADDR` line.
pub fn parse_listening(line: &str) -> Option<SocketAddr> {
    line.trim().strip_prefix(LISTENING)?.trim().parse().ok()
}

/// Reads a `forkpool: totals {json}` line (`None` for any other line).
pub fn parse_totals(line: &str) -> Option<Result<Totals, String>> {
    let json = line.trim().strip_prefix(TOTALS)?;
    Some(serde_json::from_str(json).map_err(|e| format!("bad totals line '{json}': {e}")))
}

/// A running pool.
pub struct PoolProcess {
    child: Child,
    addr: SocketAddr,
    stdout: Receiver<String>,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    stderr_reader: JoinHandle<()>,
}

impl PoolProcess {
    /// Starts `forkpool demo --listen 127.0.0.1:0 ARGS...` from this very
    /// executable and waits up to `timeout` for it to listen.
    pub fn start_demo(args: &[String], timeout: Duration) -> Result<PoolProcess, String> {
        let exe = std::env::current_exe()
            .map_err(|e| format!("cannot find the forkpool executable: {e}"))?;
        let mut full = vec![
            "demo".to_string(),
            "--listen".to_string(),
            "127.0.0.1:0".to_string(),
        ];
        full.extend_from_slice(args);
        PoolProcess::start(&exe, &full, timeout)
    }

    /// Starts `program ARGS...` and waits up to `timeout` for its
    /// `listening on` line.
    pub fn start(
        program: &Path,
        args: &[String],
        timeout: Duration,
    ) -> Result<PoolProcess, String> {
        PoolProcess::start_with_env(program, args, &[], timeout)
    }

    /// [`PoolProcess::start`] with `env` added to the environment.
    pub fn start_with_env(
        program: &Path,
        args: &[String],
        env: &[(&str, String)],
        timeout: Duration,
    ) -> Result<PoolProcess, String> {
        let what = format!("{} {}", program.display(), args.join(" "));
        let mut command = Command::new(program);
        command
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        crate::sys::die_with_parent(&mut command);
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot start '{what}': {e}"))?;
        let stdout = lines_of(child.stdout.take().expect("stdout is piped"));
        let (stderr_tail, stderr_reader) = tail_of(child.stderr.take().expect("stderr is piped"));
        let mut pool = PoolProcess {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            stdout,
            stderr_tail,
            stderr_reader,
        };
        match pool.wait_for_line(timeout, parse_listening) {
            Ok(addr) => {
                pool.addr = addr;
                Ok(pool)
            }
            Err(why) => {
                pool.kill();
                pool.wait_for_stderr(Duration::from_millis(500));
                Err(format!(
                    "'{what}' did not start: {why}{}",
                    pool.stderr_excerpt()
                ))
            }
        }
    }

    /// The parent's pid.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The first address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits until the pool has at least `at_least` children and the same
    /// ones for `steady`; returns their pids. Fails after `timeout`.
    pub fn settle(
        &self,
        at_least: usize,
        steady: Duration,
        timeout: Duration,
    ) -> Result<Vec<i32>, String> {
        let deadline = Instant::now() + timeout;
        let mut last: Vec<i32> = Vec::new();
        let mut since = Instant::now();
        while Instant::now() < deadline {
            let mut now: Vec<i32> = procstat::children_of(self.pid())
                .map_err(|e| format!("cannot list the pool's children: {e}"))?
                .iter()
                .map(|c| c.pid)
                .collect();
            now.sort_unstable();
            if now != last {
                last = now;
                since = Instant::now();
            } else if last.len() >= at_least && since.elapsed() >= steady {
                return Ok(last);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Err(format!(
            "the pool did not settle at {at_least} or more children within {timeout:?} (it has {})",
            last.len()
        ))
    }

    /// Sends SIGTERM and waits up to `timeout` for the totals line and a
    /// clean exit. Children still alive after the parent has gone are
    /// killed and reported as an error.
    pub fn stop(mut self, timeout: Duration) -> Result<Totals, String> {
        let deadline = Instant::now() + timeout;
        let children = procstat::children_of(self.pid()).unwrap_or_default();
        kill(Pid::from_raw(self.pid()), Signal::SIGTERM)
            .map_err(|e| format!("cannot signal the pool: {e}"))?;
        let totals = self
            .wait_for_line(timeout, parse_totals)
            .and_then(|parsed| parsed);
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => break None,
            }
        };
        let leftovers = kill_leftovers(&children);
        let totals = totals
            .map_err(|why| format!("no totals after SIGTERM: {why}{}", self.stderr_excerpt()))?;
        match status {
            Some(s) if s.success() => {}
            Some(s) => {
                return Err(format!(
                    "the pool exited with {s} after SIGTERM{}",
                    self.stderr_excerpt()
                ))
            }
            None => {
                return Err(format!(
                    "the pool did not exit within {timeout:?} of SIGTERM"
                ))
            }
        }
        if leftovers > 0 {
            return Err(format!(
                "the pool exited leaving {leftovers} children behind (killed)"
            ));
        }
        Ok(totals)
    }

    /// Waits for the first stdout line `parse` accepts.
    fn wait_for_line<T>(
        &self,
        timeout: Duration,
        parse: impl Fn(&str) -> Option<T>,
    ) -> Result<T, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stdout.recv_timeout(left) {
                Ok(line) => {
                    if let Some(found) = parse(&line) {
                        return Ok(found);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!("nothing within {timeout:?}"))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err("it closed its stdout (exited?)".to_string())
                }
            }
        }
    }

    /// Gives the stderr reader a moment to take in the last lines of a
    /// pool that has exited.
    fn wait_for_stderr(&self, patience: Duration) {
        let deadline = Instant::now() + patience;
        while !self.stderr_reader.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGKILLs the parent, then those of its children that outlive it.
    fn kill(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let children = procstat::children_of(self.pid()).unwrap_or_default();
        let _ = self.child.kill();
        let _ = self.child.wait();
        kill_leftovers(&children);
    }

    /// The pool's last stderr lines, for an error message.
    pub fn stderr_excerpt(&self) -> String {
        let tail = self
            .stderr_tail
            .lock()
            .map(|t| t.clone())
            .unwrap_or_default();
        if tail.is_empty() {
            return String::new();
        }
        let lines: Vec<String> = tail.into_iter().collect();
        format!("\n  its stderr ended with:\n    {}", lines.join("\n    "))
    }
}

impl Drop for PoolProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// SIGKILLs those of `children` that still run (same pid *and* start time);
/// returns how many there were.
fn kill_leftovers(children: &[procstat::Stat]) -> usize {
    let mut killed = 0;
    for child in children {
        let same = procstat::read_stat(child.pid)
            .is_ok_and(|now| now.starttime == child.starttime && now.state != 'Z');
        if same && kill(Pid::from_raw(child.pid), Signal::SIGKILL).is_ok() {
            killed += 1;
        }
    }
    killed
}

/// Forwards each line of `pipe` to the returned channel.
fn lines_of(pipe: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// Keeps the last lines of `pipe`, for error messages.
fn tail_of(pipe: impl Read + Send + 'static) -> (Arc<Mutex<VecDeque<String>>>, JoinHandle<()>) {
    let tail = Arc::new(Mutex::new(VecDeque::new()));
    let shared = tail.clone();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { return };
            let Ok(mut tail) = shared.lock() else { return };
            if tail.len() == STDERR_TAIL {
                tail.pop_front();
            }
            tail.push_back(line);
        }
    });
    (tail, reader)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shell pretending to be the demo: `$1` is what it does on SIGTERM.
    fn fake_pool(on_term: &str) -> Result<PoolProcess, String> {
        // The trap comes first: SIGTERM may follow the listening line at once.
        let script = format!(
            "trap '{on_term}' TERM; echo starting >&2; \
             echo 'forkpool: listening on 127.0.0.1:4321'; while :; do sleep 0.05; done"
        );
        PoolProcess::start(
            Path::new("/bin/sh"),
            &["-c".to_string(), script],
            Duration::from_secs(5),
        )
    }

    fn alive(pid: i32) -> bool {
        procstat::read_stat(pid).is_ok_and(|s| s.state != 'Z')
    }

    #[test]
    fn line_parsers() {
        assert_eq!(
            parse_listening("forkpool: listening on 127.0.0.1:8080\n"),
            Some("127.0.0.1:8080".parse().unwrap())
        );
        assert_eq!(
            parse_listening("forkpool: listening on [::1]:9"),
            Some("[::1]:9".parse().unwrap())
        );
        assert_eq!(parse_listening("something else"), None);
        let totals = parse_totals(
            r#"forkpool: totals {"accepted":10,"spawned":3,"retired":1,"killed":0,"died":0,"futile_wakeups":4,"extra":true}"#,
        );
        assert_eq!(
            totals,
            Some(Ok(Totals {
                accepted: 10,
                spawned: 3,
                retired: 1,
                futile_wakeups: 4,
                ..Totals::default()
            }))
        );
        assert!(matches!(parse_totals("forkpool: totals {"), Some(Err(_))));
        assert_eq!(parse_totals("forkpool: listening on 127.0.0.1:1"), None);
    }

    #[test]
    fn graceful_stop_collects_totals() {
        let pool = fake_pool(
            r#"echo "forkpool: totals {\"accepted\":5,\"spawned\":2,\"retired\":0,\"killed\":0,\"died\":0,\"futile_wakeups\":1}"; exit 0"#,
        )
        .unwrap();
        assert_eq!(pool.addr(), "127.0.0.1:4321".parse().unwrap());
        let pid = pool.pid();
        let totals = pool.stop(Duration::from_secs(5)).unwrap();
        assert_eq!((totals.accepted, totals.futile_wakeups), (5, 1));
        assert!(!alive(pid));
    }

    #[test]
    fn a_pool_that_ignores_sigterm_is_killed_on_drop() {
        let pool = fake_pool("").unwrap();
        let pid = pool.pid();
        let err = pool.stop(Duration::from_millis(300)).unwrap_err();
        assert!(err.contains("no totals"), "{err}");
        assert!(!alive(pid), "pid {pid} outlived the PoolProcess");
    }

    #[test]
    fn dropped_while_panicking() {
        let pid = Arc::new(Mutex::new(0));
        let seen = pid.clone();
        let result = std::panic::catch_unwind(move || {
            let pool = fake_pool("").unwrap();
            *seen.lock().unwrap() = pool.pid();
            panic!("benchmark failed");
        });
        assert!(result.is_err());
        assert!(!alive(*pid.lock().unwrap()));
    }

    #[test]
    fn a_program_that_never_listens_is_reported_with_its_stderr() {
        let err = PoolProcess::start(
            Path::new("/bin/sh"),
            &[
                "-c".to_string(),
                "echo 'no such subcommand: demo' >&2; exit 2".to_string(),
            ],
            Duration::from_secs(5),
        )
        .err()
        .unwrap();
        assert!(err.contains("did not start"), "{err}");
        assert!(err.contains("no such subcommand: demo"), "{err}");
    }
}
