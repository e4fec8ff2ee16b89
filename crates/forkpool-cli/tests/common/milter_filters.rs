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
//! To check another filter (`forkpool milter` with a rule file of these
//! rules, say), add a variant, its [`FilterUnderTest::command`], and put it
//! in [`filters_under_test`]: every mail test then runs against it too.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::common::{kill9, require, require_program, temp_path};
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
}

/// A filter process, killed by pid on Drop.
pub struct RunningFilter {
    child: Option<Child>,
    /// The process the filter is (its supervisor, for a pool).
    pub pid: i32,
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    output: PathBuf,
}

impl FilterUnderTest {
    /// What it is, for messages; also names its output file.
    pub fn name(&self) -> &'static str {
        match self {
            FilterUnderTest::Libmilter { .. } => "libmilter-add_header",
            FilterUnderTest::Pymilter { .. } => "pymilter-add_header",
        }
    }

    /// The command that runs it on 127.0.0.1:`port`.
    fn command(&self, port: u16) -> Command {
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
        }
    }

    /// Starts it on a free port, its output to a file in `dir`; returns
    /// once it listens.
    pub fn start(&self, dir: &Path) -> RunningFilter {
        let output = dir.join(format!("{}.out", self.name()));
        for _ in 0..3 {
            let port = free_port();
            let log = std::fs::File::create(&output).unwrap();
            let child = self
                .command(port)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| panic!("start {}: {e}", self.name()));
            let mut filter = RunningFilter {
                pid: child.id() as i32,
                child: Some(child),
                port,
                output: output.clone(),
            };
            if wait_listening(filter.pid, port, START, || filter.exited()) {
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

impl RunningFilter {
    fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| !matches!(c.try_wait(), Ok(None)))
    }

    /// Whether `pid` is the filter or one of its children: a header naming
    /// the process that handled a message must name one of these.
    pub fn owns(&self, pid: i32) -> bool {
        let parent = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| {
                // pid (comm) state ppid ...: comm may hold spaces.
                let after = stat.rsplit_once(')')?.1;
                after.split_whitespace().nth(1)?.parse::<i32>().ok()
            });
        pid == self.pid || parent == Some(self.pid)
    }

    /// Kills the filter (SIGKILL) and reaps it. For a pool, whose children
    /// outlive a killed supervisor, a variant must stop those too.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill9(self.pid);
            let _ = child.wait();
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
    Some(filters)
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
