//! The MTA's side over a blocking stream: send commands, read replies.
//! For tests, load generators and tools; a filter never needs it.

use std::io::{self, Read, Write};

use crate::command::Command;
use crate::reply::Reply;
use crate::wire::Decoder;

/// Encodes `command` and writes it.
pub fn send_command(stream: &mut impl Write, command: &Command) -> io::Result<()> {
    let mut out = Vec::new();
    command
        .encode(&mut out)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    stream.write_all(&out)
}

/// The next reply, reading as needed into `decoder`; `None` once the
/// filter has closed the connection (or reset it). A reply that does not
/// decode is an [`io::ErrorKind::InvalidData`] error.
pub fn read_reply(stream: &mut impl Read, decoder: &mut Decoder) -> io::Result<Option<Reply>> {
    let invalid = |e| io::Error::new(io::ErrorKind::InvalidData, e);
    loop {
        if let Some(packet) = decoder.next_packet().map_err(invalid)? {
            return Reply::decode(&packet).map(Some).map_err(invalid);
        }
        let mut buf = [0u8; 4096];
        match stream.read(&mut buf) {
            Ok(0) => return Ok(None),
            Ok(n) => decoder.push(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}
