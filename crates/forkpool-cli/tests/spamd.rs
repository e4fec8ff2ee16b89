//! `clients/perl/forkpool-spamd` with the real `spamc`: its answers
//! against Debian's `spamd` run beside it (every command, compressed
//! messages, the package's samples and variations, bad requests), and
//! the pool's resilience (a SIGKILLed child, a HUP onto broken rules,
//! TERM with messages in flight).

mod common;

#[path = "common/spamd_support.rs"]
mod spamd_support;

use std::time::Duration;

use common::{alive, kill9, total, DemoPool};
use spamd_support::{
    messages, normalize, ping, raw, require_spamassassin, spamc, start_forkpool_spamd, status_of,
    terminate, wait_for_status, DebianSpamd, PATIENCE, SAMPLES,
};

/// spamc's flags for every command: CHECK (-c), SYMBOLS (-y), REPORT
/// (-R), REPORT_IFSPAM (-r), PROCESS (none), HEADERS (--headers), PROCESS
/// with the report-safe output (-E: exit code), a User header (-u), and
/// errors instead of the unchecked message (-x). Debian's spamc is built
/// without zlib (its -z is a usage error): compressed requests are sent
/// raw ([`compressed_requests`]).
const EVERY_COMMAND: &[&[&str]] = &[
    &["-c"],
    &["-y"],
    &["-R"],
    &["-r"],
    &[],
    &["--headers"],
    &["-E"],
    &["-u", "nobody", "-y"],
    &["-x", "-y"],
];

/// The commands tried on the generated variations.
const SOME_COMMANDS: &[&[&str]] = &[&[], &["-y"], &["-R"]];

/// Requests spamc would not send, each answered with one of spamd's
/// error lines (or, for the last ones, spamd's answer to an unusual but
/// valid request).
const RAW_REQUESTS: &[(&str, &[u8])] = &[
    ("garbage request line", b"HELLO THERE\r\n"),
    ("empty connection", b""),
    (
        "Content-length too large",
        b"CHECK SPAMC/1.5\r\nContent-length: 100\r\n\r\nSubject: x\r\n\r\nhi\r\n",
    ),
    (
        "Content-length too small",
        b"CHECK SPAMC/1.5\r\nContent-length: 3\r\n\r\nSubject: x\r\n\r\nhi\r\n",
    ),
    (
        "Content-length not a number",
        b"CHECK SPAMC/1.5\r\nContent-length: ten\r\n\r\nSubject: x\r\n\r\nhi\r\n",
    ),
    (
        "header without a colon",
        b"SYMBOLS SPAMC/1.5\r\nnonsense\r\n\r\n",
    ),
    (
        "end of input in the headers",
        b"CHECK SPAMC/1.5\r\nUser: nobody\r\n",
    ),
    (
        "Compress without Content-length",
        b"CHECK SPAMC/1.5\r\nCompress: zlib\r\n\r\nnot zlib",
    ),
    (
        "Compress with bad data",
        b"CHECK SPAMC/1.5\r\nCompress: zlib\r\nContent-length: 8\r\n\r\nnot zlib",
    ),
    (
        "Compress with an unknown method",
        b"CHECK SPAMC/1.5\r\nCompress: lzma\r\n\r\n",
    ),
    (
        "TELL setting and removing",
        b"TELL SPAMC/1.5\r\nSet: local\r\nRemove: local\r\n\r\n",
    ),
    ("PING", b"PING SPAMC/1.5\r\n\r\n"),
    ("SKIP", b"SKIP SPAMC/1.5\r\n\r\n"),
    (
        "CHECK in protocol 1.0 (no headers)",
        b"CHECK SPAMC/1.0\r\nSubject: x\r\n\r\nhi\r\n",
    ),
    (
        "SYMBOLS in protocol 1.2",
        b"SYMBOLS SPAMC/1.2\r\nContent-length: 18\r\n\r\nSubject: x\r\n\r\nhi\r\n",
    ),
    (
        "PROCESS in protocol 1.2",
        b"PROCESS SPAMC/1.2\r\nContent-length: 18\r\n\r\nSubject: x\r\n\r\nhi\r\n",
    ),
];

/// The server's error lines this test expects among the answers, so
/// that two servers that both answered nothing could not pass.
const EXPECTED_LINES: &[(&str, &str)] = &[
    ("garbage request line", "SPAMD/1.0 76 Bad header line: HELLO THERE\r\n"),
    ("empty connection", "SPAMD/1.0 76 Bad header line: (closed before headers)\r\n"),
    (
        "Content-length too large",
        "SPAMD/1.0 76 Bad header line: (Content-Length mismatch: Expected 100 bytes, got 18 bytes)\r\n",
    ),
    (
        "Compress without Content-length",
        "SPAMD/1.0 69 Service Unavailable: Compress requires Content-length header\r\n",
    ),
    ("PING", "SPAMD/1.5 0 PONG\r\n"),
];

/// Both servers' options in the comparison: two children, TELL allowed,
/// and a 3 s limit for the request line (spamd's -T).
const COMPARED_OPTIONS: &[&str] = &["-m", "2", "--min-spare", "2", "-l", "-T", "3"];

/// What a client that connects and sends nothing gets once -T passes.
fn silent_client(port: u16) -> Vec<u8> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut answer = Vec::new();
    let _ = std::io::Read::read_to_end(&mut stream, &mut answer);
    answer
}

#[test]
fn answers_match_debian_spamd_byte_for_byte() {
    if !require_spamassassin() {
        return;
    }
    let (ours, theirs) = std::thread::scope(|s| {
        let ours = s.spawn(|| start_forkpool_spamd(COMPARED_OPTIONS));
        let theirs = s.spawn(|| DebianSpamd::start(COMPARED_OPTIONS));
        (ours.join().unwrap(), theirs.join().unwrap())
    });
    let port = ours.addr.port();
    let mut cases: Vec<(String, &[&str], Vec<u8>)> = Vec::new();
    for (name, message) in messages() {
        let commands = if name.starts_with("sample-") {
            EVERY_COMMAND
        } else {
            SOME_COMMANDS
        };
        for flags in commands {
            cases.push((name.clone(), flags, message.clone()));
        }
    }
    // Each server answers the same case at once, on its own thread.
    let mut differ = Vec::new();
    for (name, flags, message) in &cases {
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| spamc(port, flags, message));
            let b = s.spawn(|| spamc(theirs.port, flags, message));
            (a.join().unwrap(), b.join().unwrap())
        });
        // 0: ham, 1: spam (-c, -E); anything else is spamc's error.
        assert!(
            matches!(a.code, Some(0 | 1)),
            "{name} {flags:?}: spamc failed ({:?})",
            a.code
        );
        if a.code != b.code || normalize(&a.output) != normalize(&b.output) {
            differ.push(format!(
                "{name} {flags:?}: forkpool-spamd {:?}:\n{}\nspamd {:?}:\n{}",
                a.code,
                String::from_utf8_lossy(&a.output),
                b.code,
                String::from_utf8_lossy(&b.output)
            ));
        }
    }
    let mut requests: Vec<(String, Vec<u8>)> = RAW_REQUESTS
        .iter()
        .map(|(name, request)| (name.to_string(), request.to_vec()))
        .collect();
    requests.extend(compressed_requests());
    for (name, request) in &requests {
        let a = raw(port, request);
        let b = raw(theirs.port, request);
        if normalize(&a) != normalize(&b) {
            differ.push(format!(
                "{name}: forkpool-spamd {:?}\nspamd {:?}",
                String::from_utf8_lossy(&a),
                String::from_utf8_lossy(&b)
            ));
        }
        if let Some((_, line)) = EXPECTED_LINES.iter().find(|(n, _)| *n == name.as_str()) {
            assert_eq!(String::from_utf8_lossy(&a), *line, "{name}");
        }
    }
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| silent_client(port));
        let b = s.spawn(|| silent_client(theirs.port));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(
        String::from_utf8_lossy(&a),
        "SPAMD/1.0 79 Timeout: (3 second socket timeout reading input from client)\r\n"
    );
    if a != b {
        differ.push(format!("a silent client: {a:?} against {b:?}"));
    }
    let compressed = requests
        .iter()
        .filter(|(n, _)| n.starts_with("compressed"))
        .count();
    let check = &requests
        .iter()
        .find(|(n, _)| n == "compressed CHECK sample-spam")
        .unwrap()
        .1;
    assert_eq!(
        String::from_utf8_lossy(&raw(port, check)),
        "SPAMD/1.1 0 EX_OK\r\nSpam: True ; 1000.0 / 5.0\r\n\r\n",
        "a compressed spam message"
    );
    let compared = cases.len() + requests.len() + 1;
    assert!(compressed >= 4);
    assert!(
        differ.is_empty(),
        "{} of {compared} answers differ:\n{}",
        differ.len(),
        differ.join("\n\n")
    );
    // Bad requests cost no child.
    let status = status_of(&ours);
    assert_eq!(total(&status, "died"), 0, "{status}");
    assert_eq!(total(&status, "killed"), 0, "{status}");
    eprintln!("forkpool-spamd and spamd: {compared} answers compared, 0 differ");
}

/// zlib-compressed CHECK, SYMBOLS and PROCESS requests of the samples,
/// as spamc built with zlib sends them (`Compress: zlib`, the compressed
/// length), compressed by Perl's core Compress::Zlib.
fn compressed_requests() -> Vec<(String, Vec<u8>)> {
    let mut requests = Vec::new();
    for sample in ["sample-spam", "sample-nonspam"] {
        let out = std::process::Command::new("perl")
            .args([
                "-MCompress::Zlib",
                "-e",
                "local $/; open my $f, '<', $ARGV[0] or die; binmode STDOUT; print compress(<$f>)",
            ])
            .arg(format!("{SAMPLES}/{sample}.txt"))
            .output()
            .expect("perl");
        assert!(out.status.success());
        for method in ["CHECK", "SYMBOLS", "PROCESS"] {
            let mut request = format!(
                "{method} SPAMC/1.5\r\nCompress: zlib\r\nContent-length: {}\r\n\r\n",
                out.stdout.len()
            )
            .into_bytes();
            request.extend_from_slice(&out.stdout);
            requests.push((format!("compressed {method} {sample}"), request));
        }
    }
    requests
}

/// The package's spam sample, and what `spamc -c` prints for it.
fn spam_sample() -> Vec<u8> {
    std::fs::read(format!("{SAMPLES}/sample-spam.txt")).unwrap()
}
const SPAM_SCORE: &[u8] = b"1000.0/5.0\n";

fn assert_answers(pool: &DemoPool, what: &str) {
    let answer = spamc(pool.addr.port(), &["-c"], &spam_sample());
    assert_eq!(
        (answer.code, answer.output.as_slice()),
        (Some(1), SPAM_SCORE),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&answer.output),
        pool.stderr.dump()
    );
}

/// A site configuration directory: a copy of /etc/spamassassin.
fn site_config() -> std::path::PathBuf {
    let dir = common::temp_path("spamassassin");
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir("/etc/spamassassin").unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
        }
    }
    dir
}

#[test]
fn a_sigkilled_child_a_broken_rules_reload_and_term_lose_nothing() {
    if !require_spamassassin() {
        return;
    }
    let config = site_config();
    let config_arg = config.to_str().unwrap();
    let mut pool = start_forkpool_spamd(&[
        "-m",
        "2",
        "--min-spare",
        "2",
        "--siteconfigpath",
        config_arg,
    ]);
    assert_answers(&pool, "at start");

    // A SIGKILLed child: replaced, and the pool answers.
    let status = status_of(&pool);
    let victim = status["slots"][0]["pid"].as_i64().unwrap() as i32;
    let spawned = total(&status, "spawned");
    kill9(victim);
    assert!(
        wait_for_status(&pool, PATIENCE, |s| total(s, "died") >= 1
            && total(s, "spawned") > spawned
            && s["idle"] == 2)
        .is_some(),
        "no replacement for the killed child\n{}",
        pool.stderr.dump()
    );
    assert!(!alive(victim));
    assert_answers(&pool, "after a SIGKILL");

    // HUP onto rules that do not compile: rolled back, the old
    // generation answers; fixed, the next reload rolls.
    let broken = config.join("zz-broken.cf");
    std::fs::write(&broken, "body BROKEN_RULE /unclosed(/\n").unwrap();
    pool.signal(1);
    let failed = wait_for_status(&pool, PATIENCE, |s| total(s, "reload_failures") >= 1)
        .unwrap_or_else(|| panic!("the broken rules were not refused\n{}", pool.stderr.dump()));
    assert_eq!(failed["serving_generation"], 1, "{failed}");
    assert_answers(&pool, "after the broken reload");
    std::fs::remove_file(&broken).unwrap();
    // `forkpool-spamd --reload` finds the pool by its control socket.
    let reload = std::process::Command::new("perl")
        .arg(spamd_support::FORKPOOL_SPAMD)
        .arg("--reload")
        .arg("--control")
        .arg(&pool.control)
        .env("FORKPOOL_BIN", common::forkpool_bin())
        .status()
        .unwrap();
    assert!(reload.success(), "forkpool-spamd --reload: {reload}");
    assert!(
        wait_for_status(&pool, PATIENCE, |s| s["serving_generation"].as_u64()
            > Some(2)
            && s["slots"].as_array().is_some_and(|slots| slots
                .iter()
                .all(|slot| slot["generation"].as_u64() > Some(2))))
        .is_some(),
        "the fixed rules did not roll\n{}",
        pool.stderr.dump()
    );
    assert_answers(&pool, "after the fixed reload");

    // TERM with messages in flight: every one is answered.
    let port = pool.addr.port();
    let message = spam_sample();
    std::thread::scope(|s| {
        let clients: Vec<_> = (0..6)
            .map(|_| s.spawn(|| spamc(port, &["-c"], &message)))
            .collect();
        assert!(
            wait_for_status(&pool, PATIENCE, |s| s["busy"].as_u64() >= Some(1)).is_some(),
            "no message in flight"
        );
        terminate(pool.pid);
        for client in clients {
            let answer = client.join().unwrap();
            assert_eq!(
                (answer.code, answer.output.as_slice()),
                (Some(1), SPAM_SCORE),
                "a message in flight at TERM was lost: {}",
                String::from_utf8_lossy(&answer.output)
            );
        }
    });
    assert!(pool.wait_exit(Duration::from_secs(30)).is_some());
    assert!(!ping(port), "still answering after TERM");
    let _ = std::fs::remove_dir_all(&config);
}

/// A SpamAssassin plugin that notes each spamd hook it is called for,
/// with the pid, in the file `$FORKPOOL_TEST_HOOKS` names, and changes
/// the configuration for one marked message.
const HOOKS_PLUGIN: &str = r#"package ForkpoolTestHooks;
use strict;
use warnings;
use Mail::SpamAssassin::Plugin;
our @ISA = ('Mail::SpamAssassin::Plugin');
sub new { my ($class, $sa) = @_; return bless $class->SUPER::new($sa), $class }
sub spamd_child_init { note('init') }
sub spamd_child_post_connection_close { note('close') }
# A message with `X-Lower-Threshold: yes` lowers the configuration's
# required score: the restore after the connection must undo it.
sub check_start {
    my ($self, $opts) = @_;
    my $pms = $opts->{permsgstatus};
    $pms->{conf}{required_score} = 1 if ($pms->get('X-Lower-Threshold') // '') =~ /yes/;
}
sub note {
    open my $f, '>>', $ENV{FORKPOOL_TEST_HOOKS} or die "$ENV{FORKPOOL_TEST_HOOKS}: $!";
    print {$f} "$_[0] $$\n";
    close $f;
}
1;
"#;

#[test]
fn plugins_hear_child_init_and_connection_close_and_the_config_is_restored() {
    if !require_spamassassin() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let dir = common::temp_path("hooks");
    std::fs::create_dir_all(&dir).unwrap();
    let plugin = dir.join("Hooks.pm");
    std::fs::write(&plugin, HOOKS_PLUGIN).unwrap();
    let notes = dir.join("notes");
    std::fs::write(&notes, "").unwrap();
    // The children may run as another user (-u): they append to it.
    for path in [&dir, &notes, &plugin] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let pre = format!("--pre=loadplugin ForkpoolTestHooks {}", plugin.display());
    let mut command = std::process::Command::new("perl");
    command
        .arg(spamd_support::FORKPOOL_SPAMD)
        .args(spamd_support::common_options())
        .arg(&pre)
        .env("FORKPOOL_BIN", common::forkpool_bin())
        .env("FORKPOOL_TEST_HOOKS", &notes);
    // One child, so that every message meets what the one before left.
    let pool = DemoPool::launch(command, &["-m", "1", "--max-spare", "1"], &[], true);
    assert!(
        wait_for_status(&pool, PATIENCE, |s| s["idle"] == 1).is_some(),
        "{}",
        pool.stderr.dump()
    );
    let messages = 5;
    for _ in 0..messages {
        assert_answers(&pool, "with the hooks plugin");
    }
    let read = || {
        let text = std::fs::read_to_string(&notes).unwrap();
        let pids = |kind: &str| -> Vec<i32> {
            text.lines()
                .filter_map(|l| l.strip_prefix(kind)?.trim().parse().ok())
                .collect()
        };
        (pids("init "), pids("close "))
    };
    let deadline = std::time::Instant::now() + PATIENCE;
    let (init, close) = loop {
        let (init, close) = read();
        if close.len() >= messages || std::time::Instant::now() > deadline {
            break (init, close);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let workers: Vec<i32> = status_of(&pool)["slots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["pid"].as_i64().unwrap() as i32)
        .collect();
    for worker in &workers {
        assert!(
            init.contains(worker),
            "no spamd_child_init in {worker}: {init:?}"
        );
    }
    assert_eq!(
        init.len(),
        workers.len(),
        "spamd_child_init once per child: {init:?}"
    );
    assert_eq!(
        close.len(),
        messages,
        "one spamd_child_post_connection_close a connection"
    );
    assert!(
        close.iter().all(|pid| workers.contains(pid)),
        "{close:?} {workers:?}"
    );

    // The configuration is restored after each connection (copy_config),
    // so a change one message made is gone for the next ones.
    let ham = std::fs::read(format!("{SAMPLES}/sample-nonspam.txt")).unwrap();
    let mut marked = b"X-Lower-Threshold: yes\n".to_vec();
    marked.extend_from_slice(&ham);
    let port = pool.addr.port();
    assert_eq!(spamc(port, &["-c"], &marked).output, b"0.0/1.0\n");
    for _ in 0..3 {
        let answer = spamc(port, &["-c"], &ham);
        assert_eq!(
            String::from_utf8_lossy(&answer.output),
            "0.0/5.0\n",
            "the configuration was not restored"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Kills a process the test did not start directly (a daemon), and its
/// children, by pid.
struct DaemonGuard(i32);

impl Drop for DaemonGuard {
    fn drop(&mut self) {
        let path = format!("/proc/{0}/task/{0}/children", self.0);
        let children = std::fs::read_to_string(path).unwrap_or_default();
        kill9(self.0);
        for child in children.split_whitespace().filter_map(|p| p.parse().ok()) {
            kill9(child);
        }
    }
}

#[test]
fn daemonizes_with_a_pid_file_and_a_unix_socket() {
    if !require_spamassassin() {
        return;
    }
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = common::temp_path("daemon");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (pidfile, socket) = (dir.join("spamd.pid"), dir.join("spamd.sock"));
    let as_root = spamd_support::common_options().iter().any(|o| o == "-u");
    let mut command = std::process::Command::new("perl");
    command
        .arg(spamd_support::FORKPOOL_SPAMD)
        .args(spamd_support::common_options())
        .args(["-d", "-m", "1", "--socketmode", "0660"])
        .arg("-r")
        .arg(&pidfile)
        .arg("--socketpath")
        .arg(&socket)
        .arg("--control")
        .arg(dir.join("control.sock"))
        .env("FORKPOOL_BIN", common::forkpool_bin());
    if as_root {
        command.args(["--socketgroup", "mail"]);
    }
    let started = command.status().expect("run forkpool-spamd -d");
    assert!(started.success(), "forkpool-spamd -d: {started}");
    let deadline = std::time::Instant::now() + PATIENCE;
    let pid = loop {
        let text = std::fs::read_to_string(&pidfile).unwrap_or_default();
        if let Ok(pid) = text.trim().parse::<i32>() {
            break pid;
        }
        assert!(std::time::Instant::now() < deadline, "no pid file");
        std::thread::sleep(Duration::from_millis(20));
    };
    let guard = DaemonGuard(pid);
    let spamc_unix = |flags: &[&str]| {
        std::process::Command::new("spamc")
            .arg("-U")
            .arg(&socket)
            .args(flags)
            .stdin(std::fs::File::open(format!("{SAMPLES}/sample-spam.txt")).unwrap())
            .output()
            .unwrap()
    };
    while !spamc_unix(&["-K"]).status.success() {
        assert!(
            std::time::Instant::now() < deadline,
            "the daemon never answered"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The pid file names the pool's supervisor, in its own session.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(fields[3], pid.to_string(), "not a session leader: {stat}");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    assert!(String::from_utf8_lossy(&cmdline).contains("run\0--preload"));
    let meta = std::fs::metadata(&socket).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o660, "--socketmode");
    if as_root {
        let mail = std::process::Command::new("getent")
            .args(["group", "mail"])
            .output()
            .unwrap();
        let gid: u32 = String::from_utf8_lossy(&mail.stdout)
            .split(':')
            .nth(2)
            .unwrap()
            .parse()
            .unwrap();
        let deadline = std::time::Instant::now() + PATIENCE;
        while std::fs::metadata(&socket).unwrap().gid() != gid {
            assert!(
                std::time::Instant::now() < deadline,
                "--socketgroup not applied"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let answer = spamc_unix(&["-c"]);
    assert_eq!(answer.stdout, SPAM_SCORE);
    terminate(pid);
    let deadline = std::time::Instant::now() + PATIENCE;
    while alive(pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "still running after TERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(guard);
    let _ = std::fs::remove_dir_all(&dir);
}
