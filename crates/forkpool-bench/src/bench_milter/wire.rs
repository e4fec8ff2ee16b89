//! The MTA's side of the milter wire format for the load generator, on
//! the `forkpool-milter` crate's codec: commands built as
//! [`Command`]s and encoded by it, replies cut by its [`Decoder`] and read
//! by [`Reply::decode`]. What stays here is the script's own knowledge:
//! what Postfix offers, and which negotiated bit leaves a command out or
//! unanswered.

use forkpool_milter::{Actions, Address, Command, Decoder, OptNeg, Protocol, Reply};

/// A reply longer than this is refused (libmilter's default bound).
const MAX_PACKET: usize = 64 * 1024;

/// The bytes of `commands`, back to back.
pub fn encode(commands: &[Command]) -> Vec<u8> {
    let mut out = Vec::new();
    for command in commands {
        command
            .encode(&mut out)
            .expect("the script's commands hold no NUL inside a string");
    }
    out
}

/// `SMFIC_OPTNEG` as Postfix sends it (`milter_protocol = 6`): every
/// action and every step a version 6 MTA offers (`SMFI_CURR_ACTS`,
/// `SMFI_CURR_PROT`).
pub fn negotiate() -> Command {
    Command::OptNeg(OptNeg {
        version: 6,
        actions: Actions(0x1FF),
        protocol: Protocol(0x1F_FFFF),
    })
}

/// `SMFIC_MACRO`: the macros of the stage of `command`, sent before it.
pub fn macros(command: u8, pairs: &[(&str, &str)]) -> Command {
    Command::Macros {
        stage: command,
        pairs: pairs
            .iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect(),
    }
}

/// `SMFIC_CONNECT` from an IPv4 client.
pub fn connect(host: &str, port: u16, ip: &str) -> Command {
    Command::Connect {
        hostname: host.as_bytes().to_vec(),
        address: Address::Inet {
            port,
            address: ip.as_bytes().to_vec(),
        },
    }
}

/// `SMFIC_HEADER`.
pub fn header(name: &str, value: &str) -> Command {
    Command::Header {
        name: name.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
    }
}

/// The `SMFIP_NO*` bit that leaves out the command `code`.
pub fn no_bit(code: u8) -> Protocol {
    match code {
        b'C' => Protocol::NO_CONNECT,
        b'H' => Protocol::NO_HELO,
        b'M' => Protocol::NO_MAIL,
        b'R' => Protocol::NO_RCPT,
        b'B' => Protocol::NO_BODY,
        b'L' => Protocol::NO_HEADERS,
        b'N' => Protocol::NO_EOH,
        b'U' => Protocol::NO_UNKNOWN,
        b'T' => Protocol::NO_DATA,
        _ => Protocol::NONE,
    }
}

/// The `SMFIP_NR_*` bit that leaves the command `code` unanswered.
pub fn no_reply_bit(code: u8) -> Protocol {
    match code {
        b'L' => Protocol::NR_HEADER,
        b'C' => Protocol::NR_CONNECT,
        b'H' => Protocol::NR_HELO,
        b'M' => Protocol::NR_MAIL,
        b'R' => Protocol::NR_RCPT,
        b'T' => Protocol::NR_DATA,
        b'U' => Protocol::NR_UNKNOWN,
        b'N' => Protocol::NR_EOH,
        b'B' => Protocol::NR_BODY,
        _ => Protocol::NONE,
    }
}

/// Whether `agreed` has `bit` (and `bit` is one).
pub fn has(agreed: Protocol, bit: Protocol) -> bool {
    bit != Protocol::NONE && agreed.contains(bit)
}

/// Replies, cut from the bytes of a stream as they come.
#[derive(Debug)]
pub struct Replies {
    decoder: Decoder,
}

impl Default for Replies {
    fn default() -> Self {
        Replies {
            decoder: Decoder::new(MAX_PACKET),
        }
    }
}

impl Replies {
    /// Adds bytes read from the filter.
    pub fn push(&mut self, bytes: &[u8]) {
        self.decoder.push(bytes);
    }

    /// The next whole reply, if one has arrived.
    pub fn next_reply(&mut self) -> Result<Option<Reply>, String> {
        match self.decoder.next_packet().map_err(|e| e.to_string())? {
            Some(packet) => Reply::decode(&packet).map(Some).map_err(|e| e.to_string()),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_as_postfix_sends() {
        assert_eq!(encode(&[Command::Quit]), [0, 0, 0, 1, b'Q']);
        assert_eq!(
            encode(&[header("A", "b")]),
            [0, 0, 0, 5, b'L', b'A', 0, b'b', 0]
        );
        let conn = encode(&[connect("h", 25, "1.2.3.4")]);
        assert_eq!(&conn[4..8], b"Ch\x004");
        assert_eq!(&conn[8..10], &25u16.to_be_bytes());
        let offer = encode(&[negotiate()]);
        assert_eq!(&offer[4..], b"O\0\0\0\x06\0\0\x01\xff\0\x1f\xff\xff");
    }

    #[test]
    fn cuts_replies_as_they_come() {
        let mut bytes = Vec::new();
        let add = Reply::AddHeader {
            name: b"X".to_vec(),
            value: b"1".to_vec(),
        };
        add.encode(&mut bytes).unwrap();
        Reply::Continue.encode(&mut bytes).unwrap();
        let mut replies = Replies::default();
        replies.push(&bytes[..3]);
        assert_eq!(replies.next_reply(), Ok(None));
        replies.push(&bytes[3..]);
        let first = replies.next_reply().unwrap().unwrap();
        assert!(!first.is_final());
        assert_eq!(first, add);
        assert_eq!(replies.next_reply(), Ok(Some(Reply::Continue)));
        assert_eq!(replies.next_reply(), Ok(None));
    }

    #[test]
    fn refuses_absurd_lengths_and_unknown_replies() {
        let mut replies = Replies::default();
        replies.push(&[0xFF, 0, 0, 0, b'c']);
        assert!(replies.next_reply().is_err());
        let mut replies = Replies::default();
        replies.push(&[0, 0, 0, 1, b'Z']);
        assert!(replies.next_reply().is_err());
    }

    #[test]
    fn steps_map_to_their_negotiation_bits() {
        assert_eq!(no_bit(b'L').bits(), 0x20);
        assert_eq!(no_reply_bit(b'L').bits(), 0x80);
        assert_eq!(no_bit(b'T').bits(), 0x200);
        assert_eq!(no_reply_bit(b'B').bits(), 0x8_0000);
        assert!(has(Protocol::NO_HEADERS | Protocol::NR_MAIL, no_bit(b'L')));
        assert!(!has(Protocol(0x1F_FFFF), no_bit(b'E')));
    }
}
