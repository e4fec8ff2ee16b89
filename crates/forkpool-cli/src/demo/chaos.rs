//! Fault injection for tests, enabled only by `forkpool demo --chaos`:
//! `?chaos=garbage` makes the serving child write a malformed message on
//! its back-channel, `?chaos=exit` makes it exit abruptly mid-request,
//! `?chaos=panic` makes the handler panic. The supervisor must survive all
//! three and replace the child.

use std::os::fd::AsRawFd;

use forkpool::WorkerInfo;
use nix::sys::socket::{send, MsgFlags};

/// Carries out one `chaos=` request inside the child.
pub fn inject(what: &str, worker: &WorkerInfo) {
    match what {
        "garbage" => {
            // Version 1, kind 'Z': no such message.
            let _ = send(
                worker.channel_fd().as_raw_fd(),
                b"\x01Zjunk",
                MsgFlags::empty(),
            );
        }
        "exit" => std::process::exit(3),
        "panic" => panic!("chaos=panic requested"),
        _ => {}
    }
}
