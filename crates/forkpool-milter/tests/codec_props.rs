//! Property tests of the codec: every command and reply survives encoding
//! and decoding, and random bytes never panic the decoder nor make it hold
//! more than its bound.

use forkpool_milter::{
    Actions, Address, Command, Decoder, Negotiated, OptNeg, Packet, Protocol, Reply, Stage,
};
use proptest::prelude::*;

fn text() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(1u8..=255, 0..40)
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..200)
}

fn optneg() -> impl Strategy<Value = OptNeg> {
    (any::<u32>(), any::<u32>(), any::<u32>()).prop_map(|(v, a, p)| OptNeg {
        version: v,
        actions: Actions(a),
        protocol: Protocol(p),
    })
}

fn address() -> impl Strategy<Value = Address> {
    prop_oneof![
        Just(Address::Unknown),
        text().prop_map(Address::Unix),
        (any::<u16>(), text()).prop_map(|(port, address)| Address::Inet { port, address }),
        (any::<u16>(), text()).prop_map(|(port, address)| Address::Inet6 { port, address }),
    ]
}

fn command() -> impl Strategy<Value = Command> {
    let args = || proptest::collection::vec(text(), 0..4);
    prop_oneof![
        optneg().prop_map(Command::OptNeg),
        (
            any::<u8>(),
            proptest::collection::vec((text(), text()), 0..4)
        )
            .prop_map(|(stage, pairs)| Command::Macros { stage, pairs }),
        (text(), address()).prop_map(|(hostname, address)| Command::Connect { hostname, address }),
        text().prop_map(Command::Helo),
        (text(), args()).prop_map(|(sender, args)| Command::Mail { sender, args }),
        (text(), args()).prop_map(|(recipient, args)| Command::Rcpt { recipient, args }),
        Just(Command::Data),
        (text(), text()).prop_map(|(name, value)| Command::Header { name, value }),
        Just(Command::Eoh),
        bytes().prop_map(Command::Body),
        bytes().prop_map(Command::Eom),
        Just(Command::Abort),
        Just(Command::Quit),
        Just(Command::QuitNewConnection),
        text().prop_map(Command::Unknown),
    ]
}

fn stage() -> impl Strategy<Value = Stage> {
    proptest::sample::select(Stage::ALL.to_vec())
}

fn reply() -> impl Strategy<Value = Reply> {
    prop_oneof![
        (optneg(), proptest::collection::vec((stage(), text()), 0..3))
            .prop_map(|(options, macros)| Reply::Negotiate(Negotiated { options, macros })),
        proptest::sample::select(vec![
            Reply::Continue,
            Reply::Accept,
            Reply::Reject,
            Reply::Tempfail,
            Reply::Discard,
            Reply::Skip,
            Reply::Progress,
            Reply::Shutdown,
            Reply::ConnectionFail,
        ]),
        text().prop_map(Reply::ReplyCode),
        (text(), text()).prop_map(|(name, value)| Reply::AddHeader { name, value }),
        (any::<u32>(), text(), text()).prop_map(|(index, name, value)| Reply::InsertHeader {
            index,
            name,
            value
        }),
        (any::<u32>(), text(), text()).prop_map(|(index, name, value)| Reply::ChangeHeader {
            index,
            name,
            value
        }),
        (text(), proptest::option::of(text()))
            .prop_map(|(sender, args)| Reply::ChangeFrom { sender, args }),
        text().prop_map(Reply::AddRcpt),
        (text(), proptest::option::of(text()))
            .prop_map(|(recipient, args)| Reply::AddRcptPar { recipient, args }),
        text().prop_map(Reply::DeleteRcpt),
        bytes().prop_map(Reply::ReplaceBody),
        text().prop_map(Reply::Quarantine),
    ]
}

/// Decodes every packet of `bytes`, fed in pieces of `step` bytes.
fn packets(bytes: &[u8], step: usize) -> Vec<Packet> {
    let mut decoder = Decoder::default();
    let mut out = Vec::new();
    for piece in bytes.chunks(step.max(1)) {
        decoder.push(piece);
        while let Some(p) = decoder.next_packet().expect("well-formed") {
            out.push(p);
        }
    }
    assert_eq!(decoder.buffered(), 0);
    out
}

proptest! {
    #[test]
    fn every_command_round_trips(cmds in proptest::collection::vec(command(), 1..6), step in 1usize..64) {
        let mut wire = Vec::new();
        for c in &cmds {
            c.encode(&mut wire).unwrap();
        }
        let decoded: Vec<Command> = packets(&wire, step)
            .iter()
            .map(|p| Command::decode(p).unwrap())
            .collect();
        prop_assert_eq!(decoded, cmds);
    }

    #[test]
    fn every_reply_round_trips(replies in proptest::collection::vec(reply(), 1..6), step in 1usize..64) {
        let mut wire = Vec::new();
        for r in &replies {
            r.encode(&mut wire).unwrap();
        }
        let decoded: Vec<Reply> = packets(&wire, step)
            .iter()
            .map(|p| Reply::decode(p).unwrap())
            .collect();
        prop_assert_eq!(decoded, replies);
    }

    /// Random bytes: the decoder and both parsers return errors or values,
    /// never panic, and the decoder never holds more than one bounded
    /// packet plus what was pushed at once.
    #[test]
    fn random_bytes_never_panic_nor_overallocate(
        input in proptest::collection::vec(any::<u8>(), 0..2048),
        step in 1usize..300,
        max in 1usize..512,
    ) {
        let mut decoder = Decoder::new(max);
        'feed: for piece in input.chunks(step) {
            decoder.push(piece);
            prop_assert!(decoder.buffered() <= max + 4 + step, "holds {} bytes", decoder.buffered());
            prop_assert!(decoder.capacity() <= 2 * (max + 4 + step) + 64, "allocated {}", decoder.capacity());
            loop {
                match decoder.next_packet() {
                    Ok(Some(p)) => {
                        prop_assert!(p.data.len() < max);
                        let _ = Command::decode(&p);
                        let _ = Reply::decode(&p);
                    }
                    Ok(None) => break,
                    Err(_) => break 'feed,
                }
            }
        }
    }

    /// A packet of any code with any data decodes or fails with an error.
    #[test]
    fn any_packet_body_decodes_or_errs(code in any::<u8>(), data in bytes()) {
        let p = Packet { code, data };
        let _ = Command::decode(&p);
        let _ = Reply::decode(&p);
    }
}

#[test]
fn a_nul_inside_a_string_is_refused_when_encoding() {
    let mut out = Vec::new();
    let err = Command::Helo(b"a\0b".to_vec())
        .encode(&mut out)
        .unwrap_err();
    assert_eq!(err.to_string(), "HELO name contains a NUL byte");
}
