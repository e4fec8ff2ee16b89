//! A spamd client (SpamAssassin's `SPAMC/1.5` protocol, `CHECK` command):
//! one blocking request per message, under the rule file's timeout.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};

use super::rules::Spamd;

/// spamd's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// Whether the score reached the threshold.
    pub spam: bool,
    /// The message's score.
    pub score: f64,
    /// The server's threshold.
    pub threshold: f64,
}

impl Verdict {
    /// The `X-Spam-Status` value, as spamass-milter writes it.
    pub fn status_header(&self) -> String {
        format!(
            "{}, score={:.1} required={:.1}",
            if self.spam { "Yes" } else { "No" },
            self.score,
            self.threshold
        )
    }
}

/// The longest answer read: `CHECK` answers with headers only.
const MAX_ANSWER: u64 = 64 * 1024;

/// Asks spamd about `message` (headers, blank line, body).
pub fn check(spamd: &Spamd, message: &[u8]) -> Result<Verdict, String> {
    let addr = spamd
        .address
        .to_socket_addrs()
        .map_err(|e| format!("spamd address {}: {e}", spamd.address))?
        .next()
        .ok_or_else(|| format!("spamd address {} resolves to nothing", spamd.address))?;
    let mut stream = TcpStream::connect_timeout(&addr, spamd.timeout)
        .map_err(|e| format!("cannot connect to spamd at {addr}: {e}"))?;
    stream
        .set_read_timeout(Some(spamd.timeout))
        .and_then(|()| stream.set_write_timeout(Some(spamd.timeout)))
        .map_err(|e| e.to_string())?;
    let head = format!(
        "CHECK SPAMC/1.5\r\nContent-length: {}\r\n\r\n",
        message.len()
    );
    stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(message))
        .and_then(|()| stream.shutdown(std::net::Shutdown::Write))
        .map_err(|e| format!("writing to spamd at {addr}: {e}"))?;
    let mut answer = Vec::new();
    stream
        .take(MAX_ANSWER)
        .read_to_end(&mut answer)
        .map_err(|e| format!("reading from spamd at {addr}: {e}"))?;
    parse(&String::from_utf8_lossy(&answer))
}

/// Reads `SPAMD/1.1 0 EX_OK` and `Spam: True ; 15.2 / 5.0`.
pub fn parse(answer: &str) -> Result<Verdict, String> {
    let mut lines = answer.lines();
    let status = lines.next().unwrap_or("");
    let mut words = status.split_whitespace();
    if !words.next().is_some_and(|w| w.starts_with("SPAMD/")) || words.next() != Some("0") {
        return Err(format!("spamd answered {status:?}"));
    }
    let spam_line = lines
        .take_while(|l| !l.is_empty())
        .find_map(|l| l.strip_prefix("Spam:"))
        .ok_or("spamd's answer has no Spam: header")?;
    let bad = || format!("spamd's Spam: header {spam_line:?} is not `True ; 1.0 / 5.0`");
    let (flag, scores) = spam_line.split_once(';').ok_or_else(bad)?;
    let (score, threshold) = scores.split_once('/').ok_or_else(bad)?;
    Ok(Verdict {
        spam: matches!(flag.trim().to_ascii_lowercase().as_str(), "true" | "yes"),
        score: score.trim().parse().map_err(|_| bad())?,
        threshold: threshold.trim().parse().map_err(|_| bad())?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_spamds_answer() {
        let v = parse("SPAMD/1.1 0 EX_OK\r\nContent-length: 0\r\nSpam: True ; 15.2 / 5.0\r\n\r\n")
            .unwrap();
        assert_eq!(
            v,
            Verdict {
                spam: true,
                score: 15.2,
                threshold: 5.0
            }
        );
        assert_eq!(v.status_header(), "Yes, score=15.2 required=5.0");
        assert!(parse("SPAMD/1.1 76 Bad header line\r\n").is_err());
        assert!(parse("SPAMD/1.1 0 EX_OK\r\nSpam: maybe\r\n\r\n").is_err());
    }
}
