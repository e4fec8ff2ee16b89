//! The MTA side of the milter wire format, as little of it as the load
//! generator needs: encode each command Postfix sends, decode the filter's
//! replies incrementally. Kept in this one file so it can give way to the
//! `forkpool-milter` crate's codec once that exists.
//!
//! A packet is a 4-byte big-endian length (of what follows), a command
//! byte, then data; strings are NUL-terminated.

/// The protocol version Postfix speaks (`milter_protocol = 6`).
pub const VERSION: u32 = 6;
/// Every action a version 6 MTA allows (`SMFI_CURR_ACTS`).
pub const ALL_ACTIONS: u32 = 0x1FF;
/// Every protocol step a version 6 MTA offers (`SMFI_CURR_PROT`).
pub const ALL_STEPS: u32 = 0x1F_FFFF;
/// A reply longer than this is refused (libmilter's default bound).
pub const MAX_PACKET: usize = 64 * 1024;

/// Protocol bits a filter answers negotiation with: steps to leave out
/// (`SMFIP_NO*`) and steps it will not answer (`SMFIP_NR_*`).
pub mod step {
    /// The `SMFIP_NO*` bit of each skippable command, by command byte.
    pub const fn no_bit(command: u8) -> u32 {
        match command {
            b'C' => 0x1,
            b'H' => 0x2,
            b'M' => 0x4,
            b'R' => 0x8,
            b'B' => 0x10,
            b'L' => 0x20,
            b'N' => 0x40,
            b'U' => 0x100,
            b'T' => 0x200,
            _ => 0,
        }
    }

    /// The `SMFIP_NR_*` bit of each command a filter may leave
    /// unanswered, by command byte.
    pub const fn no_reply_bit(command: u8) -> u32 {
        match command {
            b'L' => 0x80,
            b'C' => 0x1000,
            b'H' => 0x2000,
            b'M' => 0x4000,
            b'R' => 0x8000,
            b'T' => 0x1_0000,
            b'U' => 0x2_0000,
            b'N' => 0x4_0000,
            b'B' => 0x8_0000,
            _ => 0,
        }
    }
}

/// One packet: `command` and `data`.
pub fn packet(command: u8, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + data.len());
    out.extend_from_slice(&(data.len() as u32 + 1).to_be_bytes());
    out.push(command);
    out.extend_from_slice(data);
    out
}

/// `data` made of NUL-terminated strings.
pub fn strings(parts: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    for part in parts {
        out.extend_from_slice(part.as_bytes());
        out.push(0);
    }
    out
}

/// `SMFIC_OPTNEG`: version, actions and steps the MTA offers.
pub fn negotiate(version: u32, actions: u32, steps: u32) -> Vec<u8> {
    let mut data = Vec::with_capacity(12);
    for word in [version, actions, steps] {
        data.extend_from_slice(&word.to_be_bytes());
    }
    packet(b'O', &data)
}

/// `SMFIC_MACRO`: the macros of the stage of `command`, sent before it.
pub fn macros(command: u8, pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut data = vec![command];
    for (name, value) in pairs {
        data.extend(strings(&[name, value]));
    }
    packet(b'D', &data)
}

/// `SMFIC_CONNECT` from an IPv4 client.
pub fn connect(host: &str, port: u16, ip: &str) -> Vec<u8> {
    let mut data = strings(&[host]);
    data.push(b'4');
    data.extend_from_slice(&port.to_be_bytes());
    data.extend(strings(&[ip]));
    packet(b'C', &data)
}

/// `SMFIC_HEADER`.
pub fn header(name: &str, value: &str) -> Vec<u8> {
    packet(b'L', &strings(&[name, value]))
}

/// A reply's meaning for the command it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The last packet of the answer (continue, accept, reject, tempfail,
    /// discard, a reply code, skip, or the negotiation's answer).
    Final,
    /// A modification at end of message (header added, quarantine, ...)
    /// or progress: more follows.
    Interim,
}

/// What a reply command byte is.
pub fn kind(command: u8) -> Result<Kind, String> {
    match command {
        b'c' | b'a' | b'r' | b't' | b'd' | b'y' | b's' | b'O' => Ok(Kind::Final),
        b'h' | b'i' | b'm' | b'+' | b'-' | b'2' | b'e' | b'b' | b'q' | b'p' => Ok(Kind::Interim),
        other => Err(format!("unknown reply {:?}", other as char)),
    }
}

/// Reply packets, cut from the bytes of a stream as they come.
#[derive(Debug, Default)]
pub struct Replies {
    input: Vec<u8>,
}

impl Replies {
    /// Adds bytes read from the filter.
    pub fn push(&mut self, bytes: &[u8]) {
        self.input.extend_from_slice(bytes);
    }

    /// The next whole packet (command, data), if one has arrived.
    pub fn next_packet(&mut self) -> Result<Option<(u8, Vec<u8>)>, String> {
        let Some(head) = self.input.get(..4) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes(head.try_into().unwrap()) as usize;
        if len == 0 || len > MAX_PACKET {
            return Err(format!("reply of length {len}"));
        }
        if self.input.len() < 4 + len {
            return Ok(None);
        }
        let command = self.input[4];
        let data = self.input[5..4 + len].to_vec();
        self.input.drain(..4 + len);
        Ok(Some((command, data)))
    }
}

/// The steps (third word) of a negotiation reply.
pub fn negotiated_steps(data: &[u8]) -> Result<u32, String> {
    let word = data
        .get(8..12)
        .ok_or_else(|| format!("negotiation reply of {} bytes", data.len()))?;
    Ok(u32::from_be_bytes(word.try_into().unwrap()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_length_command_and_strings() {
        assert_eq!(packet(b'Q', &[]), [0, 0, 0, 1, b'Q']);
        assert_eq!(
            header("A", "b"),
            [0, 0, 0, 5, b'L', b'A', 0, b'b', 0].to_vec()
        );
        let conn = connect("h", 25, "1.2.3.4");
        assert_eq!(&conn[4..8], b"Ch\x004");
        assert_eq!(&conn[8..10], &25u16.to_be_bytes());
    }

    #[test]
    fn cuts_replies_as_they_come() {
        let mut replies = Replies::default();
        let mut bytes = packet(b'h', &strings(&["X", "1"]));
        bytes.extend(packet(b'c', &[]));
        replies.push(&bytes[..3]);
        assert_eq!(replies.next_packet(), Ok(None));
        replies.push(&bytes[3..]);
        let first = replies.next_packet().unwrap().unwrap();
        assert_eq!((first.0, kind(first.0)), (b'h', Ok(Kind::Interim)));
        assert_eq!(replies.next_packet().unwrap().unwrap().0, b'c');
        assert_eq!(replies.next_packet(), Ok(None));
    }

    #[test]
    fn refuses_absurd_lengths() {
        let mut replies = Replies::default();
        replies.push(&[0xFF, 0, 0, 0, b'c']);
        assert!(replies.next_packet().is_err());
    }
}
