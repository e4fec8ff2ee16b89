//! A private Postfix for the mail tests, with a milter in front and a
//! capturing `smtp-sink` behind: mail sent to it over SMTP goes through
//! the milter, then is relayed to the sink, which keeps every message as
//! a file the test reads.
//!
//! Debian's `postfix` package (`bash .ci/deps/mail.sh`) is used, never its
//! system instance: the test runs Postfix's `master` itself, as root (it
//! must: Postfix daemons drop to `mail_owner`), with `-c DIR/etc`. Unlike
//! `postfix -c DIR start`, `master -c` needs no entry in the system
//! `main.cf`'s `alternate_config_directories`, and it stays the test's
//! child: it runs in a process group of its own, so Drop stops it and every
//! daemon it started by that group's id. Start-up (config, queue, master,
//! sink) takes about 0.1 s on an idle machine (its `main.cf` is dated in
//! the past: Postfix rereads a fresh one for 2 s, see [`write_cold`]);
//! mail crosses it in about 0.1 s more.
//!
//! One instance lives in one temp directory `DIR`:
//! - `DIR/etc/`: `config_directory` (`main.cf`, `master.cf`, written
//!   here; every daemon is unchrooted, DNS is never asked);
//! - `DIR/queue/`: `queue_directory`, root-owned, its subdirectories owned
//!   by `postfix` (`hold/` is the quarantine);
//! - `DIR/data/`: `data_directory`, owned by `postfix`;
//! - `DIR/maillog`: Postfix's log (`maillog_file`, through `postlogd`:
//!   there is no syslog), shown when a test fails;
//! - `DIR/sink/`: one file per message `smtp-sink` received (the headers
//!   it adds, `X-Rcpt-Args: ...` among them, then the message);
//! - `DIR/master.out`, `DIR/sink.out`: the two programs' own output.
//!
//! Ports: smtpd on one free 127.0.0.1 port, the sink on another, the
//! milter on the one the caller gives (`smtpd_milters = inet:...`, with
//! `milter_default_action = tempfail`).
//!
//! By hand, as root, with [`main_cf`] and [`master_cf`] written to
//! `DIR/etc` (`touch -d '1 min ago' DIR/etc/main.cf`) and the directories
//! made as [`Postfix::start`] makes them:
//!
//! ```text
//! smtp-sink -d DIR/sink/m. -u postfix 127.0.0.1:SINKPORT 100 &
//! /usr/lib/postfix/sbin/master -c DIR/etc -d &   # kill -TERM it to stop
//! postqueue -c DIR/etc -j                          # the queue, as JSON
//! postsuper -c DIR/etc -H ALL; postqueue -c DIR/etc -f   # release, flush
//! ```
#![allow(dead_code)]

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::{Group, Pid, User};

use super::common::{require, require_program, temp_path};
use super::listening::{free_port, wait_listening};
use super::smtp_client::{message_text, Smtp, Transaction};

const INSTALL: &str = "run bash .ci/deps/mail.sh";

/// How long any one wait of this harness may last.
pub const WAIT: Duration = Duration::from_secs(10);

/// The Postfix programs a private instance needs.
#[derive(Debug, Clone)]
pub struct PostfixPrograms {
    master: PathBuf,
    smtp_sink: PathBuf,
    postqueue: PathBuf,
    postsuper: PathBuf,
}

/// Postfix's programs, or `None` when the test must return without
/// running (see `common::require`: under CI, missing ones fail the test).
/// Postfix's `master` runs only as root.
pub fn require_postfix() -> Option<PostfixPrograms> {
    let postconf = require_program("postconf", INSTALL)?;
    let smtp_sink = require_program("smtp-sink", INSTALL)?;
    let postqueue = require_program("postqueue", INSTALL)?;
    let postsuper = require_program("postsuper", INSTALL)?;
    let out = Command::new(postconf)
        .args(["-dh", "daemon_directory"])
        .output()
        .expect("run postconf");
    let master = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("master");
    if !require(master.is_file(), "Postfix's master daemon", INSTALL)
        || !require(
            nix::unistd::geteuid().is_root(),
            "root (Postfix's master runs as root)",
            "run the mail tests as root, as CI does",
        )
        || !require(
            User::from_name("postfix").ok().flatten().is_some(),
            "the `postfix` user",
            INSTALL,
        )
    {
        return None;
    }
    Some(PostfixPrograms {
        master,
        smtp_sink,
        postqueue,
        postsuper,
    })
}

/// `main.cf` for an instance in `dir`, listening on `smtpd_port`,
/// filtering with the milter on `milter_port`, relaying to `sink_port`.
pub fn main_cf(dir: &Path, milter_port: u16, sink_port: u16) -> String {
    let dir = dir.display();
    format!(
        "compatibility_level = 3.6
queue_directory = {dir}/queue
data_directory = {dir}/data
mail_owner = postfix
setgid_group = postdrop
maillog_file = {dir}/maillog
maillog_file_prefixes = {dir}
myhostname = postfix.forkpool.test
mydomain = forkpool.test
inet_interfaces = 127.0.0.1
inet_protocols = ipv4
mynetworks = 127.0.0.0/8
mydestination =
alias_maps =
alias_database =
relayhost = [127.0.0.1]:{sink_port}
disable_dns_lookups = yes
smtp_dns_support_level = disabled
smtp_host_lookup = native
smtpd_peername_lookup = no
smtpd_milters = inet:127.0.0.1:{milter_port}
milter_default_action = tempfail
milter_connect_timeout = 5s
milter_command_timeout = 10s
milter_content_timeout = 10s
"
    )
}

/// `master.cf` with smtpd on 127.0.0.1:`smtpd_port` and only the daemons
/// mail needs to go from smtpd to the relay and the queue tools to work;
/// none chrooted (the queue directory has no copy of the system files).
pub fn master_cf(smtpd_port: u16) -> String {
    let services = [
        format!("127.0.0.1:{smtpd_port} inet n - n - - smtpd"),
        "pickup unix n - n 60 1 pickup".into(),
        "cleanup unix n - n - 0 cleanup".into(),
        "qmgr unix n - n 300 1 qmgr".into(),
        "rewrite unix - - n - - trivial-rewrite".into(),
        "bounce unix - - n - 0 bounce".into(),
        "defer unix - - n - 0 bounce".into(),
        "trace unix - - n - 0 bounce".into(),
        "verify unix - - n - 1 verify".into(),
        "flush unix n - n 1000? 0 flush".into(),
        "proxymap unix - - n - - proxymap".into(),
        "smtp unix - - n - - smtp".into(),
        "relay unix - - n - - smtp".into(),
        "showq unix n - n - - showq".into(),
        "error unix - - n - - error".into(),
        "retry unix - - n - - error".into(),
        "discard unix - - n - - discard".into(),
        "anvil unix - - n - 1 anvil".into(),
        "scache unix - - n - 1 scache".into(),
        "postlog unix-dgram n - n - 1 postlogd".into(),
    ];
    services.join("\n") + "\n"
}

/// Writes `text` to `path`, dated a minute ago. Postfix reads a `main.cf`
/// changed in the last second or two again and again, 300 ms apart, until
/// it has "cooled down" (in `master` and in every daemon it starts): a
/// fresh one costs each of them about 2 s.
fn write_cold(path: &Path, text: &str) {
    let file = std::fs::File::create(path).unwrap();
    std::io::Write::write_all(&mut &file, text.as_bytes()).unwrap();
    let past = std::time::SystemTime::now() - Duration::from_secs(60);
    file.set_modified(past).unwrap();
}

/// Creates the queue directory as Postfix's `postfix-files` lays it out:
/// root's top, `postfix`'s subdirectories, `postdrop`'s group on the two
/// that local submission writes through.
fn create_queue(queue: &Path) {
    let postfix = User::from_name("postfix").unwrap().expect("a postfix user");
    let postdrop = Group::from_name("postdrop").ok().flatten().map(|g| g.gid);
    let dir = |name: &str, mode: u32, group: Option<nix::unistd::Gid>| {
        let path = queue.join(name);
        std::fs::create_dir_all(&path).unwrap();
        std::os::unix::fs::chown(&path, Some(postfix.uid.as_raw()), group.map(|g| g.as_raw()))
            .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    for name in [
        "active", "bounce", "corrupt", "defer", "deferred", "flush", "hold", "incoming", "private",
        "saved", "trace",
    ] {
        dir(name, 0o700, None);
    }
    dir("maildrop", 0o730, postdrop);
    dir("public", 0o710, postdrop);
    std::fs::create_dir_all(queue.join("pid")).unwrap();
}

/// Makes `path` a directory `postfix` owns.
fn postfix_dir(path: &Path) {
    let postfix = User::from_name("postfix").unwrap().expect("a postfix user");
    std::fs::create_dir_all(path).unwrap();
    std::os::unix::fs::chown(path, Some(postfix.uid.as_raw()), None).unwrap();
}

/// One message as `smtp-sink` kept it.
#[derive(Debug, Clone)]
pub struct Delivered {
    /// Every header, the sink's own (`X-Rcpt-Args`, ...) first, as name
    /// and unfolded value.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: String,
}

impl Delivered {
    fn parse(raw: &str) -> Delivered {
        let (head, body) = raw.split_once("\n\n").unwrap_or((raw, ""));
        let mut headers: Vec<(String, String)> = Vec::new();
        for line in head.lines() {
            if line.starts_with([' ', '\t']) {
                if let Some((_, value)) = headers.last_mut() {
                    value.push(' ');
                    value.push_str(line.trim());
                }
            } else if let Some((name, value)) = line.split_once(':') {
                headers.push((name.to_string(), value.trim().to_string()));
            }
        }
        Delivered {
            headers,
            body: body.to_string(),
        }
    }

    /// The values of every header named `name` (any case).
    pub fn header_values(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The envelope recipients the sink got (`X-Rcpt-Args`, first word).
    pub fn recipients(&self) -> Vec<&str> {
        self.header_values("X-Rcpt-Args")
            .into_iter()
            .filter_map(|v| v.split_whitespace().next())
            .map(|a| a.trim_matches(['<', '>']))
            .collect()
    }
}

/// A message in Postfix's queue, from `postqueue -j`.
#[derive(Debug, Clone)]
pub struct Queued {
    /// `hold` (quarantined), `deferred`, `active`, `incoming`, ...
    pub queue_name: String,
    /// Postfix's queue id.
    pub queue_id: String,
    /// The envelope sender.
    pub sender: String,
    /// The envelope recipients.
    pub recipients: Vec<String>,
}

/// A process this harness started, in a process group of its own, stopped
/// with its whole group on Drop: SIGTERM, a bounded wait, then SIGKILL.
struct ProcessGroup {
    child: Child,
    pid: i32,
}

impl ProcessGroup {
    fn spawn(mut command: Command, output: &Path) -> ProcessGroup {
        let log = std::fs::File::create(output).unwrap();
        let child = command
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start a Postfix program");
        ProcessGroup {
            pid: child.id() as i32,
            child,
        }
    }

    fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        let group = Pid::from_raw(-self.pid);
        let _ = kill(group, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(3);
        while !self.exited() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        // Daemons slow to notice their master's end, or a master that
        // would not end.
        let _ = kill(group, Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

/// A private Postfix and its sink.
pub struct Postfix {
    programs: PostfixPrograms,
    // Declared before `dir`'s removal in Drop runs: both processes stop
    // first.
    master: Option<ProcessGroup>,
    sink: Option<ProcessGroup>,
    /// The smtpd address mail is sent to.
    pub addr: SocketAddr,
    /// The instance's directory (see the module docs).
    pub dir: PathBuf,
    /// How long start-up took, for reports.
    pub started_in: Duration,
}

impl Postfix {
    /// Starts a private Postfix filtering with the milter on 127.0.0.1:
    /// `milter_port`, and its sink; returns once both listen.
    pub fn start(programs: &PostfixPrograms, milter_port: u16) -> Postfix {
        let began = Instant::now();
        let dir = temp_path("postfix");
        std::fs::create_dir_all(dir.join("etc")).unwrap();
        create_queue(&dir.join("queue"));
        postfix_dir(&dir.join("data"));
        postfix_dir(&dir.join("sink"));
        let mut postfix = Postfix {
            programs: programs.clone(),
            master: None,
            sink: None,
            addr: "127.0.0.1:1".parse().unwrap(),
            dir,
            started_in: Duration::ZERO,
        };
        eprintln!("T dirs {:?}", began.elapsed());
        let sink_port = postfix.start_sink();
        eprintln!("T sink {:?}", began.elapsed());
        postfix.start_master(milter_port, sink_port);
        postfix.started_in = began.elapsed();
        postfix
    }

    /// Starts `smtp-sink` on a free port (retrying if another process took
    /// it first); returns the port.
    fn start_sink(&mut self) -> u16 {
        for _ in 0..3 {
            let port = free_port();
            let mut command = Command::new(&self.programs.smtp_sink);
            command
                .arg("-d")
                .arg(self.dir.join("sink/m."))
                .args(["-u", "postfix"])
                .arg(format!("127.0.0.1:{port}"))
                .arg("100");
            let mut sink = ProcessGroup::spawn(command, &self.dir.join("sink.out"));
            if wait_listening(sink.pid, port, WAIT, || sink.exited()) {
                self.sink = Some(sink);
                return port;
            }
        }
        panic!("smtp-sink did not start:\n{}", self.file("sink.out"));
    }

    /// Writes the configuration and starts `master` on a free smtpd port
    /// (retrying if another process took it first).
    fn start_master(&mut self, milter_port: u16, sink_port: u16) {
        let etc = self.dir.join("etc");
        write_cold(
            &etc.join("main.cf"),
            &main_cf(&self.dir, milter_port, sink_port),
        );
        for _ in 0..3 {
            let port = free_port();
            std::fs::write(etc.join("master.cf"), master_cf(port)).unwrap();
            let mut command = Command::new(&self.programs.master);
            // -d: stay in the test's session (no setsid), so the process
            // group above holds it; -e: a leaked master ends by itself.
            command.arg("-c").arg(&etc).args(["-d", "-e", "900"]);
            let mut master = ProcessGroup::spawn(command, &self.dir.join("master.out"));
            if wait_listening(master.pid, port, WAIT, || master.exited()) {
                self.master = Some(master);
                self.addr = SocketAddr::from(([127, 0, 0, 1], port));
                return;
            }
        }
        panic!("Postfix did not start:\n{}", self.log());
    }

    /// The master's pid.
    pub fn pid(&self) -> i32 {
        self.master.as_ref().map_or(0, |m| m.pid)
    }

    fn file(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap_or_default()
    }

    /// Postfix's log and the master's output, for failure messages.
    pub fn log(&self) -> String {
        format!("{}{}", self.file("master.out"), self.file("maillog"))
    }

    /// An SMTP connection to smtpd, greeted.
    pub fn connect(&self) -> Smtp {
        Smtp::connect(self.addr, WAIT * 2)
            .unwrap_or_else(|e| panic!("SMTP connect: {e}\n{}", self.log()))
    }

    /// Sends one message from `from` to `rcpts`, its subject `token` (see
    /// [`message_text`]), on a connection of its own after `EHLO`.
    pub fn send(&self, from: &str, rcpts: &[&str], token: &str) -> Transaction {
        let mut smtp = self.connect();
        let ehlo = smtp.command("EHLO client.forkpool.test").unwrap();
        assert_eq!(ehlo.code, 250, "EHLO: {ehlo:?}\n{}", self.log());
        let text = message_text(from, rcpts.first().unwrap_or(&""), token);
        let sent = smtp
            .send(from, rcpts, &text)
            .unwrap_or_else(|e| panic!("SMTP: {e}\n{}", self.log()));
        smtp.quit();
        sent
    }

    /// The messages in the sink so far whose subject is `token`, complete
    /// (their last body line written).
    pub fn delivered(&self, token: &str) -> Vec<Delivered> {
        let Ok(files) = std::fs::read_dir(self.dir.join("sink")) else {
            return Vec::new();
        };
        let end = format!("\nend of {token}\n");
        files
            .filter_map(Result::ok)
            .filter_map(|f| std::fs::read_to_string(f.path()).ok())
            .filter(|text| text.contains(&end))
            .map(|text| Delivered::parse(&text))
            .filter(|m| m.header_values("Subject") == [token])
            .collect()
    }

    /// Waits (bounded) for the message `token` to reach the sink.
    pub fn wait_delivered(&self, token: &str) -> Delivered {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(message) = self.delivered(token).pop() {
                return message;
            }
            assert!(
                Instant::now() < deadline,
                "message {token} never reached the sink; queue {:?}\n{}",
                self.queue(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Every message in the queue (`postqueue -j`).
    pub fn queue(&self) -> Vec<Queued> {
        let out = self.postfix_tool(&self.programs.postqueue, &["-j"]);
        out.lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .map(|m| Queued {
                queue_name: m["queue_name"].as_str().unwrap_or("").to_string(),
                queue_id: m["queue_id"].as_str().unwrap_or("").to_string(),
                sender: m["sender"].as_str().unwrap_or("").to_string(),
                recipients: m["recipients"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|r| r["address"].as_str().map(str::to_string))
                    .collect(),
            })
            .collect()
    }

    /// The quarantined messages: the `hold` queue.
    pub fn held(&self) -> Vec<Queued> {
        let mut queue = self.queue();
        queue.retain(|m| m.queue_name == "hold");
        queue
    }

    /// Releases every held message (`postsuper -H ALL`) and flushes the
    /// queue (`postqueue -f`) so they are delivered now.
    pub fn release_held(&self) {
        self.postfix_tool(&self.programs.postsuper, &["-H", "ALL"]);
        self.flush();
    }

    /// Asks Postfix to deliver every queued message now (`postqueue -f`).
    pub fn flush(&self) {
        self.postfix_tool(&self.programs.postqueue, &["-f"]);
    }

    fn postfix_tool(&self, program: &Path, args: &[&str]) -> String {
        let out = Command::new(program)
            .arg("-c")
            .arg(self.dir.join("etc"))
            .args(args)
            .output()
            .expect("run a Postfix tool");
        assert!(
            out.status.success(),
            "{} {args:?}: {}\n{}",
            program.display(),
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Postfix {
    fn drop(&mut self) {
        self.master.take();
        self.sink.take();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
