//! The servers the session benchmark compares, each run as a process of
//! its own (this same binary) so that its cost can be read apart from the
//! load generator's:
//! - `threads`: the baseline, one thread per session, blocking I/O;
//! - `pool`: one process with a [`SessionPool`] (a few worker threads that
//!   take turns at one poll);
//! - `forkpool`: `forkpool demo --sessions`, preforked children that each
//!   hold many sessions.
//!
//! All three speak the demo line protocol with the same code,
//! [`LineSession`]: the baseline drives it on a blocking socket, one step
//! per command, which is what a thread-per-session server does.

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use forkpool::sessions::{CloseReason, Session, SessionConfig, SessionPool, SessionStream, Step};
use forkpool_cli::demo::line::LineSession;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::procfs;

/// Which server to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerKind {
    /// One thread per session (the baseline).
    Threads,
    /// One process, a session pool with a few worker threads.
    Pool,
    /// `forkpool demo --sessions`: preforked children holding many sessions.
    Forkpool,
}

impl ServerKind {
    /// The name in tables.
    pub fn label(self) -> &'static str {
        match self {
            ServerKind::Threads => "thread-per-session",
            ServerKind::Pool => "session pool",
            ServerKind::Forkpool => "forkpool --sessions",
        }
    }
}

/// How the servers are set up.
#[derive(Debug, Clone)]
pub struct ServerSetup {
    /// Worker threads of a session pool (per child for `forkpool`).
    pub workers: usize,
    /// Sessions per child for `forkpool`.
    pub per_child: usize,
}

/// Serves `kind` on `listen` until killed; prints `forkpool: listening on
/// ADDR` once it accepts. Only `threads` and `pool` run here; `forkpool`
/// is `forkpool demo --sessions`.
pub fn serve(kind: ServerKind, listen: SocketAddr, workers: usize) -> Result<(), String> {
    let listener = TcpListener::bind(listen).map_err(|e| format!("cannot bind {listen}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    match kind {
        ServerKind::Threads => {
            println!("forkpool: listening on {bound}");
            serve_threads(listener)
        }
        ServerKind::Pool => {
            let config = SessionConfig {
                workers,
                max_sessions: 1 << 20,
                name: "bench".to_string(),
                ..SessionConfig::default()
            };
            let pool = SessionPool::<LineSession>::start(config, ())
                .map_err(|e| format!("cannot start the session pool: {e}"))?;
            pool.serve(listener).map_err(|e| e.to_string())?;
            println!("forkpool: listening on {bound}");
            loop {
                std::thread::park();
            }
        }
        ServerKind::Forkpool => Err("run `forkpool demo --sessions` for this one".into()),
    }
}

/// The baseline: accept, and give every connection a thread of its own.
fn serve_threads(listener: TcpListener) -> Result<(), String> {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        std::thread::Builder::new()
            .name("session".into())
            .spawn(move || converse(stream))
            .map_err(|e| format!("cannot start a session thread: {e}"))?;
    }
    Ok(())
}

/// One session on its own thread: the thread sleeps in `read` between
/// commands, its stack holding the conversation.
fn converse(stream: TcpStream) {
    let mut stream = SessionStream::from(stream);
    let mut session = LineSession::open(&Arc::new(()), &stream);
    let mut step = session.on_open(&mut stream);
    let reason = loop {
        match step {
            Ok(Step::Close) => break CloseReason::Finished,
            Err(e) => break CloseReason::Failed(e),
            // The socket blocks, so "wait" is simply the next read.
            Ok(_) => step = session.step(&mut stream),
        }
    };
    session.on_close(&mut stream, &reason);
}

/// A server process started for one measurement.
pub struct ServerProcess {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    stderr: Arc<Mutex<String>>,
}

impl ServerProcess {
    /// Starts `kind` as a process of this binary on a free loopback port.
    pub fn start(kind: ServerKind, setup: &ServerSetup) -> Result<ServerProcess, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find myself: {e}"))?;
        let mut command = Command::new(exe);
        match kind {
            ServerKind::Threads | ServerKind::Pool => {
                command.args(["bench-sessions", "--serve"]);
                command.arg(if kind == ServerKind::Threads {
                    "threads"
                } else {
                    "pool"
                });
                command.args(["--listen", "127.0.0.1:0"]);
                command.args(["--workers", &setup.workers.to_string()]);
            }
            ServerKind::Forkpool => {
                command.args(["demo", "--sessions", "--listen", "127.0.0.1:0"]);
                command.args(["--session-workers", &setup.workers.to_string()]);
                command.args(["--sessions-per-child", &setup.per_child.to_string()]);
                command.args(["--min-children", "1", "--min-spare", "1"]);
            }
        }
        let mut child = command
            .env("FORKPOOL_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the {} server: {e}", kind.label()))?;
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&stderr);
        let mut pipe = child.stderr.take().expect("piped");
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            sink.lock().unwrap().push_str(&text);
        });
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix("forkpool: listening on ") {
                    let _ = tx.send(addr.to_string());
                }
            }
        });
        let mut server = ServerProcess {
            child,
            addr: "127.0.0.1:1".parse().expect("literal"),
            stderr,
        };
        let addr = rx.recv_timeout(Duration::from_secs(20)).map_err(|_| {
            format!(
                "the {} server did not start: {}",
                kind.label(),
                server.stderr.lock().unwrap()
            )
        })?;
        server.addr = addr
            .parse()
            .map_err(|e| format!("bad listening address {addr:?}: {e}"))?;
        Ok(server)
    }

    /// The server's process id (the supervisor, for `forkpool`).
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Stops the server: SIGTERM, and SIGKILL for its whole tree if it is
    /// still there after `grace`. Returns what it wrote on stderr.
    pub fn stop(mut self, grace: Duration) -> String {
        let _ = kill(Pid::from_raw(self.pid()), Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill_tree();
        // Let the stderr reader see the end of the pipe.
        std::thread::sleep(Duration::from_millis(50));
        let text = self.stderr.lock().unwrap().clone();
        text
    }

    /// SIGKILLs the server and its descendants, by pid, if it is still
    /// running (its pid cannot have been reused: it is not reaped yet).
    fn kill_tree(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            for pid in procfs::tree(self.pid()).unwrap_or_default().iter().rev() {
                let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
            }
            let _ = self.child.wait();
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill_tree();
    }
}
