//! Fault injection for tests, enabled only by `forkpool-bench demo --chaos`
//! (the shipped `forkpool demo` has no such switch).
//!
//! Before the response (the request dies with its child):
//! - `?chaos=exit`: the child exits abruptly with status 3;
//! - `?chaos=panic`: the handler panics.
//!
//! Before the response, and the child lives on:
//! - `?chaos=growN` (N at most 1024): the child keeps N MiB more of memory
//!   it has written to (its own, unshared) for the rest of its life, as a
//!   handler that leaks memory does.
//!
//! After the response is written (the client has its answer first):
//! - `?chaos=garbage`: the child writes a malformed message on its
//!   back-channel;
//! - `?chaos=flood` (in `shared` dispatch): the child sends a burst of 502
//!   legal reports, `Idle`, 500 × `Missed`, `Busy`, which the supervisor must
//!   read in full however it paces itself.
//!
//! The supervisor must survive all of them and replace a child that broke.

use std::os::fd::AsRawFd;

use forkpool::protocol::{ChildMessage, MessageBuf};
use forkpool::WorkerInfo;
use nix::sys::socket::{send, MsgFlags};

/// The hooks the demo's HTTP handler calls.
pub fn hooks() -> forkpool_cli::demo::http::ChaosHooks {
    forkpool_cli::demo::http::ChaosHooks {
        before_response,
        after_response,
    }
}

/// What `?chaos=growN` kept, never freed.
static GROWN: std::sync::Mutex<Vec<Vec<u8>>> = std::sync::Mutex::new(Vec::new());

/// Faults that hit before the response.
pub fn before_response(what: &str) {
    match what {
        "exit" => std::process::exit(3),
        "panic" => panic!("chaos=panic requested"),
        _ => {
            let grow = what
                .strip_prefix("grow")
                .and_then(|n| n.parse::<usize>().ok());
            if let Some(mib) = grow {
                let mut grown = GROWN.lock().unwrap_or_else(|e| e.into_inner());
                // Written to (not zeroed by the kernel on first touch): the
                // pages are resident and the child's own.
                grown.push(vec![1u8; mib.min(1024) << 20]);
            }
        }
    }
}

/// Faults that hit after the response is written.
pub fn after_response(what: &str, worker: &WorkerInfo) {
    let fd = worker.channel_fd().as_raw_fd();
    match what {
        // Version 1, kind 'Z': no such message.
        "garbage" => {
            let _ = send(fd, b"\x01Zjunk", MsgFlags::empty());
        }
        "flood" => {
            let mut buf = MessageBuf::default();
            let _ = send(fd, ChildMessage::Idle.encode(&mut buf), MsgFlags::empty());
            for _ in 0..500 {
                let _ = send(fd, ChildMessage::Missed.encode(&mut buf), MsgFlags::empty());
            }
            let _ = send(fd, ChildMessage::Busy.encode(&mut buf), MsgFlags::empty());
        }
        _ => {}
    }
}
