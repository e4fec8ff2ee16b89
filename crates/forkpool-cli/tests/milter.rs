//! `forkpool milter` on loopback, driven by a milter client built on the
//! forkpool-milter codec: negotiation, the header added at end of message,
//! a recipient rejected at RCPT, a sender tempfailed, quarantine, spamd's
//! score, a malformed packet ending only its own conversation, and many
//! conversations on a few threads per child, as status shows.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command as Process;
use std::time::{Duration, Instant};

use common::{forkpool_bin, temp_path, DemoPool};
use forkpool_milter::{client, Actions, Address, Command, Decoder, OptNeg, Protocol, Reply};

const WAIT: Duration = Duration::from_secs(10);

/// One child, and no more.
const ONE_CHILD: &[&str] = &[
    "--min-children",
    "1",
    "--max-children",
    "1",
    "--min-spare",
    "1",
];

/// What Postfix 3.7 offers at negotiation.
const POSTFIX_ACTIONS: Actions = Actions(0x1ff);
const POSTFIX_STEPS: Protocol = Protocol(0x1f_ffff);

/// One MTA-side conversation.
struct Mta {
    stream: TcpStream,
    decoder: Decoder,
    agreed: Protocol,
}

impl Mta {
    fn connect(addr: SocketAddr) -> Mta {
        let stream = TcpStream::connect_timeout(&addr, WAIT).expect("connect");
        stream.set_read_timeout(Some(WAIT)).unwrap();
        // Commands go out as several small writes (macros, then the
        // command): without this, Nagle holds the second until the first
        // is acknowledged, 40 ms later.
        stream.set_nodelay(true).unwrap();
        Mta {
            stream,
            decoder: Decoder::default(),
            agreed: Protocol::NONE,
        }
    }

    fn send(&mut self, command: Command) {
        client::send_command(&mut self.stream, &command).unwrap();
    }

    /// The next reply; `None` if the filter closed the connection.
    fn reply(&mut self) -> Option<Reply> {
        client::read_reply(&mut self.stream, &mut self.decoder).expect("a reply or the end")
    }

    /// Replies up to and including the final one.
    fn replies(&mut self) -> Vec<Reply> {
        let mut all = Vec::new();
        loop {
            let reply = self.reply().expect("a reply before close");
            let last = reply.is_final();
            all.push(reply);
            if last {
                return all;
            }
        }
    }

    /// Sends a command; its reply, unless the filter negotiated none.
    fn step(&mut self, command: Command, no_reply: Protocol) -> Option<Reply> {
        self.send(command);
        if self.agreed.contains(no_reply) && no_reply != Protocol::NONE {
            None
        } else {
            Some(self.reply().expect("a reply"))
        }
    }

    fn negotiate(&mut self) -> OptNeg {
        self.send(Command::OptNeg(OptNeg {
            version: 6,
            actions: POSTFIX_ACTIONS,
            protocol: POSTFIX_STEPS,
        }));
        let Some(Reply::Negotiate(neg)) = self.reply() else {
            panic!("no negotiation reply");
        };
        self.agreed = neg.options.protocol;
        neg.options
    }

    fn connect_and_mail(&mut self, sender: &str) -> Option<Reply> {
        if !self.agreed.contains(Protocol::NO_CONNECT) {
            self.step(
                Command::Connect {
                    hostname: b"client.example".to_vec(),
                    address: Address::Inet {
                        port: 40000,
                        address: b"192.0.2.7".to_vec(),
                    },
                },
                Protocol::NR_CONNECT,
            );
        }
        self.send(Command::Macros {
            stage: b'M',
            pairs: vec![(b"i".to_vec(), b"QUEUE1".to_vec())],
        });
        self.step(
            Command::Mail {
                sender: sender.as_bytes().to_vec(),
                args: vec![b"SIZE=100".to_vec()],
            },
            Protocol::NR_MAIL,
        )
    }

    fn rcpt(&mut self, recipient: &str) -> Option<Reply> {
        self.step(
            Command::Rcpt {
                recipient: recipient.as_bytes().to_vec(),
                args: vec![],
            },
            Protocol::NR_RCPT,
        )
    }

    /// RCPT's reply, or `None` if the conversation has ended (a write into
    /// a closed connection may fail too).
    fn rcpt_reply_or_end(&mut self, recipient: &str) -> Option<Reply> {
        let command = Command::Rcpt {
            recipient: recipient.as_bytes().to_vec(),
            args: vec![],
        };
        client::send_command(&mut self.stream, &command).ok()?;
        client::read_reply(&mut self.stream, &mut self.decoder).ok()?
    }

    /// Headers, body and end of message; the end-of-message replies.
    fn message(&mut self, headers: &[(&str, &str)], body: &str) -> Vec<Reply> {
        for (name, value) in headers {
            let header = Command::Header {
                name: name.as_bytes().to_vec(),
                value: value.as_bytes().to_vec(),
            };
            let reply = self.step(header, Protocol::NR_HEADER);
            assert!(matches!(reply, None | Some(Reply::Continue)), "{reply:?}");
        }
        let _ = self.step(Command::Eoh, Protocol::NR_EOH);
        let _ = self.step(Command::Body(body.as_bytes().to_vec()), Protocol::NR_BODY);
        self.send(Command::Eom(Vec::new()));
        self.replies()
    }
}

/// A spamd stand-in: "spammy" in the message scores 15.2, else 1.0.
fn fake_spamd() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming().take(1000) {
            let Ok(mut conn) = conn else { continue };
            let mut request = Vec::new();
            let _ = conn.set_read_timeout(Some(WAIT));
            let _ = conn.read_to_end(&mut request);
            let spammy = String::from_utf8_lossy(&request).contains("spammy");
            let line = if spammy {
                "True ; 15.2 / 5.0"
            } else {
                "False ; 1.0 / 5.0"
            };
            let _ = write!(conn, "SPAMD/1.1 0 EX_OK\r\nSpam: {line}\r\n\r\n");
        }
    });
    addr
}

fn start(extra_rules: &str, args: &[&str]) -> DemoPool {
    start_with_path(extra_rules, args).0
}

/// The example rule file with `extra_rules` after it, and a pool filtering
/// with it; also the file's path.
fn start_with_path(extra_rules: &str, args: &[&str]) -> (DemoPool, PathBuf) {
    let path = temp_path("rules.toml");
    std::fs::write(&path, example_rules() + extra_rules).unwrap();
    let mut command = Process::new(forkpool_bin());
    command.arg("milter");
    let pool = DemoPool::launch(command, args, &[path.to_str().unwrap()], true);
    (pool, path)
}

fn example_rules() -> String {
    let output = Process::new(forkpool_bin())
        .args(["milter", "--example"])
        .output()
        .unwrap();
    String::from_utf8(output.stdout).unwrap()
}

/// Rules added to the example's (which tempfails `tempfail@` senders).
const RULES: &str = r#"
[[rule]]
on = "header"
header = "subject"
pattern = "(?i)quarantine-me"
action = "quarantine"
reason = "subject rule"
"#;

fn header_value(replies: &[Reply], wanted: &str) -> Option<String> {
    replies.iter().find_map(|r| match r {
        Reply::AddHeader { name, value } if name == wanted.as_bytes() => {
            Some(String::from_utf8_lossy(value).into_owned())
        }
        _ => None,
    })
}

#[test]
fn the_example_rules_filter_a_conversation() {
    let spamd = fake_spamd();
    let pool = start(
        &format!("{RULES}\n[spamd]\naddress = \"{spamd}\"\ntimeout = \"5s\"\n"),
        &["--max-children", "2"],
    );
    let mut mta = Mta::connect(pool.addr);
    let agreed = mta.negotiate();
    assert_eq!(agreed.version, 6);
    assert_eq!(
        agreed.actions,
        Actions::ADD_HEADERS | Actions::QUARANTINE | Actions::SET_SYMLIST
    );
    for left_out in [Protocol::NO_CONNECT, Protocol::NO_HELO, Protocol::NO_DATA] {
        assert!(agreed.protocol.contains(left_out), "{:?}", agreed.protocol);
    }
    assert!(
        agreed.protocol.contains(Protocol::NR_BODY),
        "spamd needs the body, unanswered"
    );

    // The recipient rule rejects at RCPT, with its code; others pass.
    assert_eq!(
        mta.connect_and_mail("<a@example.org>"),
        Some(Reply::Continue)
    );
    assert_eq!(mta.rcpt("<ok@example.org>"), Some(Reply::Continue));
    assert_eq!(
        mta.rcpt("<reject@example.org>"),
        Some(Reply::ReplyCode(
            b"550 5.7.1 Recipient rejected by rule".to_vec()
        ))
    );
    // End of message: spamd's score and the child's pid as headers.
    let replies = mta.message(&[("Subject", "hello")], "a spammy body\r\n");
    assert_eq!(replies.last(), Some(&Reply::Continue));
    assert_eq!(
        header_value(&replies, "X-Spam-Status").as_deref(),
        Some("Yes, score=15.2 required=5.0")
    );
    assert_eq!(
        header_value(&replies, "X-Spam-Flag").as_deref(),
        Some("YES")
    );
    let pid: i32 = header_value(&replies, "X-Forkpool-Milter")
        .expect("the example's header")
        .parse()
        .unwrap();
    assert!(
        pool.children().contains(&pid),
        "{pid} is a child of the pool"
    );
    assert!(!replies.iter().any(|r| matches!(r, Reply::Quarantine(_))));

    // A second message on the same connection: quarantined by its subject.
    assert_eq!(
        mta.connect_and_mail("<b@example.org>"),
        Some(Reply::Continue)
    );
    let replies = mta.message(&[("Subject", "please Quarantine-Me")], "ham\r\n");
    assert!(
        replies.contains(&Reply::Quarantine(b"subject rule".to_vec())),
        "{replies:?}"
    );
    assert_eq!(
        header_value(&replies, "X-Spam-Status").as_deref(),
        Some("No, score=1.0 required=5.0")
    );
    assert_eq!(header_value(&replies, "X-Spam-Flag"), None);

    // Abort, then a tempfailed sender.
    mta.send(Command::Abort);
    assert_eq!(
        mta.connect_and_mail("<tempfail@example.org>"),
        Some(Reply::ReplyCode(
            b"451 4.7.1 Sender tempfailed by rule".to_vec()
        ))
    );
    mta.send(Command::Quit);
    assert_eq!(mta.reply(), None, "quit closes the connection");
}

#[test]
fn a_malformed_packet_ends_its_own_conversation_only() {
    let pool = start("", ONE_CHILD);
    let mut good = Mta::connect(pool.addr);
    good.negotiate();
    let mut bad = Mta::connect(pool.addr);
    bad.negotiate();
    // A length far beyond the bound, then a packet with no command byte.
    bad.stream.write_all(&u32::MAX.to_be_bytes()).unwrap();
    assert_eq!(bad.reply(), None, "the filter closes the bad conversation");
    let mut empty = Mta::connect(pool.addr);
    empty.stream.write_all(&[0, 0, 0, 0]).unwrap();
    assert_eq!(empty.reply(), None);
    // The good one goes on.
    assert_eq!(
        good.connect_and_mail("<a@example.org>"),
        Some(Reply::Continue)
    );
    assert_eq!(
        good.rcpt("<reject@x.example>"),
        Some(Reply::ReplyCode(
            b"550 5.7.1 Recipient rejected by rule".to_vec()
        ))
    );
}

fn threads_of(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn sessions_of(status: &serde_json::Value) -> u64 {
    status["slots"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["sessions"][0].as_u64())
        .sum()
}

#[test]
fn many_conversations_run_on_a_few_threads() {
    const CONVERSATIONS: usize = 300;
    let pool = start(
        "",
        &[
            ONE_CHILD,
            &["--session-workers", "3", "--sessions-per-child", "1000"],
        ]
        .concat(),
    );
    let mut mtas: Vec<Mta> = (0..CONVERSATIONS)
        .map(|_| Mta::connect(pool.addr))
        .collect();
    for mta in &mut mtas {
        mta.negotiate();
    }
    // Interleaved: every conversation is open while each takes a step.
    for mta in &mut mtas {
        assert_eq!(
            mta.connect_and_mail("<a@example.org>"),
            Some(Reply::Continue)
        );
        assert_eq!(mta.rcpt("<ok@example.org>"), Some(Reply::Continue));
    }
    let children = pool.children();
    assert_eq!(children.len(), 1, "one child holds them all");
    let threads = threads_of(children[0]);
    assert!(
        (1..=8).contains(&threads),
        "{threads} threads for {CONVERSATIONS} conversations"
    );
    // Status counts them as the child's open sessions.
    let deadline = Instant::now() + WAIT;
    let mut status = pool.status();
    while sessions_of(&status) < CONVERSATIONS as u64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        status = pool.status();
    }
    assert_eq!(sessions_of(&status), CONVERSATIONS as u64, "{status}");
    for mta in &mut mtas {
        let replies = mta.message(&[], "x");
        assert!(header_value(&replies, "X-Forkpool-Milter").is_some());
    }
}

#[test]
fn a_reload_keeps_open_conversations_and_brings_in_new_rules() {
    let (pool, path) = start_with_path("", ONE_CHILD);
    let mut old = Mta::connect(pool.addr);
    old.negotiate();
    old.connect_and_mail("<a@example.org>");

    let edited = example_rules().replace("value = \"{pid}\"", "value = \"{pid} v2\"");
    assert_ne!(edited, example_rules());
    std::fs::write(&path, edited).unwrap();
    pool.signal(libc::SIGHUP);
    let rolled = pool.wait_status(Duration::from_secs(30), |s| s["serving_generation"] == 2);
    assert!(rolled.is_some(), "{}", pool.stderr.dump());

    // The open conversation goes on, on its old child with the old rules.
    assert_eq!(old.rcpt("<ok@example.org>"), Some(Reply::Continue));
    let replies = old.message(&[], "x");
    let value = header_value(&replies, "X-Forkpool-Milter").unwrap();
    assert!(!value.ends_with("v2"), "{value}");
    // A new one is filtered by a new child with the new rules.
    let mut new = Mta::connect(pool.addr);
    new.negotiate();
    new.connect_and_mail("<a@example.org>");
    assert_eq!(new.rcpt("<ok@example.org>"), Some(Reply::Continue));
    let replies = new.message(&[], "x");
    let value = header_value(&replies, "X-Forkpool-Milter").unwrap();
    assert!(value.ends_with(" v2"), "{value}");
}

#[test]
fn a_killed_child_costs_only_its_own_conversations() {
    let pool = start(
        "",
        &[
            "--min-children",
            "2",
            "--max-children",
            "2",
            "--min-spare",
            "1",
            "--sessions-per-child",
            "2",
        ],
    );
    assert!(pool.wait_children(WAIT, |n| n == 2));
    // Four conversations, two per child; each learns its child's pid from
    // the header added at end of message.
    let mut conversations: Vec<(Mta, i32)> = (0..4)
        .map(|_| {
            let mut mta = Mta::connect(pool.addr);
            mta.negotiate();
            mta.connect_and_mail("<a@example.org>");
            assert_eq!(mta.rcpt("<ok@example.org>"), Some(Reply::Continue));
            let replies = mta.message(&[], "x");
            let pid = header_value(&replies, "X-Forkpool-Milter").unwrap();
            (mta, pid.parse().unwrap())
        })
        .collect();
    let victim = conversations[0].1;
    let on_victim = conversations.iter().filter(|(_, p)| *p == victim).count();
    assert_eq!(on_victim, 2, "two conversations per child");
    common::kill9(victim);
    for (mta, pid) in &mut conversations {
        let reply = mta.rcpt_reply_or_end("<ok@example.org>");
        if *pid == victim {
            assert_eq!(reply, None, "the killed child's conversation ends");
        } else {
            assert_eq!(reply, Some(Reply::Continue), "the other child's goes on");
        }
    }
}
