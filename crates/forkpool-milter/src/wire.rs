//! Packets on the wire: a 4-byte big-endian length, then that many bytes:
//! a command byte and its data. The [`Decoder`] is incremental and
//! bounded; [`Fields`] reads the NUL-terminated strings and numbers inside
//! one packet.

use std::fmt;

use crate::consts::{DEFAULT_MAX_PACKET, LEN_BYTES};

/// One packet: its command (or reply) byte and its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// The command byte (`SMFIC_*` from the MTA, `SMFIR_*` from a filter).
    pub code: u8,
    /// Everything after it.
    pub data: Vec<u8>,
}

/// A packet that cannot be decoded or encoded. Each one ends the
/// conversation it came from, and only that one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// A length of zero: not even a command byte.
    Empty,
    /// A length above the decoder's bound.
    TooLong {
        /// The length the packet announced.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// A command or reply byte this crate does not know.
    UnknownCode(u8),
    /// The data ended before a field of the packet `code`.
    Truncated {
        /// The packet's command byte.
        code: u8,
        /// The missing field.
        field: &'static str,
    },
    /// A string without its terminating NUL.
    Unterminated {
        /// The packet's command byte.
        code: u8,
        /// The field.
        field: &'static str,
    },
    /// Bytes left after the last field.
    Trailing {
        /// The packet's command byte.
        code: u8,
    },
    /// A field holds a value the protocol does not allow.
    Invalid {
        /// The packet's command byte.
        code: u8,
        /// What is wrong.
        what: &'static str,
    },
    /// A string to encode contains a NUL byte, which would end it early.
    Nul {
        /// The field.
        field: &'static str,
    },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = |code: &u8| char::from(*code).escape_default().to_string();
        match self {
            WireError::Empty => f.write_str("a packet of length 0 has no command byte"),
            WireError::TooLong { len, max } => {
                write!(
                    f,
                    "a packet of {len} bytes is longer than the {max} allowed"
                )
            }
            WireError::UnknownCode(code) => write!(f, "unknown command byte '{}'", name(code)),
            WireError::Truncated { code, field } => {
                write!(f, "'{}' packet ends before its {field}", name(code))
            }
            WireError::Unterminated { code, field } => {
                write!(f, "'{}' packet: {field} has no terminating NUL", name(code))
            }
            WireError::Trailing { code } => {
                write!(f, "'{}' packet has bytes after its last field", name(code))
            }
            WireError::Invalid { code, what } => write!(f, "'{}' packet: {what}", name(code)),
            WireError::Nul { field } => write!(f, "{field} contains a NUL byte"),
        }
    }
}

impl std::error::Error for WireError {}

/// Splits a byte stream into packets, holding at most one partial packet
/// (never more than its bound) between calls.
#[derive(Debug)]
pub struct Decoder {
    buf: Vec<u8>,
    start: usize,
    max: usize,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder::new(DEFAULT_MAX_PACKET)
    }
}

impl Decoder {
    /// A decoder refusing packets longer than `max` bytes (command byte
    /// included).
    pub fn new(max: usize) -> Decoder {
        Decoder {
            buf: Vec::new(),
            start: 0,
            max,
        }
    }

    /// Appends bytes read from the peer.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes held and not yet decoded.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// The bytes of memory the decoder holds (for the bound's tests).
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// The next whole packet, `None` if it has not all arrived, or the
    /// error that makes the stream undecodable (after which the decoder
    /// should be dropped).
    pub fn next_packet(&mut self) -> Result<Option<Packet>, WireError> {
        let rest = &self.buf[self.start..];
        let Some(head) = rest.get(..LEN_BYTES) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        if len == 0 {
            return Err(WireError::Empty);
        }
        if len > self.max {
            return Err(WireError::TooLong { len, max: self.max });
        }
        let Some(body) = rest.get(LEN_BYTES..LEN_BYTES + len) else {
            return Ok(None);
        };
        let packet = Packet {
            code: body[0],
            data: body[1..].to_vec(),
        };
        self.start += LEN_BYTES + len;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start > self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        Ok(Some(packet))
    }
}

/// Appends one packet to `out`.
pub fn encode_packet(code: u8, data: &[u8], out: &mut Vec<u8>) {
    let len = u32::try_from(data.len() + 1).expect("a milter packet fits in 4 GiB");
    out.extend_from_slice(&len.to_be_bytes());
    out.push(code);
    out.extend_from_slice(data);
}

/// Reads the fields of one packet's data, front to back.
#[derive(Debug)]
pub struct Fields<'a> {
    code: u8,
    data: &'a [u8],
}

impl<'a> Fields<'a> {
    /// The fields of the packet `code` with `data`.
    pub fn new(code: u8, data: &'a [u8]) -> Fields<'a> {
        Fields { code, data }
    }

    /// A NUL-terminated string, without its NUL.
    pub fn string(&mut self, field: &'static str) -> Result<Vec<u8>, WireError> {
        let code = self.code;
        let end = self
            .data
            .iter()
            .position(|&b| b == 0)
            .ok_or(WireError::Unterminated { code, field })?;
        let value = self.data[..end].to_vec();
        self.data = &self.data[end + 1..];
        Ok(value)
    }

    /// A big-endian u32.
    pub fn u32(&mut self, field: &'static str) -> Result<u32, WireError> {
        let bytes = self.take(4, field)?;
        Ok(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    /// A big-endian u16.
    pub fn u16(&mut self, field: &'static str) -> Result<u16, WireError> {
        let bytes = self.take(2, field)?;
        Ok(u16::from_be_bytes([bytes[0], bytes[1]]))
    }

    /// One byte.
    pub fn byte(&mut self, field: &'static str) -> Result<u8, WireError> {
        Ok(self.take(1, field)?[0])
    }

    /// Everything left.
    pub fn rest(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.data).to_vec()
    }

    /// Whether every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Fails unless every byte has been read.
    pub fn end(&self) -> Result<(), WireError> {
        if self.data.is_empty() {
            Ok(())
        } else {
            Err(WireError::Trailing { code: self.code })
        }
    }

    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], WireError> {
        if self.data.len() < n {
            return Err(WireError::Truncated {
                code: self.code,
                field,
            });
        }
        let (head, tail) = self.data.split_at(n);
        self.data = tail;
        Ok(head)
    }
}

/// Appends `value` and its NUL, refusing a value with a NUL inside.
pub fn put_string(out: &mut Vec<u8>, value: &[u8], field: &'static str) -> Result<(), WireError> {
    if value.contains(&0) {
        return Err(WireError::Nul { field });
    }
    out.extend_from_slice(value);
    out.push(0);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_split_anywhere_come_out_whole() {
        let mut bytes = Vec::new();
        encode_packet(b'H', b"mx.example\0", &mut bytes);
        encode_packet(b'N', b"", &mut bytes);
        for cut in 0..bytes.len() {
            let mut decoder = Decoder::default();
            decoder.push(&bytes[..cut]);
            let mut got = Vec::new();
            while let Some(p) = decoder.next_packet().unwrap() {
                got.push(p);
            }
            decoder.push(&bytes[cut..]);
            while let Some(p) = decoder.next_packet().unwrap() {
                got.push(p);
            }
            assert_eq!(got.len(), 2, "cut at {cut}");
            assert_eq!(got[0].data, b"mx.example\0");
            assert_eq!(got[1].code, b'N');
            assert_eq!(decoder.buffered(), 0);
        }
    }

    #[test]
    fn lengths_are_bounded() {
        let mut decoder = Decoder::new(100);
        decoder.push(&101u32.to_be_bytes());
        assert_eq!(
            decoder.next_packet(),
            Err(WireError::TooLong { len: 101, max: 100 })
        );
        let mut decoder = Decoder::new(100);
        decoder.push(&[0, 0, 0, 0]);
        assert_eq!(decoder.next_packet(), Err(WireError::Empty));
    }
}
