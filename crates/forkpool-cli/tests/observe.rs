//! Observability wired into the supervisor: the systemd watchdog, per-child
//! resources and queue figures in status and metrics, memory-aware
//! recycling and slow-request captures.

mod common;

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use common::{temp_path, DemoPool};

/// With `NOTIFY_SOCKET` and `WATCHDOG_USEC` set, the supervisor sends
/// `WATCHDOG=1` over and over, at about half the interval.
#[test]
fn watchdog_keepalives_reach_the_notify_socket() {
    let path = temp_path("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let notify = path.to_str().unwrap().to_string();
    // 600 ms: a keep-alive every 300 ms.
    let pool = DemoPool::start_with(
        &["--min-children", "1"],
        &[("NOTIFY_SOCKET", &notify), ("WATCHDOG_USEC", "600000")],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut keepalives = Vec::new();
    let mut buf = [0u8; 4096];
    while keepalives.len() < 4 && Instant::now() < deadline {
        if let Ok(n) = socket.recv(&mut buf) {
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            if text.lines().any(|l| l == "WATCHDOG=1") {
                keepalives.push(Instant::now());
            }
        }
    }
    drop(pool);
    let _ = std::fs::remove_file(&path);
    assert!(
        keepalives.len() >= 4,
        "only {} WATCHDOG=1 in 20 s",
        keepalives.len()
    );
    // Spaced by the schedule, not sent on every turn of the loop.
    let first_to_last = keepalives[keepalives.len() - 1] - keepalives[0];
    assert!(
        first_to_last >= Duration::from_millis(3 * 300 - 100),
        "4 keep-alives within {first_to_last:?}: not at half the watchdog interval"
    );
}
