//! Whether a process listens on a loopback TCP port, read from `/proc`:
//! the readiness signal for servers the tests start (Postfix, smtp-sink,
//! milters) without connecting to them, since a probe connection would be
//! a conversation of its own in what the test counts.
#![allow(dead_code)]

use std::time::{Duration, Instant};

/// The inodes of TCP sockets listening on 127.0.0.1:`port`.
fn listening_inodes(port: u16) -> Vec<String> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let local = format!("0100007F:{port:04X}");
    table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        // Columns: sl local rem st tx:rx tr:when retrnsmt uid timeout inode.
        .filter(|f| f.len() > 9 && f[1] == local && f[3] == "0A")
        .map(|f| f[9].to_string())
        .collect()
}

/// Whether process `pid` holds a socket listening on 127.0.0.1:`port`.
pub fn listens_on(pid: i32, port: u16) -> bool {
    let inodes = listening_inodes(port);
    if inodes.is_empty() {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(Result::ok)
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|link| {
            let link = link.to_string_lossy().into_owned();
            Some(
                link.strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_string(),
            )
        })
        .any(|inode| inodes.contains(&inode))
}

/// Polls until `pid` listens on `port` (true), `gone()` says the process
/// has ended, or `timeout` passes (false).
pub fn wait_listening(
    pid: i32,
    port: u16,
    timeout: Duration,
    mut gone: impl FnMut() -> bool,
) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if listens_on(pid, port) {
            return true;
        }
        if gone() || Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A loopback port free now. It is released before the server binds it,
/// so another process may take it in between: callers retry.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}
