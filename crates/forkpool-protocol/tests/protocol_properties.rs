//! Properties of the back-channel codec, and the exact bytes of every
//! message as `docs/protocol.md` documents them, so the two cannot drift.

use forkpool_protocol::wire::{
    ChildMessage, MessageBuf, ParentMessage, ProtocolError, MAX_MESSAGE_LEN, VERSION,
};
use proptest::prelude::*;

fn child_message() -> impl Strategy<Value = ChildMessage> {
    prop_oneof![
        any::<u32>().prop_map(|pid| ChildMessage::Ready { pid }),
        any::<u32>().prop_map(|pid| ChildMessage::ReadyOnBoard { pid }),
        any::<u32>().prop_map(|pid| ChildMessage::ReadyByMessages { pid }),
        Just(ChildMessage::Idle),
        Just(ChildMessage::Busy),
        Just(ChildMessage::Missed),
        Just(ChildMessage::Next),
        Just(ChildMessage::Leaving),
        any::<u32>().prop_map(|seq| ChildMessage::Pong { seq }),
        (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()).prop_map(
            |(open, capacity, received, running)| ChildMessage::Load {
                open,
                capacity,
                received,
                running,
            }
        ),
    ]
}

fn parent_message() -> impl Strategy<Value = ParentMessage> {
    prop_oneof![
        any::<u16>().prop_map(|listener| ParentMessage::Connection { listener }),
        any::<u16>().prop_map(|listener| ParentMessage::Accept { listener }),
        any::<u32>().prop_map(|seq| ParentMessage::Ping { seq }),
        Just(ParentMessage::Quit),
    ]
}

fn child_bytes(msg: ChildMessage) -> Vec<u8> {
    msg.encode(&mut MessageBuf::default()).to_vec()
}

fn parent_bytes(msg: ParentMessage) -> Vec<u8> {
    msg.encode(&mut MessageBuf::default()).to_vec()
}

/// Byte strings that look like messages more often than uniform noise does:
/// a right version byte and a known kind letter, with any payload.
fn plausible_datagram() -> impl Strategy<Value = Vec<u8>> {
    let kind = prop_oneof![
        prop::sample::select(b"RKGIBMNXPLCApQ".to_vec()),
        any::<u8>(),
    ];
    (kind, prop::collection::vec(any::<u8>(), 0..16)).prop_map(|(kind, payload)| {
        let mut bytes = vec![VERSION, kind];
        bytes.extend(payload);
        bytes
    })
}

fn any_datagram() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..64),
        plausible_datagram()
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Whatever a child writes, decoding returns and its error can be shown.
    #[test]
    fn decoding_any_bytes_never_panics(bytes in any_datagram()) {
        if let Err(e) = ChildMessage::decode(&bytes) {
            prop_assert!(!e.to_string().is_empty());
        }
        if let Err(e) = ParentMessage::decode(&bytes) {
            prop_assert!(!e.to_string().is_empty());
        }
    }

    /// A datagram decodes only if it is exactly the encoding of what it
    /// decodes to: there is one way to write each message.
    #[test]
    fn only_canonical_bytes_decode(bytes in any_datagram()) {
        if let Ok(msg) = ChildMessage::decode(&bytes) {
            let canonical = child_bytes(msg);
            // The older `L`, without `running`, is the newer one cut short.
            let older_load = bytes.len() == 14 && canonical[14..] == [0, 0, 0, 0];
            let canonical = if older_load { canonical[..14].to_vec() } else { canonical };
            prop_assert_eq!(canonical, bytes.clone());
        }
        if let Ok(msg) = ParentMessage::decode(&bytes) {
            prop_assert_eq!(parent_bytes(msg), bytes);
        }
    }

    #[test]
    fn child_messages_round_trip(msg in child_message()) {
        let bytes = child_bytes(msg);
        prop_assert!(bytes.len() <= MAX_MESSAGE_LEN);
        prop_assert_eq!(ChildMessage::decode(&bytes), Ok(msg));
    }

    #[test]
    fn parent_messages_round_trip(msg in parent_message()) {
        let bytes = parent_bytes(msg);
        prop_assert!(bytes.len() <= MAX_MESSAGE_LEN);
        prop_assert_eq!(ParentMessage::decode(&bytes), Ok(msg));
    }

    /// The two directions share no kind letter, so a message sent the wrong
    /// way is rejected rather than misread.
    #[test]
    fn a_message_is_unknown_in_the_other_direction(
        child in child_message(),
        parent in parent_message(),
    ) {
        let kind = child_bytes(child)[1];
        prop_assert_eq!(
            ParentMessage::decode(&child_bytes(child)),
            Err(ProtocolError::UnknownKind(kind))
        );
        let kind = parent_bytes(parent)[1];
        prop_assert_eq!(
            ChildMessage::decode(&parent_bytes(parent)),
            Err(ProtocolError::UnknownKind(kind))
        );
    }

    #[test]
    fn a_byte_appended_is_rejected(
        child in child_message(),
        parent in parent_message(),
        extra in any::<u8>(),
    ) {
        let mut bytes = child_bytes(child);
        bytes.push(extra);
        prop_assert!(ChildMessage::decode(&bytes).is_err(), "{:?} accepted", bytes);
        let mut bytes = parent_bytes(parent);
        bytes.push(extra);
        prop_assert!(ParentMessage::decode(&bytes).is_err(), "{:?} accepted", bytes);
    }

    #[test]
    fn a_byte_removed_is_rejected(
        child in child_message(),
        parent in parent_message(),
        at in any::<prop::sample::Index>(),
    ) {
        let mut bytes = child_bytes(child);
        bytes.remove(at.index(bytes.len()));
        prop_assert!(ChildMessage::decode(&bytes).is_err(), "{:?} accepted", bytes);
        let mut bytes = parent_bytes(parent);
        bytes.remove(at.index(bytes.len()));
        prop_assert!(ParentMessage::decode(&bytes).is_err(), "{:?} accepted", bytes);
    }

    /// The version byte is checked before anything else.
    #[test]
    fn another_version_is_unsupported(
        version in any::<u8>().prop_filter("not ours", |v| *v != VERSION),
        rest in prop::collection::vec(any::<u8>(), 0..20),
    ) {
        let mut bytes = vec![version];
        bytes.extend(rest);
        prop_assert_eq!(
            ChildMessage::decode(&bytes),
            Err(ProtocolError::UnsupportedVersion(version))
        );
        prop_assert_eq!(
            ParentMessage::decode(&bytes),
            Err(ProtocolError::UnsupportedVersion(version))
        );
    }
}

// ---------------------------------------------------------------------------
// The exact bytes documented in docs/protocol.md
// ---------------------------------------------------------------------------

const PROTOCOL_DOC: &str = include_str!("../../../docs/protocol.md");

/// The bytes of an example as written in the doc's tables (`01 52 ...`),
/// after checking the doc really shows it.
fn documented(hex: &str) -> Vec<u8> {
    assert!(
        PROTOCOL_DOC.contains(&format!("`{hex}`")),
        "docs/protocol.md does not show the example `{hex}`"
    );
    hex.split(' ')
        .map(|b| u8::from_str_radix(b, 16).expect("hex byte"))
        .collect()
}

fn assert_child(msg: ChildMessage, hex: &str) {
    let bytes = documented(hex);
    assert_eq!(child_bytes(msg), bytes, "{msg:?}");
    assert_eq!(ChildMessage::decode(&bytes), Ok(msg));
}

fn assert_parent(msg: ParentMessage, hex: &str) {
    let bytes = documented(hex);
    assert_eq!(parent_bytes(msg), bytes, "{msg:?}");
    assert_eq!(ParentMessage::decode(&bytes), Ok(msg));
}

#[test]
fn the_header_is_version_1() {
    assert_eq!(VERSION, 1);
    assert_eq!(MAX_MESSAGE_LEN, 18);
    assert!(PROTOCOL_DOC.contains("`0x01` for this version"));
    assert!(PROTOCOL_DOC.contains("Messages are at most 18 bytes long"));
}

#[test]
fn child_messages_have_the_documented_bytes() {
    assert_child(ChildMessage::Ready { pid: 123_456 }, "01 52 00 01 e2 40");
    assert_child(
        ChildMessage::ReadyOnBoard { pid: 123_456 },
        "01 4b 00 01 e2 40",
    );
    assert_child(
        ChildMessage::ReadyByMessages { pid: 123_456 },
        "01 47 00 01 e2 40",
    );
    assert_child(ChildMessage::Idle, "01 49");
    assert_child(ChildMessage::Busy, "01 42");
    assert_child(ChildMessage::Missed, "01 4d");
    assert_child(ChildMessage::Next, "01 4e");
    assert_child(ChildMessage::Leaving, "01 58");
    assert_child(ChildMessage::Pong { seq: 0xdead_beef }, "01 50 de ad be ef");
    assert_child(
        ChildMessage::Load {
            open: 3,
            capacity: 256,
            received: 7,
            running: 2,
        },
        "01 4c 00 00 00 03 00 00 01 00 00 00 00 07 00 00 00 02",
    );
}

/// A child that sends the older `L` without `running` is read as running
/// nothing; any other length is malformed.
#[test]
fn the_older_load_report_reads_as_running_nothing() {
    let older = [1, b'L', 0, 0, 0, 3, 0, 0, 1, 0, 0, 0, 0, 7];
    assert_eq!(
        ChildMessage::decode(&older),
        Ok(ChildMessage::Load {
            open: 3,
            capacity: 256,
            received: 7,
            running: 0,
        })
    );
    assert!(ChildMessage::decode(&older[..13]).is_err());
    let mut longer = [0u8; 19];
    longer[..2].copy_from_slice(&[1, b'L']);
    assert!(ChildMessage::decode(&longer).is_err());
}

#[test]
fn parent_messages_have_the_documented_bytes() {
    assert_parent(ParentMessage::Connection { listener: 258 }, "01 43 01 02");
    assert_parent(ParentMessage::Accept { listener: 0 }, "01 41 00 00");
    assert_parent(ParentMessage::Ping { seq: 7 }, "01 70 00 00 00 07");
    assert_parent(ParentMessage::Quit, "01 51");
}

#[test]
fn only_connection_carries_a_descriptor() {
    assert!(ParentMessage::Connection { listener: 0 }.carries_fd());
    assert!(!ParentMessage::Accept { listener: 0 }.carries_fd());
    assert!(!ParentMessage::Ping { seq: 0 }.carries_fd());
    assert!(!ParentMessage::Quit.carries_fd());
}

#[test]
fn malformed_messages_get_the_documented_errors() {
    assert_eq!(ChildMessage::decode(&[]), Err(ProtocolError::Empty));
    assert_eq!(
        ChildMessage::decode(&[0x01, b'Z']),
        Err(ProtocolError::UnknownKind(b'Z'))
    );
    assert_eq!(
        ChildMessage::decode(&[0x01, b'R', 0, 0, 1]),
        Err(ProtocolError::WrongLength {
            kind: b'R',
            expected: 6,
            got: 5
        })
    );
    assert_eq!(
        ParentMessage::decode(&[0x02, b'Q']),
        Err(ProtocolError::UnsupportedVersion(2))
    );
}

// ---------------------------------------------------------------------
// Templates (`--preload`): protocol version 2
// ---------------------------------------------------------------------

mod templates {
    use super::{any_datagram, child_message, parent_message};
    use forkpool_protocol::wire::{
        decode_child_v2, encode_child_v2, ChildMessage, MessageBuf, ParentMessage, ProtocolError,
        TemplateReply, TemplateRequest, WorkerOrder, MAX_MESSAGE_LEN, TEMPLATE_VERSION,
    };
    use proptest::prelude::*;

    fn request() -> impl Strategy<Value = TemplateRequest> {
        prop_oneof![
            (any::<u32>(), any::<u32>())
                .prop_map(|(slot, generation)| TemplateRequest::Fork { slot, generation }),
            any::<u32>().prop_map(|seq| TemplateRequest::Ping { seq }),
            Just(TemplateRequest::Quit),
        ]
    }

    fn reply() -> impl Strategy<Value = TemplateReply> {
        prop_oneof![
            any::<u32>().prop_map(|pid| TemplateReply::Ready { pid }),
            (any::<u32>(), any::<u32>())
                .prop_map(|(slot, pid)| TemplateReply::Forked { slot, pid }),
            (any::<u32>(), any::<u32>())
                .prop_map(|(slot, errno)| TemplateReply::ForkFailed { slot, errno }),
            any::<u32>().prop_map(|seq| TemplateReply::Pong { seq }),
        ]
    }

    fn order() -> impl Strategy<Value = WorkerOrder> {
        prop_oneof![
            parent_message().prop_map(WorkerOrder::Parent),
            Just(WorkerOrder::BecomeTemplate),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn requests_round_trip(msg in request()) {
            let mut buf = MessageBuf::default();
            let bytes = msg.encode(&mut buf);
            prop_assert_eq!(bytes[0], TEMPLATE_VERSION);
            prop_assert!(bytes.len() <= MAX_MESSAGE_LEN);
            prop_assert_eq!(TemplateRequest::decode(bytes), Ok(msg));
        }

        #[test]
        fn replies_round_trip(msg in reply()) {
            let mut buf = MessageBuf::default();
            let bytes = msg.encode(&mut buf);
            prop_assert_eq!(bytes[0], TEMPLATE_VERSION);
            prop_assert_eq!(TemplateReply::decode(bytes), Ok(msg));
        }

        #[test]
        fn worker_orders_round_trip(msg in order()) {
            let mut buf = MessageBuf::default();
            let bytes = msg.encode(&mut buf);
            prop_assert_eq!(bytes[0], TEMPLATE_VERSION);
            prop_assert_eq!(WorkerOrder::decode(bytes), Ok(msg));
        }

        #[test]
        fn version_2_child_messages_round_trip(msg in child_message()) {
            let mut buf = MessageBuf::default();
            let bytes = encode_child_v2(msg, &mut buf).to_vec();
            prop_assert_eq!(bytes[0], TEMPLATE_VERSION);
            prop_assert_eq!(decode_child_v2(&bytes), Ok(msg));
            // A version 1 decoder refuses it: the byte says which protocol.
            prop_assert_eq!(
                ChildMessage::decode(&bytes),
                Err(ProtocolError::UnsupportedVersion(TEMPLATE_VERSION))
            );
        }

        /// Whatever arrives, the template decoders return, and only the
        /// canonical encoding of a message decodes to it.
        #[test]
        fn template_decoders_accept_only_canonical_bytes(mut bytes in any_datagram()) {
            if let Some(first) = bytes.first_mut() {
                if *first == 1 { *first = TEMPLATE_VERSION; }
            }
            let mut buf = MessageBuf::default();
            match TemplateRequest::decode(&bytes) {
                Ok(msg) => prop_assert_eq!(msg.encode(&mut buf), &bytes[..]),
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
            match TemplateReply::decode(&bytes) {
                Ok(msg) => prop_assert_eq!(msg.encode(&mut buf), &bytes[..]),
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
            match WorkerOrder::decode(&bytes) {
                Ok(msg) => prop_assert_eq!(msg.encode(&mut buf), &bytes[..]),
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
        }

        #[test]
        fn a_byte_appended_to_a_request_is_rejected(msg in request(), extra in any::<u8>()) {
            let mut bytes = msg.encode(&mut MessageBuf::default()).to_vec();
            bytes.push(extra);
            let is_wrong_length =
                matches!(TemplateRequest::decode(&bytes), Err(ProtocolError::WrongLength { .. }));
            prop_assert!(is_wrong_length);
        }
    }

    fn documented(hex: &str) -> Vec<u8> {
        super::documented(hex)
    }

    #[test]
    fn template_messages_have_the_documented_bytes() {
        let mut buf = MessageBuf::default();
        let fork = TemplateRequest::Fork {
            slot: 3,
            generation: 2,
        };
        assert_eq!(
            fork.encode(&mut buf),
            documented("02 46 00 00 00 03 00 00 00 02")
        );
        assert_eq!(
            TemplateRequest::Ping { seq: 7 }.encode(&mut buf),
            documented("02 70 00 00 00 07")
        );
        assert_eq!(TemplateRequest::Quit.encode(&mut buf), documented("02 51"));
        assert_eq!(
            TemplateReply::Ready { pid: 123456 }.encode(&mut buf),
            documented("02 52 00 01 e2 40")
        );
        assert_eq!(
            TemplateReply::Forked {
                slot: 3,
                pid: 123457
            }
            .encode(&mut buf),
            documented("02 57 00 00 00 03 00 01 e2 41")
        );
        assert_eq!(
            TemplateReply::ForkFailed { slot: 3, errno: 11 }.encode(&mut buf),
            documented("02 45 00 00 00 03 00 00 00 0b")
        );
        assert_eq!(
            TemplateReply::Pong { seq: 7 }.encode(&mut buf),
            documented("02 50 00 00 00 07")
        );
        assert_eq!(
            WorkerOrder::BecomeTemplate.encode(&mut buf),
            documented("02 54")
        );
        assert_eq!(
            encode_child_v2(ChildMessage::Idle, &mut buf),
            documented("02 49")
        );
        assert_eq!(
            WorkerOrder::Parent(ParentMessage::Quit).encode(&mut buf),
            documented("02 51")
        );
    }

    #[test]
    fn fork_carries_two_descriptors_and_become_template_one() {
        let fork = TemplateRequest::Fork {
            slot: 0,
            generation: 0,
        };
        assert_eq!(fork.fd_count(), 2);
        assert_eq!(TemplateRequest::Quit.fd_count(), 0);
        assert_eq!(WorkerOrder::BecomeTemplate.fd_count(), 1);
        assert_eq!(
            WorkerOrder::Parent(ParentMessage::Connection { listener: 0 }).fd_count(),
            1
        );
        assert_eq!(WorkerOrder::Parent(ParentMessage::Quit).fd_count(), 0);
    }
}
