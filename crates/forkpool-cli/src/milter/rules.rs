//! The rule file of `forkpool milter`: what it says (TOML), checked and
//! compiled once, with errors that name the rule and the fix.

use std::path::Path;
use std::time::Duration;

use forkpool_milter::ReplyText;
use regex::bytes::Regex;
use serde::Deserialize;

use super::bench::{Bench, BenchSpec};

/// The rule file printed by `forkpool milter --example`.
pub const EXAMPLE: &str = r#"# forkpool milter rules (TOML). Run with:
#   forkpool milter --listen 127.0.0.1:8891 -- rules.toml
# Postfix: smtpd_milters = inet:127.0.0.1:8891

# Headers added to every message at end of message. In values, {pid} and
# {slot} name the child that filtered it, {queue_id} is the MTA's queue id
# (macro i).
[[add_header]]
name = "X-Forkpool-Milter"
value = "{pid}"

# Rules, tried in order at their stage; the first match decides.
#   on      = "mail" (envelope sender), "rcpt" (a recipient) or "header"
#   header  = the header's name, for on = "header" (any header if absent)
#   pattern = a regular expression (Rust regex syntax; (?i) ignores case),
#             matched against the address as the MTA sends it (<a@b>) or
#             the header's value
#   action  = "reject", "tempfail", "discard", "accept" or "quarantine"
#   reply   = "550 5.7.1 text" for reject and tempfail
#   reason  = the quarantine reason
[[rule]]
on = "rcpt"
pattern = "(?i)^<?reject@"
action = "reject"
reply = "550 5.7.1 Recipient rejected by rule"

[[rule]]
on = "mail"
pattern = "(?i)^<?tempfail@"
action = "tempfail"
reply = "451 4.7.1 Sender tempfailed by rule"

# A quarantined message waits in the MTA's hold queue (Postfix:
# `postqueue -p` shows it, `postsuper -H` releases it).
[[rule]]
on = "rcpt"
pattern = "(?i)^<?hold@"
action = "quarantine"
reason = "held by rule"

# Ask a spamd server (SpamAssassin) for a score and add X-Spam-Status and
# X-Spam-Flag, as spamass-milter does. Uncomment to use.
# [spamd]
# address = "127.0.0.1:783"
# timeout = "10s"
# max_size = 512000          # bigger messages are not checked
# reject_score = 15.0        # optional: reject at or above this score

# Benchmarking aid, not for mail: spin this much CPU per message, and crash
# on one message in N of a child ("abort" as a C library might, or "panic").
# [bench]
# work_us = 2000
# crash_every = 1000
# crash = "abort"
"#;

/// The file as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    #[serde(default)]
    add_header: Vec<HeaderSpec>,
    #[serde(default)]
    rule: Vec<RuleSpec>,
    spamd: Option<SpamdSpec>,
    #[serde(default)]
    bench: BenchSpec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeaderSpec {
    name: String,
    value: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleSpec {
    on: String,
    header: Option<String>,
    pattern: String,
    action: String,
    reply: Option<String>,
    reason: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpamdSpec {
    address: String,
    timeout: Option<String>,
    max_size: Option<usize>,
    reject_score: Option<f64>,
}

/// Where a rule looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum On {
    /// The envelope sender (MAIL FROM).
    Mail,
    /// Each recipient (RCPT TO).
    Rcpt,
    /// Headers.
    Header,
}

/// What a matching rule does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Reject with this reply.
    Reject(ReplyText),
    /// Fail temporarily with this reply.
    Tempfail(ReplyText),
    /// Accept and drop the message.
    Discard,
    /// Accept without further filtering (no headers are added).
    Accept,
    /// Quarantine at end of message with this reason.
    Quarantine(String),
}

/// One compiled rule.
#[derive(Debug, Clone)]
pub struct Rule {
    /// Where it looks.
    pub on: On,
    /// For header rules, the header's name (compared ignoring case).
    pub header: Option<String>,
    /// What it looks for.
    pub pattern: Regex,
    /// What it does.
    pub action: Action,
}

/// The spamd server to ask.
#[derive(Debug, Clone)]
pub struct Spamd {
    /// host:port.
    pub address: String,
    /// Connect, write and read timeout.
    pub timeout: Duration,
    /// Messages larger than this are not checked.
    pub max_size: usize,
    /// Reject at or above this score.
    pub reject_score: Option<f64>,
}

/// A rule file, checked and compiled.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    /// Headers added to every message.
    pub add_headers: Vec<(String, String)>,
    /// Rules in file order.
    pub rules: Vec<Rule>,
    /// The spamd server, if any.
    pub spamd: Option<Spamd>,
    /// Work and crashes for benchmarks (`[bench]`).
    pub bench: Bench,
}

impl Rules {
    /// Reads and checks the rule file at `path`.
    pub fn load(path: &Path) -> Result<Rules, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the rule file {}: {e}", path.display()))?;
        Rules::parse(&text).map_err(|e| format!("rule file {}: {e}", path.display()))
    }

    /// Checks and compiles a rule file's text.
    pub fn parse(text: &str) -> Result<Rules, String> {
        let file: RuleFile = toml::from_str(text).map_err(|e| {
            format!("{e}\n(`forkpool milter --example` prints a rule file to start from)")
        })?;
        let mut add_headers = Vec::new();
        for (i, h) in file.add_header.into_iter().enumerate() {
            let n = i + 1;
            let valid_name =
                !h.name.is_empty() && h.name.bytes().all(|b| b.is_ascii_graphic() && b != b':');
            if !valid_name {
                return Err(format!(
                    "add_header #{n}: name {:?} must be printable ASCII without spaces or ':' (like \"X-Filtered\")",
                    h.name
                ));
            }
            if h.value.contains(['\r', '\n', '\0']) {
                return Err(format!(
                    "add_header #{n} ({}): the value must be one line",
                    h.name
                ));
            }
            add_headers.push((h.name, h.value));
        }
        let rules = file
            .rule
            .into_iter()
            .enumerate()
            .map(|(i, spec)| compile(i + 1, spec))
            .collect::<Result<Vec<_>, _>>()?;
        let spamd = file.spamd.map(spamd).transpose()?;
        let bench = Bench::compile(file.bench)?;
        Ok(Rules {
            add_headers,
            rules,
            spamd,
            bench,
        })
    }
}

fn compile(n: usize, spec: RuleSpec) -> Result<Rule, String> {
    let on = match spec.on.as_str() {
        "mail" => On::Mail,
        "rcpt" => On::Rcpt,
        "header" => On::Header,
        other => {
            return Err(format!(
                "rule #{n}: on = {other:?} is not a stage; use \"mail\", \"rcpt\" or \"header\""
            ))
        }
    };
    if spec.header.is_some() && on != On::Header {
        return Err(format!(
            "rule #{n}: `header` only makes sense with on = \"header\"; remove it or change `on`"
        ));
    }
    let pattern = Regex::new(&spec.pattern).map_err(|e| {
        format!(
            "rule #{n}: pattern {:?} is not a valid regex: {e}",
            spec.pattern
        )
    })?;
    let reply = |default: &str| -> Result<ReplyText, String> {
        let text = spec.reply.as_deref().unwrap_or(default);
        ReplyText::parse(text).map_err(|e| format!("rule #{n}: reply {text:?}: {e}"))
    };
    let action = match spec.action.as_str() {
        "reject" => {
            let r = reply("550 5.7.1 Rejected by rule")?;
            if r.code() / 100 != 5 {
                return Err(format!(
                    "rule #{n}: a reject needs a 5xx reply, not {}; use action = \"tempfail\" for 4xx",
                    r.code()
                ));
            }
            Action::Reject(r)
        }
        "tempfail" => {
            let r = reply("451 4.7.1 Try again later")?;
            if r.code() / 100 != 4 {
                return Err(format!(
                    "rule #{n}: a tempfail needs a 4xx reply, not {}; use action = \"reject\" for 5xx",
                    r.code()
                ));
            }
            Action::Tempfail(r)
        }
        "discard" => Action::Discard,
        "accept" => Action::Accept,
        "quarantine" => Action::Quarantine(
            spec.reason
                .unwrap_or_else(|| format!("forkpool milter rule #{n}")),
        ),
        other => {
            return Err(format!(
                "rule #{n}: action = {other:?} is unknown; use \"reject\", \"tempfail\", \"discard\", \"accept\" or \"quarantine\""
            ))
        }
    };
    if spec.reply.is_some() && !matches!(action, Action::Reject(_) | Action::Tempfail(_)) {
        return Err(format!(
            "rule #{n}: `reply` is for reject and tempfail; remove it"
        ));
    }
    Ok(Rule {
        on,
        header: spec.header,
        pattern,
        action,
    })
}

fn spamd(spec: SpamdSpec) -> Result<Spamd, String> {
    let timeout = match &spec.timeout {
        Some(t) => {
            forkpool::config::parse_duration(t).map_err(|e| format!("spamd: timeout {t:?}: {e}"))?
        }
        None => Duration::from_secs(10),
    };
    if !spec.address.contains(':') {
        return Err(format!(
            "spamd: address {:?} needs a port, as in \"127.0.0.1:783\"",
            spec.address
        ));
    }
    Ok(Spamd {
        address: spec.address,
        timeout,
        max_size: spec.max_size.unwrap_or(512_000),
        reject_score: spec.reject_score,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_parses() {
        let rules = Rules::parse(EXAMPLE).unwrap();
        assert_eq!(rules.add_headers[0].0, "X-Forkpool-Milter");
        assert_eq!(rules.rules[0].on, On::Rcpt);
        assert!(rules.rules[0].pattern.is_match(b"<reject@example.org>"));
        assert!(!rules.rules[0].pattern.is_match(b"<noreject@example.org>"));
        let actions: Vec<_> = rules.rules.iter().map(|r| (r.on, &r.action)).collect();
        let reply = |text| ReplyText::parse(text).unwrap();
        assert_eq!(
            actions,
            [
                (
                    On::Rcpt,
                    &Action::Reject(reply("550 5.7.1 Recipient rejected by rule"))
                ),
                (
                    On::Mail,
                    &Action::Tempfail(reply("451 4.7.1 Sender tempfailed by rule"))
                ),
                (On::Rcpt, &Action::Quarantine("held by rule".to_string())),
            ]
        );
        assert!(rules.rules[1].pattern.is_match(b"<tempfail@example.org>"));
        assert!(rules.rules[2].pattern.is_match(b"<Hold@example.org>"));
        assert!(rules.spamd.is_none());
        assert_eq!(rules.bench, Bench::default());
        let bench = EXAMPLE
            .replace("# [bench]", "[bench]")
            .replace("# work_us", "work_us");
        assert_eq!(Rules::parse(&bench).unwrap().bench.work.as_micros(), 2000);
    }

    fn error(text: &str) -> String {
        Rules::parse(text).unwrap_err()
    }

    #[test]
    fn bad_files_name_the_problem_and_the_fix() {
        assert!(
            error("[[rule]]\non = \"data\"\npattern = \"x\"\naction = \"reject\"")
                .contains("use \"mail\", \"rcpt\" or \"header\"")
        );
        assert!(
            error("[[rule]]\non = \"mail\"\npattern = \"(\"\naction = \"reject\"")
                .contains("not a valid regex")
        );
        assert!(error("[[rule]]\non = \"mail\"\npattern = \"x\"\naction = \"reject\"\nreply = \"451 4.7.1 no\"")
            .contains("use action = \"tempfail\""));
        assert!(
            error("[[rule]]\non = \"mail\"\npattern = \"x\"\naction = \"bounce\"")
                .contains("is unknown")
        );
        assert!(error("[[add_header]]\nname = \"X Bad\"\nvalue = \"v\"").contains("without spaces"));
        assert!(error("[spamd]\naddress = \"localhost\"").contains("needs a port"));
        assert!(error("[[rules]]\n").contains("--example"));
        assert!(error("[bench]\ncrash_every = 0").contains("crash_every"));
        assert!(error("[bench]\nwork = 5").contains("unknown field"));
    }
}
