//! The protocol's numbers, as libmilter's `mfdef.h` and `mfapi.h` define
//! them (checked against Debian's `libmilter-dev` 8.17 headers).

/// The protocol version this crate speaks (Postfix's `milter_protocol = 6`).
pub const VERSION: u32 = 6;

/// Bytes of the length prefix of every packet.
pub const LEN_BYTES: usize = 4;

/// The largest body chunk an MTA sends unless a bigger size was negotiated
/// (`MILTER_CHUNK_SIZE`), and so the size [`replace_body`] splits into.
///
/// [`replace_body`]: crate::EomActions::replace_body
pub const CHUNK_SIZE: usize = 65535;

/// The longest packet (command byte and data) the decoder accepts unless
/// told otherwise: room for a 1 MiB body chunk (`SMFIP_MDS_1M`) and for
/// Postfix's longest header (`header_size_limit`, 100 KiB by default).
pub const DEFAULT_MAX_PACKET: usize = 1024 * 1024 + 1;

/// Command bytes the MTA sends (`SMFIC_*`).
pub mod cmd {
    /// `SMFIC_ABORT`: forget the current message.
    pub const ABORT: u8 = b'A';
    /// `SMFIC_BODY`: a chunk of the body.
    pub const BODY: u8 = b'B';
    /// `SMFIC_CONNECT`: the SMTP client's host and address.
    pub const CONNECT: u8 = b'C';
    /// `SMFIC_MACRO`: macro values for the next command.
    pub const MACRO: u8 = b'D';
    /// `SMFIC_BODYEOB`: end of the message.
    pub const BODYEOB: u8 = b'E';
    /// `SMFIC_HELO`: the HELO/EHLO name.
    pub const HELO: u8 = b'H';
    /// `SMFIC_QUIT_NC`: end of this SMTP session, a new one follows on the
    /// same milter connection.
    pub const QUIT_NC: u8 = b'K';
    /// `SMFIC_HEADER`: one header.
    pub const HEADER: u8 = b'L';
    /// `SMFIC_MAIL`: MAIL FROM.
    pub const MAIL: u8 = b'M';
    /// `SMFIC_EOH`: end of the headers.
    pub const EOH: u8 = b'N';
    /// `SMFIC_OPTNEG`: option negotiation.
    pub const OPTNEG: u8 = b'O';
    /// `SMFIC_QUIT`: close the milter connection.
    pub const QUIT: u8 = b'Q';
    /// `SMFIC_RCPT`: RCPT TO.
    pub const RCPT: u8 = b'R';
    /// `SMFIC_DATA`: the DATA command.
    pub const DATA: u8 = b'T';
    /// `SMFIC_UNKNOWN`: an SMTP command the MTA does not know.
    pub const UNKNOWN: u8 = b'U';
}

/// Reply bytes the filter sends (`SMFIR_*`).
pub mod reply {
    /// `SMFIR_ADDRCPT`: add a recipient.
    pub const ADDRCPT: u8 = b'+';
    /// `SMFIR_DELRCPT`: delete a recipient.
    pub const DELRCPT: u8 = b'-';
    /// `SMFIR_ADDRCPT_PAR`: add a recipient with ESMTP arguments.
    pub const ADDRCPT_PAR: u8 = b'2';
    /// `SMFIR_SHUTDOWN`: 421, close the SMTP session.
    pub const SHUTDOWN: u8 = b'4';
    /// `SMFIR_ACCEPT`: accept without further filtering.
    pub const ACCEPT: u8 = b'a';
    /// `SMFIR_REPLBODY`: a chunk of the replacement body.
    pub const REPLBODY: u8 = b'b';
    /// `SMFIR_CONTINUE`: go on.
    pub const CONTINUE: u8 = b'c';
    /// `SMFIR_DISCARD`: accept and throw the message away.
    pub const DISCARD: u8 = b'd';
    /// `SMFIR_CHGFROM`: change the envelope sender.
    pub const CHGFROM: u8 = b'e';
    /// `SMFIR_CONN_FAIL`: make the connection fail.
    pub const CONN_FAIL: u8 = b'f';
    /// `SMFIR_ADDHEADER`: add a header at the end.
    pub const ADDHEADER: u8 = b'h';
    /// `SMFIR_INSHEADER`: insert a header at an index.
    pub const INSHEADER: u8 = b'i';
    /// `SMFIR_CHGHEADER`: change (or delete) the n-th header of a name.
    pub const CHGHEADER: u8 = b'm';
    /// `SMFIR_PROGRESS`: still working, reset the MTA's timeout.
    pub const PROGRESS: u8 = b'p';
    /// `SMFIR_QUARANTINE`: hold the message, with a reason.
    pub const QUARANTINE: u8 = b'q';
    /// `SMFIR_REJECT`: 5xx.
    pub const REJECT: u8 = b'r';
    /// `SMFIR_SKIP`: skip the rest of the body.
    pub const SKIP: u8 = b's';
    /// `SMFIR_TEMPFAIL`: 4xx.
    pub const TEMPFAIL: u8 = b't';
    /// `SMFIR_REPLYCODE`: a reply code with text.
    pub const REPLYCODE: u8 = b'y';
    /// The negotiation reply uses the command's byte, `SMFIC_OPTNEG`.
    pub const OPTNEG: u8 = b'O';
}

/// Address families in `SMFIC_CONNECT` (`SMFIA_*`).
pub mod family {
    /// `SMFIA_UNKNOWN`: no address follows.
    pub const UNKNOWN: u8 = b'U';
    /// `SMFIA_UNIX`: a socket path.
    pub const UNIX: u8 = b'L';
    /// `SMFIA_INET`: IPv4.
    pub const INET: u8 = b'4';
    /// `SMFIA_INET6`: IPv6.
    pub const INET6: u8 = b'6';
}
