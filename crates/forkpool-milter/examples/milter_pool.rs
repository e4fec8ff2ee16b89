//! A mail filter in Rust on a preforked pool: every message gets
//! `X-Hello: <pid>`, and recipients at `spamtrap.example` are rejected.
//!
//! ```sh
//! cargo run -p forkpool-milter --example milter_pool
//! # Postfix main.cf: smtpd_milters = inet:127.0.0.1:8891
//! ```

use std::sync::Arc;

use forkpool::{Pool, PoolConfig, WorkerInfo};
use forkpool_milter::{
    Actions, Context, EomActions, Filter, FilterOptions, MilterContext, MilterSession, Protocol,
    ReplyText, Status,
};
use forkpool_sessions::SessionConfig;

/// What the conversations of one child share.
struct Child {
    pid: u32,
    trap: ReplyText,
}

/// One conversation's state: the recipients of the current message.
struct Hello {
    child: Arc<Child>,
    recipients: usize,
}

impl Filter for Hello {
    type Shared = Child;

    fn new(child: &Arc<Child>) -> Self {
        Hello {
            child: Arc::clone(child),
            recipients: 0,
        }
    }

    fn options(_: &Child) -> FilterOptions {
        FilterOptions {
            actions: Actions::ADD_HEADERS,
            // Only envelope and end of message: skip the rest.
            protocol: Protocol::NO_CONNECT
                | Protocol::NO_HELO
                | Protocol::NO_DATA
                | Protocol::NO_HEADERS
                | Protocol::NO_EOH
                | Protocol::NO_BODY
                | Protocol::NO_UNKNOWN,
            macros: Vec::new(),
        }
    }

    fn mail(&mut self, _: &Context<'_>, _sender: &[u8], _args: &[Vec<u8>]) -> Status {
        self.recipients = 0;
        Status::Continue
    }

    fn rcpt(&mut self, _: &Context<'_>, recipient: &[u8], _args: &[Vec<u8>]) -> Status {
        if recipient.ends_with(b"@spamtrap.example>") {
            return Status::Reply(self.child.trap.clone());
        }
        self.recipients += 1;
        Status::Continue
    }

    fn eom(&mut self, _: &Context<'_>, actions: &mut EomActions) -> Status {
        let value = format!("{} ({} recipients)", self.child.pid, self.recipients);
        match actions.add_header("X-Hello", &value) {
            Ok(()) => Status::Continue,
            Err(_) => Status::Tempfail,
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut pool = Pool::new(PoolConfig::default());
    pool.listen(&"127.0.0.1:8891".parse()?)?;
    let sessions = SessionConfig {
        name: "hello".to_string(),
        ..SessionConfig::default()
    };
    pool.run_sessions::<MilterSession<Hello>, _>(sessions, |child: &WorkerInfo| {
        MilterContext::new(Child {
            pid: child.pid,
            trap: ReplyText::new(550, Some("5.7.1"), &["No such user"]).expect("a valid reply"),
        })
    })?;
    Ok(())
}
