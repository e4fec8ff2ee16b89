//! The conversation state machine driven by decoded commands: negotiation,
//! no-reply steps, skip, abort, quit-new-connection, the modifications.

use std::sync::{Arc, Mutex};

use forkpool_milter::{
    Actions, Address, Command, Context, Conversation, ConversationError, EomActions, Filter,
    FilterOptions, Flow, OptNeg, Protocol, Reply, ReplyText, Stage, Status,
};

/// Records the hooks called; rejects `bad@` at RCPT; modifies at EOM.
struct Recorder {
    log: Arc<Mutex<Vec<String>>>,
}

impl Filter for Recorder {
    type Shared = Mutex<Vec<String>>;

    fn new(shared: &Arc<Self::Shared>) -> Self {
        shared.lock().unwrap().push("new".into());
        // The log is shared so a test can read it after the conversation.
        Recorder {
            log: Arc::clone(shared),
        }
    }

    fn options(_: &Self::Shared) -> FilterOptions {
        FilterOptions {
            actions: Actions::ADD_HEADERS
                | Actions::CHANGE_HEADERS
                | Actions::CHANGE_FROM
                | Actions::ADD_RCPT_PAR
                | Actions::DELETE_RCPT
                | Actions::CHANGE_BODY
                | Actions::QUARANTINE,
            protocol: Protocol::NR_HEADER | Protocol::SKIP | Protocol::NR_DATA,
            macros: vec![(Stage::Mail, "i {auth_authen}".into())],
        }
    }

    fn connect(&mut self, _: &Context<'_>, host: &[u8], _: &Address) -> Status {
        self.note(format!("connect {}", String::from_utf8_lossy(host)));
        Status::Continue
    }

    fn mail(&mut self, ctx: &Context<'_>, _: &[u8], _: &[Vec<u8>]) -> Status {
        self.note(format!(
            "mail i={}",
            ctx.macros.text("i").unwrap_or_default()
        ));
        Status::Continue
    }

    fn rcpt(&mut self, _: &Context<'_>, rcpt: &[u8], _: &[Vec<u8>]) -> Status {
        if rcpt.starts_with(b"<bad@") {
            Status::Reply(ReplyText::new(550, Some("5.7.1"), &["no", "really"]).unwrap())
        } else {
            Status::Continue
        }
    }

    fn header(&mut self, _: &Context<'_>, name: &[u8], _: &[u8]) -> Status {
        self.note(format!("header {}", String::from_utf8_lossy(name)));
        Status::Reject // on a no-reply step: never sent
    }

    fn body(&mut self, _: &Context<'_>, _: &[u8]) -> Status {
        self.note("body".into());
        Status::Skip
    }

    fn eom(&mut self, _: &Context<'_>, a: &mut EomActions) -> Status {
        a.add_header("X-A", "1").unwrap();
        a.change_header(1, "Subject", "").unwrap();
        a.change_from("<new@example.org>", Some("SIZE=1")).unwrap();
        a.add_rcpt_par("<copy@example.org>", Some("NOTIFY=NEVER"))
            .unwrap();
        a.delete_rcpt("<old@example.org>").unwrap();
        a.replace_body(&vec![b'x'; 70_000]).unwrap();
        a.quarantine("held").unwrap();
        assert!(
            a.add_rcpt("<plain@example.org>").is_err(),
            "ADDRCPT was not negotiated"
        );
        Status::Accept
    }

    fn abort(&mut self, _: &Context<'_>) {
        self.note("abort".into());
    }

    fn close(&mut self, _: &Context<'_>) {
        self.note("close".into());
    }
}

impl Recorder {
    fn note(&self, what: String) {
        self.log.lock().unwrap().push(what);
    }
}

const ALL_ACTIONS: Actions = Actions(0x1ff);
/// What Postfix 3.7 offers: every step bit up to HDR_LEADSPC.
const POSTFIX_STEPS: Protocol = Protocol(0x1f_ffff);

fn start(offer: Protocol) -> (Conversation<Recorder>, Arc<Mutex<Vec<String>>>, Vec<Reply>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut c = Conversation::<Recorder>::new(Arc::clone(&log));
    let mut out = Vec::new();
    let neg = OptNeg {
        version: 6,
        actions: ALL_ACTIONS,
        protocol: offer,
    };
    assert_eq!(c.handle(Command::OptNeg(neg), &mut out), Ok(Flow::Go));
    (c, log, out)
}

fn send(c: &mut Conversation<Recorder>, cmd: Command) -> Vec<Reply> {
    let mut out = Vec::new();
    c.handle(cmd, &mut out).unwrap();
    out
}

fn s(v: &str) -> Vec<u8> {
    v.as_bytes().to_vec()
}

#[test]
fn negotiation_asks_for_the_filters_steps_and_macros() {
    let (_, _, out) = start(POSTFIX_STEPS);
    let Reply::Negotiate(neg) = &out[0] else {
        panic!("{out:?}")
    };
    assert_eq!(neg.options.version, 6);
    assert!(neg.options.actions.contains(Actions::SET_SYMLIST));
    assert_eq!(
        neg.options.protocol,
        Protocol::NR_HEADER | Protocol::SKIP | Protocol::NR_DATA
    );
    assert_eq!(neg.macros, vec![(Stage::Mail, s("i {auth_authen}"))]);
    // An MTA that offers no no-reply steps gets them dropped.
    let (_, _, out) = start(Protocol::SKIP);
    let Reply::Negotiate(neg) = &out[0] else {
        panic!()
    };
    assert_eq!(neg.options.protocol, Protocol::SKIP);
}

#[test]
fn refusals_end_the_conversation_with_a_typed_error() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut c = Conversation::<Recorder>::new(Arc::clone(&log));
    let mut out = Vec::new();
    assert_eq!(
        c.handle(Command::Helo(s("x")), &mut out),
        Err(ConversationError::NotNegotiated(b'H'))
    );
    let stingy = OptNeg {
        version: 6,
        actions: Actions::ADD_HEADERS,
        protocol: POSTFIX_STEPS,
    };
    assert!(matches!(
        c.handle(Command::OptNeg(stingy), &mut out),
        Err(ConversationError::ActionsRefused { .. })
    ));
}

#[test]
fn a_message_runs_every_stage_with_no_reply_steps_silent() {
    let (mut c, log, _) = start(POSTFIX_STEPS);
    let connect = Command::Connect {
        hostname: s("client.example"),
        address: Address::Inet {
            port: 4242,
            address: s("192.0.2.1"),
        },
    };
    assert_eq!(send(&mut c, connect), vec![Reply::Continue]);
    assert!(send(
        &mut c,
        Command::Macros {
            stage: b'M',
            pairs: vec![(s("i"), s("QID1"))]
        }
    )
    .is_empty());
    assert_eq!(
        send(
            &mut c,
            Command::Mail {
                sender: s("<a@example.org>"),
                args: vec![]
            }
        ),
        vec![Reply::Continue]
    );
    assert_eq!(
        send(
            &mut c,
            Command::Rcpt {
                recipient: s("<bad@example.org>"),
                args: vec![]
            }
        ),
        vec![Reply::ReplyCode(s("550-5.7.1 no\r\n550 5.7.1 really"))]
    );
    assert!(send(&mut c, Command::Data).is_empty(), "NR_DATA");
    assert!(
        send(
            &mut c,
            Command::Header {
                name: s("Subject"),
                value: s("hi")
            }
        )
        .is_empty(),
        "NR_HDR"
    );
    assert_eq!(send(&mut c, Command::Body(s("x"))), vec![Reply::Skip]);
    let eom = send(&mut c, Command::Eom(vec![]));
    let codes: Vec<u8> = eom.iter().map(Reply::code).collect();
    assert_eq!(String::from_utf8(codes).unwrap(), "hme2-bbqa");
    assert!(!c.owes_reply());
    assert_eq!(
        *log.lock().unwrap(),
        [
            "new",
            "connect client.example",
            "mail i=QID1",
            "header Subject",
            "body"
        ]
    );
}

#[test]
fn abort_and_quit_new_connection_reset_the_right_state() {
    let (mut c, log, _) = start(POSTFIX_STEPS);
    send(
        &mut c,
        Command::Macros {
            stage: b'M',
            pairs: vec![(s("i"), s("Q1"))],
        },
    );
    send(
        &mut c,
        Command::Mail {
            sender: s("<a@x>"),
            args: vec![],
        },
    );
    assert!(send(&mut c, Command::Abort).is_empty());
    send(
        &mut c,
        Command::Mail {
            sender: s("<a@x>"),
            args: vec![],
        },
    );
    let mut out = Vec::new();
    assert_eq!(c.handle(Command::QuitNewConnection, &mut out), Ok(Flow::Go));
    assert!(out.is_empty());
    assert_eq!(c.handle(Command::Quit, &mut out), Ok(Flow::Close));
    // The driver ends the session again when the socket closes: no second
    // close.
    c.end_session();
    assert_eq!(
        *log.lock().unwrap(),
        [
            "new",
            "mail i=Q1",
            "abort",
            "mail i=",
            "abort",
            "close",
            "new",
            "close"
        ]
    );
}
