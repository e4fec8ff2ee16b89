//! What a filter hook answers (libmilter's `sfsistat`), and SMTP reply
//! texts (`smfi_setreply`, `smfi_setmlreply`).

use std::fmt;

use crate::reply::Reply;

/// A hook's verdict on the current command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Go on (`SMFIS_CONTINUE`).
    Continue,
    /// Accept; no more hooks for this message, or for this connection when
    /// said at connect or HELO (`SMFIS_ACCEPT`).
    Accept,
    /// Reject with the MTA's own 5xx (`SMFIS_REJECT`).
    Reject,
    /// Fail temporarily with the MTA's own 4xx (`SMFIS_TEMPFAIL`).
    Tempfail,
    /// Accept and throw the message away (`SMFIS_DISCARD`).
    Discard,
    /// From the body hook: skip the rest of the body (`SMFIS_SKIP`); sent as
    /// continue when the MTA cannot skip.
    Skip,
    /// Reject or fail temporarily with this code and text.
    Reply(ReplyText),
}

impl Status {
    /// The reply for this status.
    pub fn to_reply(&self) -> Reply {
        match self {
            Status::Continue => Reply::Continue,
            Status::Accept => Reply::Accept,
            Status::Reject => Reply::Reject,
            Status::Tempfail => Reply::Tempfail,
            Status::Discard => Reply::Discard,
            Status::Skip => Reply::Skip,
            Status::Reply(text) => Reply::ReplyCode(text.to_wire()),
        }
    }
}

/// An SMTP reply: a 4xx or 5xx code, an optional enhanced status code
/// (`5.7.1`), and one or more lines of text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyText {
    code: u16,
    enhanced: Option<String>,
    lines: Vec<String>,
}

/// A reply that an MTA would refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyError(pub String);

impl fmt::Display for ReplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ReplyError {}

/// libmilter's limits: 32 lines (`MAXREPLIES`) of at most 980 bytes.
const MAX_LINES: usize = 32;
const MAX_LINE: usize = 980;

impl ReplyText {
    /// A reply of one or more lines. The code must be 4xx or 5xx; the
    /// enhanced code, if any, must start with the same digit; no line may
    /// hold CR, LF or NUL.
    pub fn new(code: u16, enhanced: Option<&str>, lines: &[&str]) -> Result<ReplyText, ReplyError> {
        if !(400..600).contains(&code) {
            return Err(ReplyError(format!(
                "reply code {code} must be 4xx (temporary) or 5xx (permanent)"
            )));
        }
        if let Some(e) = enhanced {
            let parts: Vec<&str> = e.split('.').collect();
            let well_formed = parts.len() == 3
                && parts
                    .iter()
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
            if !well_formed || !e.starts_with(char::from(b'0' + (code / 100) as u8)) {
                return Err(ReplyError(format!(
                    "enhanced status code {e:?} must look like {}.x.y to go with {code}",
                    code / 100
                )));
            }
        }
        if lines.is_empty() || lines.len() > MAX_LINES {
            return Err(ReplyError(format!(
                "a reply has 1 to {MAX_LINES} lines, not {}",
                lines.len()
            )));
        }
        if let Some(bad) = lines
            .iter()
            .find(|l| l.len() > MAX_LINE || l.bytes().any(|b| matches!(b, b'\r' | b'\n' | 0)))
        {
            return Err(ReplyError(format!(
                "reply line {bad:?} is longer than {MAX_LINE} bytes or holds CR, LF or NUL"
            )));
        }
        Ok(ReplyText {
            code,
            enhanced: enhanced.map(str::to_string),
            lines: lines.iter().map(|l| l.to_string()).collect(),
        })
    }

    /// Parses `550 5.7.1 text` (the enhanced code is optional).
    pub fn parse(text: &str) -> Result<ReplyText, ReplyError> {
        let mut words = text.trim().splitn(2, ' ');
        let code = words
            .next()
            .and_then(|c| c.parse::<u16>().ok())
            .ok_or_else(|| {
                ReplyError(format!(
                    "reply {text:?} must start with a 3-digit code, as in \"550 5.7.1 Rejected\""
                ))
            })?;
        let rest = words.next().unwrap_or("").trim_start();
        let (enhanced, line) = match rest.split_once(' ') {
            Some((first, line)) if first.contains('.') => (Some(first), line),
            None if rest.contains('.') && rest.bytes().all(|b| b.is_ascii_digit() || b == b'.') => {
                (Some(rest), "")
            }
            _ => (None, rest),
        };
        ReplyText::new(code, enhanced, &[line])
    }

    /// The SMTP code.
    pub fn code(&self) -> u16 {
        self.code
    }

    /// The text as the MTA wants it: lines joined by CRLF, each but the
    /// last with `-` after the code.
    pub fn to_wire(&self) -> Vec<u8> {
        let mut out = String::new();
        for (i, line) in self.lines.iter().enumerate() {
            if i > 0 {
                out.push_str("\r\n");
            }
            let sep = if i + 1 == self.lines.len() { ' ' } else { '-' };
            out.push_str(&format!("{}{sep}", self.code));
            if let Some(e) = &self.enhanced {
                out.push_str(e);
                out.push(' ');
            }
            out.push_str(line);
        }
        out.into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_line_replies_continue_with_a_dash() {
        let r = ReplyText::new(550, Some("5.7.1"), &["one", "two"]).unwrap();
        assert_eq!(r.to_wire(), b"550-5.7.1 one\r\n550 5.7.1 two");
    }

    #[test]
    fn bad_replies_are_refused() {
        assert!(ReplyText::new(250, None, &["ok"]).is_err());
        assert!(ReplyText::new(550, Some("4.7.1"), &["x"]).is_err());
        assert!(ReplyText::new(550, None, &["a\r\nb"]).is_err());
        assert!(ReplyText::parse("nope").is_err());
    }

    #[test]
    fn parse_reads_code_enhanced_code_and_text() {
        let r = ReplyText::parse("451 4.7.1 Try later").unwrap();
        assert_eq!(r.to_wire(), b"451 4.7.1 Try later");
        let r = ReplyText::parse("554 No").unwrap();
        assert_eq!(r.to_wire(), b"554 No");
    }
}
