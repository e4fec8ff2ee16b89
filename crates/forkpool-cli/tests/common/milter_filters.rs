//! The milters a mail test puts in front of Postfix: what each is
//! ([`FilterUnderTest`]), how to start it on a loopback port, and the
//! running process, killed by pid on Drop.
//!
//! Every filter here obeys the same rules, so one test checks any of them:
//! it adds `X-Forkpool-Milter: <pid of the process that handled the
//! message>`, rejects `RCPT TO:<reject@...>` with `550 5.7.1`, tempfails
//! `MAIL FROM:<tempfail@...>` with `451 4.7.1` and quarantines a message
//! with a recipient `hold@...`.
//!
//! `forkpool milter` is one of them, its rule file the one
//! `forkpool milter --example` prints: the example is these rules. To check
//! another filter, add a variant, its [`FilterUnderTest::command`], and put
//! it in [`filters_under_test`]: every mail test then runs against it too.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::common::{alive, forkpool_bin, kill9, require, require_program, temp_path};
use super::listening::{free_port, wait_listening};

/// How long a filter may take to listen.
const START: Duration = Duration::from_secs(10);

/// A milter the mail tests can run.
#[derive(Debug, Clone)]
pub enum FilterUnderTest {
    /// `bench/milter/add_header.c` on Debian's libmilter, compiled.
    Libmilter {
        /// The executable.
        binary: PathBuf,
    },
    /// `bench/milter/add_header.py` on pymilter (Debian's python3-milter).
    Pymilter {
        /// Debian's Python, which has the `Milter` module.
        python: PathBuf,
        /// The script.
        script: PathBuf,
    },
    /// `forkpool milter` with the rules of `forkpool milter --example`: a
    /// supervisor and two preforked children, which filter.
    Forkpool {
        /// The rule file.
        rules: PathBuf,
        /// More pool options (`--sessions-per-child 1`, say).
        extra: Vec<String>,
    },
}

/// A filter process, killed by pid on Drop.
pub struct RunningFilter {
    child: Option<Child>,
    /// The process the filter is (its supervisor, for a pool).
    pub pid: i32,
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    /// For a pool, its control socket (`forkpool status --control`).
    pub control: Option<PathBuf>,
    output: PathBuf,
}

impl FilterUnderTest {
    /// What it is, for messages; also names its output file.
    pub fn name(&self) -> &'static str {
        match self {
            FilterUnderTest::Libmilter { .. } => "libmilter-add_header",
            FilterUnderTest::Pymilter { .. } => "pymilter-add_header",
            FilterUnderTest::Forkpool { .. } => "forkpool-milter",
        }
    }

    /// Whether it is a pool: a supervisor whose children filter.
    pub fn is_pool(&self) -> bool {
        matches!(self, FilterUnderTest::Forkpool { .. })
    }

    /// A copy of `forkpool milter` with `extra` pool options.
    pub fn with_pool_options(&self, extra: &[&str]) -> FilterUnderTest {
        let FilterUnderTest::Forkpool { rules, .. } = self else {
            panic!("{} is not a pool", self.name());
        };
        FilterUnderTest::Forkpool {
            rules: rules.clone(),
            extra: extra.iter().map(|a| a.to_string()).collect(),
        }
    }

    /// The command that runs it on 127.0.0.1:`port`; a pool's control
    /// socket is `control`.
    fn command(&self, port: u16, control: &Path) -> Command {
        match self {
            FilterUnderTest::Libmilter { binary } => {
                let mut command = Command::new(binary);
                command.args(["-p", &port.to_string()]);
                command
            }
            FilterUnderTest::Pymilter { python, script } => {
                let mut command = Command::new(python);
                command.arg(script).args(["-p", &port.to_string()]);
                command
            }
            FilterUnderTest::Forkpool { rules, extra } => {
                let mut command = Command::new(forkpool_bin());
                command
                    .arg("milter")
                    .arg("--listen")
                    .arg(format!("127.0.0.1:{port}"))
                    .arg("--control")
                    .arg(control)
                    .args(POOL)
                    .args(extra)
                    .arg("--")
                    .arg(rules);
                command
            }
        }
    }

    /// Starts it on a free port, its output to a file in `dir`; returns
    /// once it listens.
    pub fn start(&self, dir: &Path) -> RunningFilter {
        let output = dir.join(format!("{}.out", self.name()));
        for _ in 0..3 {
            let port = free_port();
            let control = dir.join(format!("{}-{port}.sock", self.name()));
            let log = std::fs::File::create(&output).unwrap();
            let child = self
                .command(port, &control)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| panic!("start {}: {e}", self.name()));
            let mut filter = RunningFilter {
                pid: child.id() as i32,
                child: Some(child),
                port,
                control: self.is_pool().then_some(control),
                output: output.clone(),
            };
            if wait_listening(filter.pid, port, START, || filter.exited()) && filter.wait_ready() {
                return filter;
            }
        }
        panic!(
            "{} did not start:\n{}",
            self.name(),
            std::fs::read_to_string(&output).unwrap_or_default()
        );
    }
}

/// The pool options of `forkpool milter` under test: two children, always
/// there, and a short drain when stopped.
const POOL: [&str; 6] = [
    "--min-children",
    "2",
    "--max-children",
    "2",
    "--shutdown-timeout",
    "5s",
];

/// The parent of process `pid`, from `/proc`.
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid ...: comm may hold spaces.
    let after = stat.rsplit_once(')')?.1;
    after.split_whitespace().nth(1)?.parse::<i32>().ok()
}

impl RunningFilter {
    fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| !matches!(c.try_wait(), Ok(None)))
    }

    /// For a pool, waits (bounded) until its status says it is ready, both
    /// children up; true at once for a single process.
    fn wait_ready(&mut self) -> bool {
        if self.control.is_none() {
            return true;
        }
        let deadline = Instant::now() + START;
        loop {
            let ready = self.status().is_some_and(|s| {
                s["ready"] == true && s["slots"].as_array().is_some_and(|a| a.len() == 2)
            });
            if ready {
                return true;
            }
            if self.exited() || Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A pool's `forkpool status --json`, if it answers.
    pub fn status(&self) -> Option<serde_json::Value> {
        let out = Command::new(forkpool_bin())
            .args(["status", "--json", "--control"])
            .arg(self.control.as_ref()?)
            .output()
            .ok()?;
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Whether `pid` may have handled a message: the filter itself, or for
    /// a pool (whose supervisor filters nothing) one of its children.
    pub fn owns(&self, pid: i32) -> bool {
        let parent = parent_of(pid);
        if self.control.is_some() {
            return pid != self.pid && parent == Some(self.pid);
        }
        pid == self.pid || parent == Some(self.pid)
    }

    /// The filter's child processes (a pool's children), from `/proc`.
    pub fn children(&self) -> Vec<i32> {
        let path = format!("/proc/{0}/task/{0}/children", self.pid);
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }

    /// Stops the filter and reaps it. A single process is SIGKILLed. A
    /// pool's supervisor gets SIGTERM and is waited for (bounded), since
    /// its children outlive a killed supervisor; then every child it had
    /// must be gone: one still running is SIGKILLed and, unless a test is
    /// already failing, fails the test.
    pub fn kill(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if self.control.is_none() {
            kill9(self.pid);
            let _ = child.wait();
            return;
        }
        let children = self.children();
        super::common::signal_pid(self.pid, "TERM");
        let deadline = Instant::now() + START;
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let stopped = matches!(child.try_wait(), Ok(Some(_)));
        if !stopped {
            kill9(self.pid);
            let _ = child.wait();
        }
        let left: Vec<i32> = children.into_iter().filter(|p| alive(*p)).collect();
        for pid in &left {
            kill9(*pid);
        }
        if !std::thread::panicking() {
            assert!(stopped, "{} did not stop on SIGTERM", self.pid);
            assert!(left.is_empty(), "children left running: {left:?}");
        }
    }

    /// What the filter printed.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.output).unwrap_or_default()
    }
}

impl Drop for RunningFilter {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Every filter the mail tests check, and a temp directory (removed on
/// Drop) holding what was built for them and their output.
pub struct Filters {
    /// The directory.
    pub dir: PathBuf,
    /// The filters.
    pub all: Vec<FilterUnderTest>,
}

/// Builds every filter there is to check; `None` when one cannot be built
/// here (a C compiler or libmilter missing) and the test must return (see
/// `common::require`).
pub fn filters_under_test() -> Option<Filters> {
    let dir = temp_path("milters");
    std::fs::create_dir_all(&dir).unwrap();
    let mut filters = Filters {
        dir,
        all: Vec::new(),
    };
    let binary = build_add_header(&filters.dir)?;
    filters.all.push(FilterUnderTest::Libmilter { binary });
    filters.all.push(require_pymilter()?);
    filters.all.push(forkpool_filter(&filters.dir));
    Some(filters)
}

/// `forkpool milter` with the rule file `forkpool milter --example` prints
/// (written to `dir`).
pub fn forkpool_filter(dir: &Path) -> FilterUnderTest {
    let out = Command::new(forkpool_bin())
        .args(["milter", "--example"])
        .output()
        .expect("run forkpool milter --example");
    assert!(out.status.success(), "forkpool milter --example failed");
    let rules = dir.join("rules.toml");
    std::fs::write(&rules, out.stdout).unwrap();
    FilterUnderTest::Forkpool {
        rules,
        extra: Vec::new(),
    }
}

/// The pymilter filter, if Debian's Python has the `Milter` module.
fn require_pymilter() -> Option<FilterUnderTest> {
    let python = PathBuf::from("/usr/bin/python3");
    let found = Command::new(&python)
        .args(["-c", "import Milter"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !require(
        found,
        "pymilter (python3-milter)",
        "run bash .ci/deps/mail.sh",
    ) {
        return None;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/milter/add_header.py");
    Some(FilterUnderTest::Pymilter { python, script })
}

impl Drop for Filters {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Compiles `bench/milter/add_header.c` into `dir`.
pub fn build_add_header(dir: &Path) -> Option<PathBuf> {
    let cc = require_program("cc", "run bash .ci/deps/system-tools.sh (gcc)")?;
    if !require(
        Path::new("/usr/include/libmilter/mfapi.h").is_file(),
        "libmilter's headers (libmilter-dev)",
        "run bash .ci/deps/mail.sh",
    ) {
        return None;
    }
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/milter/add_header.c");
    let out = dir.join("add_header");
    let status = Command::new(cc)
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&out)
        .arg(&source)
        .args(["-lmilter", "-lpthread"])
        .status()
        .expect("run the C compiler");
    assert!(status.success(), "cc failed on {}", source.display());
    Some(out)
}

/// Only `forkpool milter` (see [`forkpool_filter`]), in a temp directory of
/// its own: for tests of what only a pool does.
pub fn forkpool_only() -> Filters {
    let dir = temp_path("milters");
    std::fs::create_dir_all(&dir).unwrap();
    let all = vec![forkpool_filter(&dir)];
    Filters { dir, all }
}
