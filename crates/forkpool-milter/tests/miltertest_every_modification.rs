//! Debian's `miltertest` (opendkim-tools: an MTA side nobody here wrote,
//! scripted in Lua; `bash .ci/deps/mail.sh` installs it) against a filter
//! that registers every stage and makes every end-of-message modification,
//! run in this process on a session pool.
//!
//! The script `tests/miltertest/every_modification.lua` checks the
//! negotiation, each stage's reply (continue, accept, reject, tempfail,
//! discard, skip, a reply code), the macros each stage saw, every
//! modification with `mt.eom_check`, a multi-line reply at end of message,
//! and an abort followed by a new message on the same connection.
//!
//! What that miltertest cannot check, a second client nobody here wrote
//! does: PyPI's pure-Python `miltertest` (`bash .ci/deps/miltertest-py.sh`)
//! runs `tests/miltertest/every_modification.py` for the changed sender
//! and the recipient added with ESMTP arguments, a body replaced in three
//! 64 KiB chunks, and a multi-line reply's text at RCPT.
//!
//! Each check must be able to fail: the second test turns off one of the
//! filter's mechanisms at a time ([`Knobs::off`]) and expects the script to
//! fail on the check that names it.

#[path = "../../forkpool-cli/tests/common/require.rs"]
mod require;

use std::io::Read;
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use forkpool_milter::{
    Actions, Address, Context, EomActions, Filter, FilterOptions, MilterContext, MilterSession,
    Protocol, ReplyText, Stage, Status,
};
use forkpool_sessions::{SessionConfig, SessionPool};

/// Which mechanism of the filter is turned off (none in the real test).
#[derive(Debug, Default)]
struct Knobs {
    off: Option<&'static str>,
}

/// The filter: what it does at each stage depends on the sender, the
/// recipients and the headers, so the script can ask for each behaviour.
struct Every {
    knobs: Arc<Knobs>,
    /// `stage=value` of the macro each connection stage saw.
    connection_macros: Vec<String>,
    /// The same for the current message's stages.
    message_macros: Vec<String>,
    recipients: Vec<String>,
    skip_body: bool,
}

/// The macro the script sends for each stage, as the filter reads it.
const MACROS: [(&str, &str); 7] = [
    ("connect", "j"),
    ("helo", "{tls_version}"),
    ("mail", "i"),
    ("rcpt", "{rcpt_addr}"),
    ("data", "{mt_data}"),
    ("eoh", "{mt_eoh}"),
    ("eom", "{mt_eom}"),
];

/// The new body of a message to `<big-body@...>`: 145,000 bytes, three
/// chunks (as `every_modification.py` expects).
fn big_body() -> Vec<u8> {
    (0..5000)
        .flat_map(|i| format!("line {i:06} of the new body\r\n").into_bytes())
        .collect()
}

/// One modification made at end of message.
type Modification = dyn Fn(&mut EomActions);

impl Every {
    /// `status`, or continue when the knob `name` is off.
    fn verdict(&self, name: &str, status: Status) -> Status {
        if self.knobs.off == Some(name) {
            Status::Continue
        } else {
            status
        }
    }

    fn on(&self, name: &str) -> bool {
        self.knobs.off != Some(name)
    }

    /// Notes the value the current stage's macro has now.
    fn saw(&mut self, ctx: &Context<'_>, stage: &str, message: bool) {
        if !self.on("macros") {
            return;
        }
        let name = MACROS.iter().find(|(s, _)| *s == stage).unwrap().1;
        let value = ctx.macros.text(name).unwrap_or_else(|| "-".into());
        let into = if message {
            &mut self.message_macros
        } else {
            &mut self.connection_macros
        };
        into.push(format!("{stage}={value}"));
    }

    fn has_rcpt(&self, local: &str) -> bool {
        let wanted = format!("<{local}@");
        self.recipients.iter().any(|r| r.starts_with(&wanted))
    }

    fn multi_line(code: u16, enhanced: &str) -> Status {
        Status::Reply(ReplyText::new(code, Some(enhanced), &["first line", "second line"]).unwrap())
    }

    /// Every modification, for a message to `<every@...>`.
    fn modify(&self, a: &mut EomActions) {
        let steps: [(&str, &Modification); 9] = [
            ("add-header", &|a| a.add_header("X-Added", "added").unwrap()),
            ("insert-header", &|a| {
                a.insert_header(1, "X-Inserted", "inserted").unwrap()
            }),
            ("change-header", &|a| {
                a.change_header(1, "Subject", "changed").unwrap()
            }),
            ("delete-header", &|a| {
                a.change_header(1, "X-Remove", "").unwrap()
            }),
            ("change-from", &|a| {
                a.change_from("<new-sender@forkpool.test>", Some("SIZE=100"))
                    .unwrap()
            }),
            ("add-rcpt", &|a| {
                a.add_rcpt("<added@forkpool.test>").unwrap();
                a.add_rcpt_par("<added-par@forkpool.test>", Some("NOTIFY=NEVER"))
                    .unwrap();
            }),
            ("delete-rcpt", &|a| {
                a.delete_rcpt("<gone@forkpool.test>").unwrap()
            }),
            ("replace-body", &|a| {
                // Two calls, two chunks: the second appends.
                a.replace_body(b"new body, part one\r\n").unwrap();
                a.replace_body(b"part two\r\n").unwrap();
            }),
            ("quarantine", &|a| a.quarantine("held for review").unwrap()),
        ];
        for (name, step) in steps {
            if self.on(name) {
                step(a);
            }
        }
    }
}

impl Filter for Every {
    type Shared = Knobs;

    fn new(knobs: &Arc<Knobs>) -> Self {
        Every {
            knobs: Arc::clone(knobs),
            connection_macros: Vec::new(),
            message_macros: Vec::new(),
            recipients: Vec::new(),
            skip_body: false,
        }
    }

    fn options(_: &Knobs) -> FilterOptions {
        FilterOptions {
            actions: Actions::ADD_HEADERS
                | Actions::CHANGE_HEADERS
                | Actions::CHANGE_BODY
                | Actions::ADD_RCPT
                | Actions::ADD_RCPT_PAR
                | Actions::DELETE_RCPT
                | Actions::QUARANTINE
                | Actions::CHANGE_FROM,
            // Every stage, each answered; the body may be skipped.
            protocol: Protocol::SKIP,
            macros: vec![(Stage::Connect, "j".into()), (Stage::Mail, "i".into())],
        }
    }

    fn connect(&mut self, ctx: &Context<'_>, _: &[u8], _: &Address) -> Status {
        self.saw(ctx, "connect", false);
        Status::Continue
    }

    fn helo(&mut self, ctx: &Context<'_>, _: &[u8]) -> Status {
        self.saw(ctx, "helo", false);
        Status::Continue
    }

    fn mail(&mut self, ctx: &Context<'_>, sender: &[u8], _: &[Vec<u8>]) -> Status {
        self.message_macros.clear();
        self.recipients.clear();
        self.skip_body = false;
        self.saw(ctx, "mail", true);
        if sender.starts_with(b"<tempfail@") {
            return self.verdict("mail-tempfail", Status::Tempfail);
        }
        if sender.starts_with(b"<reject@") {
            return self.verdict("mail-reject", Status::Reject);
        }
        Status::Continue
    }

    fn rcpt(&mut self, ctx: &Context<'_>, recipient: &[u8], _: &[Vec<u8>]) -> Status {
        self.saw(ctx, "rcpt", true);
        let recipient = String::from_utf8_lossy(recipient).into_owned();
        let status = if recipient.starts_with("<reply@") {
            self.verdict("rcpt-reply", Self::multi_line(550, "5.7.1"))
        } else if recipient.starts_with("<discard@") {
            self.verdict("rcpt-discard", Status::Discard)
        } else if recipient.starts_with("<accept@") {
            self.verdict("rcpt-accept", Status::Accept)
        } else {
            Status::Continue
        };
        if status == Status::Continue {
            self.recipients.push(recipient);
        }
        status
    }

    fn data(&mut self, ctx: &Context<'_>) -> Status {
        self.saw(ctx, "data", true);
        if self.has_rcpt("data-tempfail") {
            return self.verdict("data-tempfail", Status::Tempfail);
        }
        Status::Continue
    }

    fn header(&mut self, _: &Context<'_>, name: &[u8], _: &[u8]) -> Status {
        if name.eq_ignore_ascii_case(b"X-Skip-Body") {
            self.skip_body = true;
        }
        Status::Continue
    }

    fn eoh(&mut self, ctx: &Context<'_>) -> Status {
        self.saw(ctx, "eoh", true);
        Status::Continue
    }

    fn body(&mut self, _: &Context<'_>, _: &[u8]) -> Status {
        if self.skip_body {
            return self.verdict("body-skip", Status::Skip);
        }
        Status::Continue
    }

    fn eom(&mut self, ctx: &Context<'_>, actions: &mut EomActions) -> Status {
        self.saw(ctx, "eom", true);
        let seen = [&self.connection_macros[..], &self.message_macros[..]].concat();
        actions.add_header("X-Macros", &seen.join(" ")).unwrap();
        if self.has_rcpt("every") {
            self.modify(actions);
        }
        if self.has_rcpt("big-body") && self.on("replace-body") {
            actions.replace_body(&big_body()).unwrap();
        }
        let verdicts = [
            ("eom-accept", Status::Accept),
            ("eom-discard", Status::Discard),
            ("eom-reject", Status::Reject),
            ("eom-tempfail", Status::Tempfail),
            ("eom-reply", Self::multi_line(451, "4.7.1")),
        ];
        for (name, status) in verdicts {
            if self.has_rcpt(name) {
                return self.verdict(name, status);
            }
        }
        Status::Continue
    }

    fn abort(&mut self, _: &Context<'_>) {
        self.message_macros.clear();
        self.recipients.clear();
    }

    fn unknown(&mut self, _: &Context<'_>, _: &[u8]) -> Status {
        self.verdict("unknown-reject", Status::Reject)
    }
}

/// The session pool serving [`Every`]; shut down on drop.
struct Served {
    pool: Option<SessionPool<MilterSession<Every>>>,
    /// Where miltertest connects: `inet:PORT@127.0.0.1` or `unix:PATH`.
    socket: String,
    /// The Unix socket's path, removed on drop.
    path: Option<PathBuf>,
}

impl Served {
    fn pool(knobs: Knobs) -> SessionPool<MilterSession<Every>> {
        let config = SessionConfig {
            workers: 2,
            ..SessionConfig::default()
        };
        SessionPool::<MilterSession<Every>>::start(config, MilterContext::new(knobs))
            .expect("start the session pool")
    }

    /// On a loopback TCP port, as an MTA reaches a filter.
    fn on_loopback_port(knobs: Knobs) -> Served {
        let pool = Self::pool(knobs);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        pool.serve(listener).unwrap();
        Served {
            pool: Some(pool),
            socket: format!("inet:{port}@127.0.0.1"),
            path: None,
        }
    }

    /// On a Unix socket: miltertest writes a macro and its command as two
    /// small packets, which over TCP wait on a delayed ACK (~40 ms a
    /// step); the sweep of [`each_check_fails_without_its_mechanism`]
    /// runs the script 22 times, so it uses this.
    fn on_unix_socket(knobs: Knobs) -> Served {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let path = std::env::temp_dir().join(format!(
            "forkpool-miltertest-{}-{n}.sock",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        let pool = Self::pool(knobs);
        pool.serve(UnixListener::bind(&path).unwrap()).unwrap();
        Served {
            pool: Some(pool),
            socket: format!("unix:{}", path.display()),
            path: Some(path),
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.shutdown();
        }
        if let Some(path) = &self.path {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Kills miltertest by pid if the test ends before it does.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// A milter client nobody here wrote, with its script.
enum Client {
    /// Debian's `miltertest` running `every_modification.lua`.
    Lua(PathBuf),
    /// A Python with PyPI's `miltertest` running `every_modification.py`.
    Python(PathBuf),
}

impl Client {
    /// Debian's miltertest, through [`require::require_program`].
    fn lua() -> Option<Client> {
        require::require_program("miltertest", "run bash .ci/deps/mail.sh").map(Client::Lua)
    }

    /// The virtual environment `.ci/deps/miltertest-py.sh` makes.
    fn python() -> Option<Client> {
        let python = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .parent()
            .unwrap()
            .join("miltertest-venv/bin/python");
        require::require(
            python.is_file(),
            "PyPI's miltertest in target/miltertest-venv",
            "run bash .ci/deps/miltertest-py.sh",
        )
        .then_some(Client::Python(python))
    }

    fn command(&self, socket: &str) -> Command {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/miltertest");
        match self {
            Client::Lua(miltertest) => {
                let mut command = Command::new(miltertest);
                command
                    .arg("-D")
                    .arg(format!("socket={socket}"))
                    .arg("-s")
                    .arg(dir.join("every_modification.lua"));
                command
            }
            Client::Python(python) => {
                let mut command = Command::new(python);
                command.arg(dir.join("every_modification.py")).arg(socket);
                command
            }
        }
    }

    /// Runs the script against `socket`: whether it succeeded, and what
    /// it printed.
    fn run(&self, socket: &str) -> (bool, String) {
        let child = self
            .command(socket)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the milter client");
        let mut running = Running(child);
        // Its own reads time out after 10 s; this bounds the whole script.
        let deadline = Instant::now() + Duration::from_secs(20);
        while running.0.try_wait().unwrap().is_none() {
            if Instant::now() >= deadline {
                drop(running);
                return (false, "the client timed out after 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let ok = running.0.wait().is_ok_and(|s| s.success());
        let mut text = String::new();
        for pipe in [
            running
                .0
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read>),
            running
                .0
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read>),
        ]
        .into_iter()
        .flatten()
        {
            let mut pipe = pipe;
            let _ = pipe.read_to_string(&mut text);
        }
        (ok, text)
    }
}

/// Runs `client`'s script against the filter on a loopback port; it
/// must pass every check.
fn passes(client: Option<Client>) {
    let Some(client) = client else {
        return;
    };
    let served = Served::on_loopback_port(Knobs::default());
    let (ok, output) = client.run(&served.socket);
    assert!(
        ok && output.contains("every check passed"),
        "the script failed:\n{output}"
    );
}

#[test]
fn miltertest_checks_every_stage_and_every_modification() {
    passes(Client::lua());
}

#[test]
fn python_miltertest_checks_sender_recipient_arguments_and_a_big_body() {
    passes(Client::python());
}

/// Each mechanism a script checks, turned off, fails the check named
/// after it.
#[test]
fn each_check_fails_without_its_mechanism() {
    let (Some(lua), Some(python)) = (Client::lua(), Client::python()) else {
        return;
    };
    let lua_knobs = [
        "macros",
        "mail-tempfail",
        "mail-reject",
        "rcpt-reply",
        "rcpt-discard",
        "rcpt-accept",
        "data-tempfail",
        "body-skip",
        "unknown-reject",
        "add-header",
        "insert-header",
        "change-header",
        "delete-header",
        "add-rcpt",
        "delete-rcpt",
        "replace-body",
        "quarantine",
        "eom-accept",
        "eom-discard",
        "eom-reject",
        "eom-tempfail",
        "eom-reply",
    ];
    let python_knobs = ["rcpt-reply", "change-from", "add-rcpt", "replace-body"];
    let runs =
        (lua_knobs.iter().map(|k| (&lua, *k))).chain(python_knobs.iter().map(|k| (&python, *k)));
    for (client, off) in runs {
        let served = Served::on_unix_socket(Knobs { off: Some(off) });
        let (ok, output) = client.run(&served.socket);
        assert!(!ok, "{off} off, yet the script passed:\n{output}");
        assert!(
            output.contains(&format!("check failed: {off}")),
            "{off} off: the script failed elsewhere:\n{output}"
        );
    }
}
