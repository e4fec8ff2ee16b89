//! The rule-driven filter: a [`Filter`] whose every stage consults the
//! compiled [`Rules`].

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use forkpool_milter::{
    Actions, Context, EomActions, Filter, FilterOptions, Protocol, Stage, Status,
};

use super::rules::{Action, On, Rules};
use super::spamd;

/// What every conversation of one child shares.
#[derive(Debug)]
pub struct Shared {
    /// The rules.
    pub rules: Rules,
    /// The child's slot, for `{slot}`.
    pub slot: usize,
    /// The child's pid, for `{pid}`.
    pub pid: u32,
    /// Messages this child has reached end of message with, for
    /// `[bench] crash_every`.
    pub messages: AtomicU64,
}

/// One conversation's state: what the current message has collected.
#[derive(Debug)]
pub struct RuleFilter {
    shared: Arc<Shared>,
    quarantine: Option<String>,
    /// The message as spamd wants it, while it fits.
    message: Vec<u8>,
    too_big: bool,
}

impl RuleFilter {
    fn new_message(&mut self) {
        self.quarantine = None;
        self.message.clear();
        self.too_big = false;
    }

    /// The first rule for `on` matching `value` decides.
    fn apply(&mut self, on: On, header: Option<&[u8]>, value: &[u8]) -> Status {
        let shared = Arc::clone(&self.shared);
        let rule = shared.rules.rules.iter().find(|r| {
            r.on == on
                && match (&r.header, header) {
                    (Some(want), Some(name)) => want.as_bytes().eq_ignore_ascii_case(name),
                    _ => true,
                }
                && r.pattern.is_match(value)
        });
        match rule.map(|r| &r.action) {
            None => Status::Continue,
            Some(Action::Reject(reply) | Action::Tempfail(reply)) => Status::Reply(reply.clone()),
            Some(Action::Discard) => Status::Discard,
            Some(Action::Accept) => Status::Accept,
            Some(Action::Quarantine(reason)) => {
                self.quarantine = Some(reason.clone());
                Status::Continue
            }
        }
    }

    fn collect(&mut self, bytes: &[&[u8]]) {
        let Some(spamd) = &self.shared.rules.spamd else {
            return;
        };
        let len: usize = bytes.iter().map(|b| b.len()).sum();
        if self.too_big || self.message.len() + len > spamd.max_size {
            self.too_big = true;
            self.message = Vec::new();
            return;
        }
        for b in bytes {
            self.message.extend_from_slice(b);
        }
    }

    fn expand(&self, value: &str, ctx: &Context<'_>) -> String {
        value
            .replace("{pid}", &self.shared.pid.to_string())
            .replace("{slot}", &self.shared.slot.to_string())
            .replace("{queue_id}", &ctx.macros.text("i").unwrap_or_default())
    }
}

fn uses(rules: &Rules, on: On) -> bool {
    rules.rules.iter().any(|r| r.on == on)
}

impl Filter for RuleFilter {
    type Shared = Shared;

    fn new(shared: &Arc<Shared>) -> Self {
        RuleFilter {
            shared: Arc::clone(shared),
            quarantine: None,
            message: Vec::new(),
            too_big: false,
        }
    }

    /// Only the steps some rule needs are asked for; the others are left
    /// out (`NO_*`), and steps whose answer is always "continue" are not
    /// answered (`NR_*`).
    fn options(shared: &Shared) -> FilterOptions {
        let rules = &shared.rules;
        let spamd = rules.spamd.is_some();
        let mut actions = Actions::NONE;
        if !rules.add_headers.is_empty() || spamd {
            actions |= Actions::ADD_HEADERS;
        }
        if rules
            .rules
            .iter()
            .any(|r| matches!(r.action, Action::Quarantine(_)))
        {
            actions |= Actions::QUARANTINE;
        }
        let mut protocol =
            Protocol::NO_CONNECT | Protocol::NO_HELO | Protocol::NO_DATA | Protocol::NO_UNKNOWN;
        if !uses(rules, On::Mail) {
            protocol |= Protocol::NR_MAIL;
        }
        if !uses(rules, On::Rcpt) {
            protocol |= Protocol::NO_RCPT;
        }
        if !uses(rules, On::Header) {
            protocol |= if spamd {
                Protocol::NR_HEADER
            } else {
                Protocol::NO_HEADERS
            };
        }
        protocol |= if spamd {
            Protocol::NR_EOH | Protocol::NR_BODY
        } else {
            Protocol::NO_EOH | Protocol::NO_BODY
        };
        FilterOptions {
            actions,
            protocol,
            macros: vec![(Stage::Eom, "i".to_string())],
        }
    }

    fn mail(&mut self, _ctx: &Context<'_>, sender: &[u8], _args: &[Vec<u8>]) -> Status {
        self.new_message();
        self.apply(On::Mail, None, sender)
    }

    fn rcpt(&mut self, _ctx: &Context<'_>, recipient: &[u8], _args: &[Vec<u8>]) -> Status {
        self.apply(On::Rcpt, None, recipient)
    }

    fn header(&mut self, _ctx: &Context<'_>, name: &[u8], value: &[u8]) -> Status {
        self.collect(&[name, b": ", value, b"\r\n"]);
        self.apply(On::Header, Some(name), value)
    }

    fn eoh(&mut self, _ctx: &Context<'_>) -> Status {
        self.collect(&[b"\r\n"]);
        Status::Continue
    }

    fn body(&mut self, _ctx: &Context<'_>, chunk: &[u8]) -> Status {
        self.collect(&[chunk]);
        Status::Continue
    }

    fn eom(&mut self, ctx: &Context<'_>, actions: &mut EomActions) -> Status {
        let shared = Arc::clone(&self.shared);
        shared.rules.bench.on_message(&shared.messages);
        let mut status = Status::Continue;
        if let Some(spamd) = &shared.rules.spamd {
            if !self.too_big {
                match spamd::check(spamd, &self.message) {
                    Ok(verdict) => {
                        let _ = actions.add_header("X-Spam-Status", &verdict.status_header());
                        if verdict.spam {
                            let _ = actions.add_header("X-Spam-Flag", "YES");
                        }
                        if spamd.reject_score.is_some_and(|s| verdict.score >= s) {
                            status = Status::Reject;
                        }
                    }
                    Err(e) => tracing::warn!("spamd check skipped: {e}"),
                }
            }
        }
        for (name, value) in &shared.rules.add_headers {
            let value = self.expand(value, ctx);
            if let Err(e) = actions.add_header(name, &value) {
                tracing::warn!("header {name} not added: {e}");
            }
        }
        if let Some(reason) = self.quarantine.take() {
            if let Err(e) = actions.quarantine(&reason) {
                tracing::warn!("message not quarantined: {e}");
            }
        }
        self.new_message();
        status
    }

    fn abort(&mut self, _ctx: &Context<'_>) {
        self.new_message();
    }
}
