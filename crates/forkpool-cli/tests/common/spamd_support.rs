//! Helpers for `tests/spamd.rs`: `clients/perl/forkpool-spamd` as a pool,
//! Debian's `spamd` beside it, the real `spamc` as the client, raw
//! protocol exchanges, the test messages, and the one normalisation the
//! answer comparison applies.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{alive, forkpool_bin, kill9, require, signal_pid, DemoPool};

/// The program under test.
pub const FORKPOOL_SPAMD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../clients/perl/forkpool-spamd"
);
/// Where Debian's spamassassin package keeps its sample messages.
pub const SAMPLES: &str = "/usr/share/doc/spamassassin/examples";
/// Debian's spamd.
pub const DEBIAN_SPAMD: &str = "/usr/sbin/spamd";

/// How long a server may take to start or a state to be reached on a
/// loaded machine; a quiet one never waits this long.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// The options both servers run with: local tests only, no per-user
/// files, no Bayes, stderr logging; as root, the package's user (spamd
/// refuses to check mail as root).
pub fn common_options() -> Vec<String> {
    let mut args: Vec<String> = [
        "-L",
        "-x",
        "--cf=use_bayes 0",
        "--cf=bayes_auto_learn 0",
        "--cf=skip_rbl_checks 1",
        "-s",
        "stderr",
    ]
    .map(String::from)
    .to_vec();
    if running_as_root() {
        args.extend(["-u", "debian-spamd"].map(String::from));
    }
    args
}

/// Perl's hash order fixed, so that rules with equal scores are listed
/// in the same order by both servers (`-y`, `-R`).
pub const FIXED_HASH_ORDER: [(&str, &str); 2] =
    [("PERL_HASH_SEED", "0"), ("PERL_PERTURB_KEYS", "0")];

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1).map(|euid| euid == "0"))
        .unwrap_or(false)
}

/// Whether SpamAssassin, Debian's spamd, spamc and the samples are here
/// (see `common::require`: missing under CI is a failure).
pub fn require_spamassassin() -> bool {
    let sa = Command::new("perl")
        .args(["-MMail::SpamAssassin", "-e1"])
        .output()
        .is_ok_and(|o| o.status.success());
    let spamc = Command::new("spamc")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    let found = sa
        && spamc
        && std::path::Path::new(DEBIAN_SPAMD).is_file()
        && std::path::Path::new(SAMPLES)
            .join("sample-spam.txt")
            .is_file();
    require(
        found,
        "SpamAssassin, spamd and spamc",
        "run bash .ci/deps/spamassassin.sh",
    )
}

/// `forkpool-spamd OPTIONS EXTRA` as a pool on an ephemeral loopback
/// port, once it is ready.
pub fn start_forkpool_spamd(extra: &[&str]) -> DemoPool {
    let mut command = Command::new("perl");
    command
        .arg(FORKPOOL_SPAMD)
        .args(common_options())
        .env("FORKPOOL_BIN", forkpool_bin())
        .envs(FIXED_HASH_ORDER);
    DemoPool::launch(command, extra, &[], true)
}

/// Debian's spamd on a loopback port, stopped (with its children) on drop.
pub struct DebianSpamd {
    child: Child,
    pub port: u16,
}

impl DebianSpamd {
    /// Starts `/usr/sbin/spamd OPTIONS EXTRA` and waits until it answers
    /// a PING.
    pub fn start(extra: &[&str]) -> DebianSpamd {
        let port = free_port();
        let child = Command::new(DEBIAN_SPAMD)
            .args(common_options())
            .args(extra)
            .arg("-i")
            .arg(format!("127.0.0.1:{port}"))
            .envs(FIXED_HASH_ORDER)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start Debian's spamd");
        let spamd = DebianSpamd { child, port };
        let deadline = Instant::now() + PATIENCE;
        while !ping(port) {
            assert!(
                Instant::now() < deadline,
                "Debian's spamd never answered PING"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        spamd
    }
}

impl Drop for DebianSpamd {
    fn drop(&mut self) {
        let pid = self.child.id() as i32;
        let path = format!("/proc/{pid}/task/{pid}/children");
        let children: Vec<i32> = std::fs::read_to_string(path)
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        let _ = self.child.kill();
        let _ = self.child.wait();
        for child in children.into_iter().filter(|p| alive(*p)) {
            kill9(child);
        }
    }
}

/// A port nobody listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral port")
}

/// Whether the server on `port` answers spamc's PING.
pub fn ping(port: u16) -> bool {
    Command::new("spamc")
        .args(["-d", "127.0.0.1", "-p", &port.to_string(), "-K"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// What spamc printed and its exit code.
#[derive(Debug, PartialEq, Eq)]
pub struct Answer {
    pub code: Option<i32>,
    pub output: Vec<u8>,
}

/// `spamc -d 127.0.0.1 -p PORT FLAGS < message`, with a bounded wait.
pub fn spamc(port: u16, flags: &[&str], message: &[u8]) -> Answer {
    let mut child = Command::new("spamc")
        .args(["-d", "127.0.0.1", "-p", &port.to_string(), "-t", "60"])
        .args(flags)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run spamc");
    let mut stdin = child.stdin.take().unwrap();
    let message = message.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&message);
    });
    let out = child.wait_with_output().expect("spamc output");
    writer.join().unwrap();
    Answer {
        code: out.status.code(),
        output: out.stdout,
    }
}

/// Sends `request` on a fresh connection to `port`, half-closes, and
/// returns everything the server answered before closing (20 s bound).
pub fn raw(port: u16, request: &[u8]) -> Vec<u8> {
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream.write_all(request).expect("send the request");
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    answer
}

/// The one thing the comparison normalises, and why: a report-safe
/// rewrite of a spam message (PROCESS, `-E`) carries the time of the
/// check (the date line after `with SpamAssassin (version ...);`) and a
/// MIME boundary made of the time and a random number
/// (`----------=_XXXXXXXX.XXXXXXXX`). Both are replaced by placeholders;
/// everything else must be equal byte for byte.
pub fn normalize(bytes: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::with_capacity(text.len());
    let mut after_version = false;
    for line in text.split_inclusive('\n') {
        if after_version && line.starts_with('\t') {
            out.push_str("\t<date>\n");
            after_version = false;
            continue;
        }
        after_version =
            line.contains("with SpamAssassin (version ") && line.trim_end().ends_with(';');
        out.push_str(&replace_boundaries(line));
    }
    out.into_bytes()
}

fn replace_boundaries(line: &str) -> String {
    const MARK: &str = "----------=_";
    let mut out = String::new();
    let mut rest = line;
    while let Some(at) = rest.find(MARK) {
        out.push_str(&rest[..at + MARK.len()]);
        rest = &rest[at + MARK.len()..];
        let id_len = rest
            .find(|c: char| !(c.is_ascii_hexdigit() || c == '.'))
            .unwrap_or(rest.len());
        if id_len == 17 {
            out.push_str("<boundary>");
            rest = &rest[id_len..];
        }
    }
    out.push_str(rest);
    out
}

/// The test messages: the package's samples, and variations of them.
pub fn messages() -> Vec<(String, Vec<u8>)> {
    let spam = std::fs::read(format!("{SAMPLES}/sample-spam.txt")).expect("sample-spam.txt");
    let ham = std::fs::read(format!("{SAMPLES}/sample-nonspam.txt")).expect("sample-nonspam.txt");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let crlf = text(&ham).replace('\n', "\r\n").into_bytes();
    let subject = text(&ham)
        .replacen("Subject: ", "X-Test-Variation: 1\nSubject: Re: ", 1)
        .into_bytes();
    let unterminated = text(&spam).trim_end().as_bytes().to_vec();
    let mut big = ham.clone();
    while big.len() < 200 * 1024 {
        big.extend_from_slice(b"\nfiller line to make the message larger than most mail\n");
    }
    let mime = b"From: someone@example.org\nTo: you@example.net\nSubject: attachment\n\
         Message-Id: <mime-1@example.org>\nMIME-Version: 1.0\n\
         Content-Type: multipart/mixed; boundary=\"b1\"\n\n--b1\n\
         Content-Type: text/plain\n\nsee attached\n--b1\n\
         Content-Type: application/octet-stream; name=\"a.bin\"\n\
         Content-Transfer-Encoding: base64\n\nAAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n--b1--\n"
    .to_vec();
    vec![
        ("sample-spam".into(), spam),
        ("sample-nonspam".into(), ham),
        ("nonspam-crlf".into(), crlf),
        ("nonspam-new-subject".into(), subject),
        ("spam-unterminated".into(), unterminated),
        ("nonspam-200k".into(), big),
        ("mime-attachment".into(), mime),
    ]
}

/// Sends SIGTERM to `pid` (a name for the reader of a test).
pub fn terminate(pid: i32) {
    signal_pid(pid, "TERM");
}

/// The pool's status, asked again while it does not answer: on a
/// machine loaded by SpamAssassin's checks a `forkpool status` can time
/// out, which says nothing about the pool.
pub fn status_of(pool: &DemoPool) -> serde_json::Value {
    wait_for_status(pool, PATIENCE, |_| true)
        .unwrap_or_else(|| panic!("the pool never answered status\n{}", pool.stderr.dump()))
}

/// Polls the pool's status until `cond` holds (a status that does not
/// answer counts as not yet); `None` after `timeout`.
pub fn wait_for_status(
    pool: &DemoPool,
    timeout: Duration,
    cond: impl Fn(&serde_json::Value) -> bool,
) -> Option<serde_json::Value> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(status) = pool.try_status() {
            if cond(&status) {
                return Some(status);
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
