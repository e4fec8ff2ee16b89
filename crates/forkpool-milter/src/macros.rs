//! The macros the MTA has sent (`SMFIC_MACRO`), kept per command, looked
//! up like libmilter's `smfi_getsymval`: the latest command's first.

use crate::consts::cmd;

/// Name and value pairs, as one `SMFIC_MACRO` packet carries them.
pub type MacroPairs = Vec<(Vec<u8>, Vec<u8>)>;

/// Macro values of the current connection and message.
#[derive(Debug, Clone, Default)]
pub struct Macros {
    /// Per command byte, its pairs; the most recent command last.
    stages: Vec<(u8, MacroPairs)>,
}

/// The commands whose macros belong to one message, forgotten at abort.
const MESSAGE_STAGES: &[u8] = &[
    cmd::MAIL,
    cmd::RCPT,
    cmd::DATA,
    cmd::HEADER,
    cmd::EOH,
    cmd::BODY,
    cmd::BODYEOB,
];

impl Macros {
    /// Keeps the macros sent for the command `stage`, replacing those sent
    /// for it before.
    pub fn set(&mut self, stage: u8, pairs: MacroPairs) {
        self.stages.retain(|(s, _)| *s != stage);
        self.stages.push((stage, pairs));
    }

    /// The value of macro `name`, with or without its braces (`i`,
    /// `{client_addr}` or `client_addr`).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        let bare = name.trim_start_matches('{').trim_end_matches('}');
        self.stages.iter().rev().find_map(|(_, pairs)| {
            pairs.iter().find_map(|(n, v)| {
                let n = n.strip_prefix(b"{").unwrap_or(n);
                let n = n.strip_suffix(b"}").unwrap_or(n);
                (n == bare.as_bytes()).then_some(v.as_slice())
            })
        })
    }

    /// The value of `name` as text, lossily.
    pub fn text(&self, name: &str) -> Option<String> {
        self.get(name)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    /// Forgets one message's macros (`SMFIC_ABORT`, end of message).
    pub fn clear_message(&mut self) {
        self.stages.retain(|(s, _)| !MESSAGE_STAGES.contains(s));
    }

    /// Forgets everything (a new connection, `SMFIC_QUIT_NC`).
    pub fn clear(&mut self) {
        self.stages.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(n: &str, v: &str) -> (Vec<u8>, Vec<u8>) {
        (n.as_bytes().to_vec(), v.as_bytes().to_vec())
    }

    #[test]
    fn latest_stage_wins_and_abort_forgets_the_message() {
        let mut m = Macros::default();
        m.set(
            cmd::CONNECT,
            vec![pair("j", "mx"), pair("{daemon_name}", "smtpd")],
        );
        m.set(cmd::MAIL, vec![pair("j", "mail-stage"), pair("i", "4ABC")]);
        assert_eq!(m.get("j"), Some(&b"mail-stage"[..]));
        assert_eq!(m.get("daemon_name"), Some(&b"smtpd"[..]));
        assert_eq!(m.get("{i}"), Some(&b"4ABC"[..]));
        m.clear_message();
        assert_eq!(m.get("j"), Some(&b"mx"[..]));
        assert_eq!(m.get("i"), None);
    }
}
