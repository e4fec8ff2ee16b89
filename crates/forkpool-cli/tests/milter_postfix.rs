//! A milter in front of a real Postfix (Debian's, run privately by the
//! test on loopback; `bash .ci/deps/mail.sh` installs it), relaying to a
//! capturing `smtp-sink`: mail arrives with the filter's header, a rejected
//! recipient gets 550 at RCPT, a tempfailed sender 451 at MAIL, a
//! quarantined message waits in the hold queue, and with the filter gone
//! Postfix applies `milter_default_action = tempfail`.
//!
//! Each test runs against every `FilterUnderTest` there is: the libmilter
//! and pymilter filters of `bench/milter/`, and `forkpool milter` with the
//! rules of its `--example`. Two tests are for the pool alone: a SIGKILLed
//! child costs Postfix only the SMTP session whose conversation it held,
//! and a reload keeps an open SMTP session's conversation.

mod common;
#[path = "common/listening.rs"]
mod listening;
#[path = "common/milter_filters.rs"]
mod milter_filters;
#[path = "common/postfix_support.rs"]
mod postfix_support;
#[path = "common/smtp_client.rs"]
mod smtp_client;

use std::time::{Duration, Instant};

use milter_filters::{filters_under_test, forkpool_only, RunningFilter};
use postfix_support::{require_postfix, Postfix, WAIT};
use smtp_client::{message_text, Smtp};

/// A filter and a Postfix in front of it.
struct Rig {
    // Postfix stops before the filter: no tempfail storm in its log.
    postfix: Postfix,
    filter: RunningFilter,
}

/// Runs `test` once for every filter under test, each behind a Postfix of
/// its own; returns at once when the test cannot run here (see
/// `common::require`).
fn for_each_filter(test: impl Fn(&mut Rig)) {
    let Some(programs) = require_postfix() else {
        return;
    };
    let Some(filters) = filters_under_test() else {
        return;
    };
    for filter in &filters.all {
        let running = filter.start(&filters.dir);
        let postfix = Postfix::start(&programs, running.port);
        eprintln!(
            "{}: Postfix {} started in {:?}",
            filter.name(),
            postfix.pid(),
            postfix.started_in
        );
        test(&mut Rig {
            postfix,
            filter: running,
        });
    }
}

/// The pid the filter's header names, checked to be the filter's.
fn handled_by(rig: &Rig, message: &postfix_support::Delivered) -> i32 {
    let values = message.header_values("X-Forkpool-Milter");
    assert_eq!(values.len(), 1, "one header added: {:?}", message.headers);
    let pid: i32 = values[0].parse().expect("a pid");
    assert!(rig.filter.owns(pid), "{pid} is not the filter's");
    pid
}

#[test]
fn mail_arrives_with_the_filters_header() {
    for_each_filter(|rig| {
        let sent = rig
            .postfix
            .send("sender@forkpool.test", &["ok@example.org"], "plain-1");
        assert_eq!(sent.mail.code, 250, "{sent:?}");
        assert_eq!(sent.end.as_ref().map(|r| r.code), Some(250), "{sent:?}");
        let message = rig.postfix.wait_delivered("plain-1");
        handled_by(rig, &message);
        assert_eq!(message.recipients(), ["ok@example.org"]);
        assert!(message.body.contains("\n.A line starting with a dot.\n"));
    });
}

#[test]
fn rejected_recipient_gets_550_at_rcpt_and_the_others_their_mail() {
    for_each_filter(|rig| {
        let sent = rig.postfix.send(
            "sender@forkpool.test",
            &["reject@example.org", "ok@example.org"],
            "reject-1",
        );
        assert_eq!(sent.rcpts[0].code, 550, "{sent:?}");
        assert!(sent.rcpts[0].text().starts_with("5.7.1"), "{sent:?}");
        assert_eq!(sent.rcpts[1].code, 250, "{sent:?}");
        assert_eq!(sent.end.as_ref().map(|r| r.code), Some(250), "{sent:?}");
        let message = rig.postfix.wait_delivered("reject-1");
        assert_eq!(message.recipients(), ["ok@example.org"]);
    });
}

#[test]
fn tempfailed_sender_gets_451_at_mail() {
    for_each_filter(|rig| {
        let sent = rig
            .postfix
            .send("tempfail@forkpool.test", &["ok@example.org"], "tempfail-1");
        assert_eq!(sent.mail.code, 451, "{sent:?}");
        assert!(sent.mail.text().starts_with("4.7.1"), "{sent:?}");
        assert!(sent.rcpts.is_empty() && sent.end.is_none(), "{sent:?}");
    });
}

#[test]
fn a_transaction_reset_on_one_connection_leaves_the_next_unquarantined() {
    for_each_filter(|rig| {
        let mut smtp = rig.postfix.connect();
        assert_eq!(smtp.command("EHLO client.forkpool.test").unwrap().code, 250);
        // Postfix tells the filter the first transaction ended (abort).
        let mail = smtp.command("MAIL FROM:<sender@forkpool.test>").unwrap();
        let rcpt = smtp.command("RCPT TO:<hold@example.org>").unwrap();
        assert_eq!((mail.code, rcpt.code), (250, 250));
        assert_eq!(smtp.command("RSET").unwrap().code, 250);
        let text = smtp_client::message_text("sender@forkpool.test", "ok@example.org", "reset-1");
        let sent = smtp
            .send("sender@forkpool.test", &["ok@example.org"], &text)
            .unwrap();
        assert_eq!(sent.end.as_ref().map(|r| r.code), Some(250), "{sent:?}");
        smtp.quit();
        let message = rig.postfix.wait_delivered("reset-1");
        handled_by(rig, &message);
        assert!(rig.postfix.held().is_empty(), "{:?}", rig.postfix.held());
    });
}

#[test]
fn quarantined_message_waits_in_the_hold_queue_until_released() {
    for_each_filter(|rig| {
        let sent = rig
            .postfix
            .send("sender@forkpool.test", &["hold@example.org"], "hold-1");
        assert_eq!(sent.end.as_ref().map(|r| r.code), Some(250), "{sent:?}");
        let held = rig.postfix.held();
        assert_eq!(held.len(), 1, "{held:?}\n{}", rig.postfix.log());
        assert_eq!(Some(held[0].queue_id.as_str()), sent.queue_id());
        assert_eq!(held[0].recipients, ["hold@example.org"]);
        assert!(rig.postfix.delivered("hold-1").is_empty());

        rig.postfix.release_held();
        let message = rig.postfix.wait_delivered("hold-1");
        handled_by(rig, &message);
        assert!(rig.postfix.held().is_empty());
    });
}

#[test]
fn with_the_filter_gone_postfix_tempfails() {
    for_each_filter(|rig| {
        let sent = rig
            .postfix
            .send("sender@forkpool.test", &["ok@example.org"], "before-1");
        assert_eq!(sent.end.as_ref().map(|r| r.code), Some(250), "{sent:?}");
        rig.postfix.wait_delivered("before-1");

        rig.filter.kill();
        let sent = rig
            .postfix
            .send("sender@forkpool.test", &["ok@example.org"], "after-1");
        assert_eq!(sent.mail.code / 100, 4, "{sent:?}\n{}", rig.postfix.log());
        assert!(sent.end.is_none(), "{sent:?}");
        assert!(rig.postfix.queue().is_empty(), "{:?}", rig.postfix.queue());
    });
}

/// The processes in process group `group`, from `/proc`.
fn group_members(group: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            // pid (comm) state ppid pgrp ...: comm may hold spaces.
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    let after = stat.rsplit_once(')')?.1.to_string();
                    after.split_whitespace().nth(2)?.parse::<i32>().ok()
                })
                == Some(group)
        })
        .collect()
}

#[test]
fn stopping_postfix_ends_every_daemon_it_started() {
    let Some(programs) = require_postfix() else {
        return;
    };
    let Some(filters) = filters_under_test() else {
        return;
    };
    let filter = filters.all[0].start(&filters.dir);
    let postfix = Postfix::start(&programs, filter.port);
    postfix.send("sender@forkpool.test", &["ok@example.org"], "stop-1");
    postfix.wait_delivered("stop-1");
    let master = postfix.pid();
    let members = group_members(master);
    // master, smtpd, cleanup, qmgr, smtp at least.
    assert!(members.len() >= 5, "{members:?}");
    drop(postfix);
    let left: Vec<i32> = members.into_iter().filter(|p| common::alive(*p)).collect();
    assert!(left.is_empty(), "still running: {left:?}");
}

/// An SMTP session to `postfix` that has sent `MAIL` and `RCPT` (both
/// accepted) and waits before `DATA`: its milter conversation is open.
fn session_before_data(postfix: &Postfix) -> Smtp {
    let mut smtp = postfix.connect();
    assert_eq!(smtp.command("EHLO client.forkpool.test").unwrap().code, 250);
    let mail = smtp.command("MAIL FROM:<sender@forkpool.test>").unwrap();
    let rcpt = smtp.command("RCPT TO:<ok@example.org>").unwrap();
    assert_eq!((mail.code, rcpt.code), (250, 250), "{}", postfix.log());
    smtp
}

/// `DATA` and the message `token`: the last reply (the one after the
/// message, or DATA's if it was refused).
fn finish(smtp: &mut Smtp, token: &str) -> smtp_client::Reply {
    let data = smtp.command("DATA").unwrap();
    if data.code != 354 {
        return data;
    }
    let text = message_text("sender@forkpool.test", "ok@example.org", token);
    smtp.message(&text).unwrap()
}

/// Waits (bounded) until the pool's status counts `open` conversations in
/// all; returns the pid of each child holding one, once per conversation.
fn conversations_on(filter: &RunningFilter, open: u64) -> Vec<i32> {
    let deadline = Instant::now() + WAIT;
    loop {
        let status = filter.status().expect("the pool's status");
        let mut holders = Vec::new();
        for slot in status["slots"].as_array().into_iter().flatten() {
            let held = slot["sessions"][0].as_u64().unwrap_or(0);
            let pid = slot["pid"].as_i64().unwrap_or(0) as i32;
            holders.extend(std::iter::repeat_n(pid, held as usize));
        }
        if holders.len() as u64 == open {
            return holders;
        }
        assert!(
            Instant::now() < deadline,
            "not {open} conversations: {status}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_killed_child_costs_only_its_own_conversation_which_postfix_tempfails() {
    let Some(programs) = require_postfix() else {
        return;
    };
    let filters = forkpool_only();
    // One conversation per child: the second SMTP session's goes to the
    // other child.
    let pool = filters.all[0].with_pool_options(&["--sessions-per-child", "1"]);
    let filter = pool.start(&filters.dir);
    let postfix = Postfix::start(&programs, filter.port);
    let mut doomed = session_before_data(&postfix);
    let victim = conversations_on(&filter, 1)[0];
    let mut spared = session_before_data(&postfix);
    let holders = conversations_on(&filter, 2);
    let survivor = *holders
        .iter()
        .find(|p| **p != victim)
        .expect("two children");

    common::kill9(victim);
    let reply = finish(&mut doomed, "killed-1");
    assert_eq!(reply.code / 100, 4, "{reply:?}\n{}", postfix.log());
    let reply = finish(&mut spared, "spared-1");
    assert_eq!(reply.code, 250, "{reply:?}\n{}", postfix.log());
    doomed.quit();
    spared.quit();

    let message = postfix.wait_delivered("spared-1");
    assert_eq!(
        message.header_values("X-Forkpool-Milter"),
        [survivor.to_string()]
    );
    assert!(postfix.delivered("killed-1").is_empty());
    assert!(postfix.queue().is_empty(), "{:?}", postfix.queue());
}

#[test]
fn a_reload_during_an_smtp_session_keeps_its_conversation() {
    let Some(programs) = require_postfix() else {
        return;
    };
    let filters = forkpool_only();
    let filter = filters.all[0].start(&filters.dir);
    let postfix = Postfix::start(&programs, filter.port);
    let mut smtp = session_before_data(&postfix);
    let holder = conversations_on(&filter, 1)[0];

    common::signal_pid(filter.pid, "HUP");
    let deadline = Instant::now() + Duration::from_secs(30);
    while filter.status().is_none_or(|s| s["serving_generation"] != 2) {
        assert!(
            Instant::now() < deadline,
            "no reload: {:?}",
            filter.status()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let reply = finish(&mut smtp, "reload-1");
    assert_eq!(reply.code, 250, "{reply:?}\n{}", postfix.log());
    smtp.quit();
    // Filtered by the child of the old generation that held it.
    let message = postfix.wait_delivered("reload-1");
    assert_eq!(
        message.header_values("X-Forkpool-Milter"),
        [holder.to_string()]
    );
}
