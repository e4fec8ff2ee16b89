//! The conversation under random command sequences: it never panics, it
//! answers each reply-bearing step exactly once, and never a step
//! negotiated as no-reply.

use std::sync::Arc;

use forkpool_milter::{
    Actions, Address, Command, Context, Conversation, EomActions, Filter, FilterOptions, OptNeg,
    Protocol, Reply, Status,
};
use proptest::prelude::*;

/// Answers by the first byte of what it is shown, to exercise every status.
struct Moody;

fn mood(bytes: &[u8]) -> Status {
    match bytes.first().map(|b| b % 6) {
        Some(0) => Status::Reject,
        Some(1) => Status::Tempfail,
        Some(2) => Status::Accept,
        Some(3) => Status::Skip,
        Some(4) => Status::Discard,
        _ => Status::Continue,
    }
}

impl Filter for Moody {
    type Shared = Protocol;

    fn new(_: &Arc<Protocol>) -> Self {
        Moody
    }

    fn options(protocol: &Protocol) -> FilterOptions {
        FilterOptions {
            actions: Actions::ADD_HEADERS | Actions::CHANGE_BODY,
            protocol: *protocol,
            macros: Vec::new(),
        }
    }

    fn helo(&mut self, _: &Context<'_>, name: &[u8]) -> Status {
        mood(name)
    }

    fn mail(&mut self, _: &Context<'_>, sender: &[u8], _: &[Vec<u8>]) -> Status {
        mood(sender)
    }

    fn header(&mut self, _: &Context<'_>, _: &[u8], value: &[u8]) -> Status {
        mood(value)
    }

    fn body(&mut self, _: &Context<'_>, chunk: &[u8]) -> Status {
        mood(chunk)
    }

    fn eom(&mut self, _: &Context<'_>, actions: &mut EomActions) -> Status {
        actions.add_header("X-Moody", "yes").unwrap();
        actions.replace_body(b"new").unwrap();
        Status::Continue
    }
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(1u8..=255, 0..8)
}

fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        (any::<u8>(), bytes()).prop_map(|(stage, v)| Command::Macros {
            stage,
            pairs: vec![(b"i".to_vec(), v)]
        }),
        bytes().prop_map(|hostname| Command::Connect {
            hostname,
            address: Address::Unknown
        }),
        bytes().prop_map(Command::Helo),
        bytes().prop_map(|sender| Command::Mail {
            sender,
            args: vec![]
        }),
        bytes().prop_map(|recipient| Command::Rcpt {
            recipient,
            args: vec![]
        }),
        Just(Command::Data),
        bytes().prop_map(|value| Command::Header {
            name: b"Subject".to_vec(),
            value
        }),
        Just(Command::Eoh),
        bytes().prop_map(Command::Body),
        bytes().prop_map(Command::Eom),
        Just(Command::Abort),
        Just(Command::QuitNewConnection),
        bytes().prop_map(Command::Unknown),
    ]
}

/// The no-reply bit of a command's step.
fn no_reply(command: &Command) -> Option<Protocol> {
    Some(match command {
        Command::Connect { .. } => Protocol::NR_CONNECT,
        Command::Helo(_) => Protocol::NR_HELO,
        Command::Mail { .. } => Protocol::NR_MAIL,
        Command::Rcpt { .. } => Protocol::NR_RCPT,
        Command::Data => Protocol::NR_DATA,
        Command::Header { .. } => Protocol::NR_HEADER,
        Command::Eoh => Protocol::NR_EOH,
        Command::Body(_) => Protocol::NR_BODY,
        Command::Unknown(_) => Protocol::NR_UNKNOWN,
        _ => return None,
    })
}

proptest! {
    #[test]
    fn every_step_is_answered_once_or_not_at_all_as_negotiated(
        wanted in any::<u32>(),
        offered in any::<u32>(),
        commands in proptest::collection::vec(command(), 0..40),
    ) {
        let mut c = Conversation::<Moody>::new(Arc::new(Protocol(wanted)));
        let mut out = Vec::new();
        let offer = OptNeg { version: 6, actions: Actions(0x1ff), protocol: Protocol(offered) };
        c.handle(Command::OptNeg(offer), &mut out).unwrap();
        let agreed = c.agreed().unwrap().protocol;
        prop_assert_eq!(agreed.bits() & !offered, 0, "nothing beyond the offer");
        for command in commands {
            out.clear();
            let silent = no_reply(&command).is_some_and(|bit| agreed.contains(bit));
            let answers = match &command {
                Command::Eom(_) => true,
                Command::Macros { .. } | Command::Abort | Command::QuitNewConnection => false,
                _ => !silent,
            };
            let is_body = matches!(command, Command::Body(_));
            c.handle(command, &mut out).unwrap();
            let finals = out.iter().filter(|r| r.is_final()).count();
            prop_assert_eq!(finals, usize::from(answers), "{:?}", out);
            if answers {
                prop_assert!(out.last().unwrap().is_final());
            }
            if out.contains(&Reply::Skip) {
                prop_assert!(is_body && agreed.contains(Protocol::SKIP));
            }
            prop_assert!(!c.owes_reply());
        }
    }
}
