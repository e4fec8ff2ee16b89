//! `--dispatch kernel`: the kernel gives each connection to the lowest idle
//! child's own socket (issue 26), with real sockets and real children.

mod common;

use std::io::Read;
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{require_kernel_dispatch, send, signal_pid, total, DemoPool};

/// A demo pool in kernel dispatch with `children` idle children; fails
/// (or, outside CI, returns None with a NOT RUN line) where the kernel
/// refuses the program.
fn kernel_pool(children: &str, extra: &[&str]) -> Option<DemoPool> {
    let mut args = vec![
        "--dispatch",
        "kernel",
        "--min-children",
        children,
        "--min-spare",
        "0",
        "--max-spare",
        "64",
    ];
    args.extend_from_slice(extra);
    let pool = DemoPool::start(&args);
    if !require_kernel_dispatch(&pool) {
        return None;
    }
    let n: usize = children.parse().unwrap();
    assert!(pool
        .wait_status(Duration::from_secs(10), |s| s["idle"] == n as u64)
        .is_some());
    Some(pool)
}

fn slot_of_pid(status: &serde_json::Value, pid: i32) -> Option<u64> {
    status["slots"]
        .as_array()?
        .iter()
        .find(|s| s["pid"] == pid)
        .and_then(|s| s["slot"].as_u64())
}

fn pid_in_slot(status: &serde_json::Value, slot: u64) -> i32 {
    status["slots"]
        .as_array()
        .and_then(|all| all.iter().find(|s| s["slot"] == slot))
        .and_then(|s| s["pid"].as_i64())
        .unwrap_or_else(|| panic!("no child in slot {slot}: {status}")) as i32
}

#[test]
fn sequential_requests_all_go_to_slot_zero() {
    let Some(pool) = kernel_pool("4", &[]) else {
        return;
    };
    let mut slots = Vec::new();
    for _ in 0..30 {
        let r = pool.get("/").expect("request");
        assert_eq!((r.status, r.body.as_str()), (200, "hello\n"));
        slots.push(r.slot.expect("slot header"));
    }
    assert_eq!(slots, vec![0; 30], "{}", pool.stderr.dump());
    let status = pool.status();
    assert_eq!(total(&status, "futile_wakeups"), 0, "{status}");
    assert!(status.get("dispatch_fallback").is_none(), "{status}");
}

/// Four connections arrive while no child can accept (all stopped): the
/// kernel reserves a different idle child for each, never two on one.
#[test]
fn a_burst_lands_one_connection_per_idle_child() {
    let Some(pool) = kernel_pool("4", &[]) else {
        return;
    };
    let status = pool.status();
    let pids: Vec<i32> = (0..4).map(|slot| pid_in_slot(&status, slot)).collect();
    for &pid in &pids {
        signal_pid(pid, "STOP");
    }
    let mut waiting: Vec<_> = (0..4).map(|_| send(pool.addr, "/")).collect();
    for &pid in &pids {
        signal_pid(pid, "CONT");
    }
    let mut slots: Vec<usize> = waiting
        .iter_mut()
        .map(|conn| {
            let mut raw = String::new();
            std::io::Read::read_to_string(conn, &mut raw).expect("an answer");
            common::parse_response(&raw)
                .expect("a response")
                .slot
                .expect("slot")
        })
        .collect();
    slots.sort_unstable();
    assert_eq!(slots, [0, 1, 2, 3], "{}", pool.stderr.dump());
    let status = pool.status();
    assert_eq!(total(&status, "futile_wakeups"), 0, "{status}");
}

/// A stopped child cannot accept: the kernel queues one connection on its
/// socket and sends the rest elsewhere. Killed, the child loses nothing:
/// the supervisor takes what was queued and hands it on.
#[test]
fn a_killed_child_loses_nothing_queued_on_its_socket() {
    let Some(pool) = kernel_pool("2", &[]) else {
        return;
    };
    let status = pool.status();
    let first = pid_in_slot(&status, 0);
    signal_pid(first, "STOP");
    // Queued on slot 0's socket (its child is idle on the scoreboard).
    let mut queued = send(pool.addr, "/");
    // Slot 0 is reserved now: the next one goes to slot 1.
    let r = pool.get("/").expect("request");
    assert_eq!(r.slot, Some(1), "{}", pool.stderr.dump());
    signal_pid(first, "KILL");
    let mut raw = String::new();
    std::io::Read::read_to_string(&mut queued, &mut raw).expect("an answer");
    let answer = common::parse_response(&raw).expect("a response");
    assert_eq!(answer.status, 200, "the queued connection was served");
    assert_ne!(answer.pid, Some(first));
    assert!(
        pool.wait_total("died", 1, Duration::from_secs(10)),
        "{}",
        pool.status()
    );
    assert!(slot_of_pid(&pool.status(), first).is_none());
}

/// A SYN whose handshake never completes (the client is gone: its kernel
/// answers the SYN-ACK with a reset) reserves the lowest idle child; the
/// supervisor gives the reservation back after its deadline.
#[test]
fn a_reservation_whose_handshake_never_completes_is_released() {
    // Without TCP_DEFER_ACCEPT (the demo's default 5 s), the deadline is
    // 1 s: a handshake completes within a round trip.
    let Some(pool) = kernel_pool("2", &["--defer-accept", "0s"]) else {
        return;
    };
    let SocketAddr::V4(addr) = pool.addr else {
        panic!("the demo listens on IPv4 in tests")
    };
    common::send_bare_syn(addr.port(), 40_000 + (std::process::id() % 20_000) as u16);
    // Slot 0 is reserved for a connection that will never come.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        let r = pool.get("/").expect("request");
        seen.push(r.slot.unwrap());
        if r.slot == Some(1) {
            break;
        }
    }
    assert_eq!(
        seen.last(),
        Some(&1),
        "the reservation took slot 0 out: {seen:?}"
    );
    assert!(
        pool.wait_total("abandoned", 1, Duration::from_secs(10)),
        "{}",
        pool.status()
    );
    let r = pool.get("/").expect("request");
    assert_eq!(r.slot, Some(0), "slot 0 is first again");
}

/// A one-child pool whose child is reserved for a connection that will
/// never come (a SYN whose handshake never completes): a real request
/// right after it is answered once the reservation's 30 ms hold is over
/// (the supervisor claims the child for it from the overflow), not after
/// the second it took to give a reservation back; it is counted in
/// status and metrics as abandoned, and nothing is logged for it.
#[test]
fn a_dead_reservation_holds_the_only_child_for_a_moment_only() {
    let Some(pool) = kernel_pool(
        "1",
        &[
            "--max-children",
            "1",
            "--defer-accept",
            "0s",
            "--metrics",
            "127.0.0.1:0",
        ],
    ) else {
        return;
    };
    let SocketAddr::V4(addr) = pool.addr else {
        panic!("the demo listens on IPv4 in tests")
    };
    common::send_bare_syn(addr.port(), 40_000 + (std::process::id() % 20_000) as u16);
    let mut client = send(pool.addr, "/");
    client
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut raw = String::new();
    client
        .read_to_string(&mut raw)
        .expect("answered within 500 ms, while the dead reservation held the only child");
    let r = common::parse_response(&raw).expect("a response");
    assert_eq!((r.status, r.slot), (200, Some(0)));
    assert!(
        pool.wait_total("abandoned", 1, Duration::from_secs(5)),
        "{}",
        pool.status()
    );
    let metrics = common::scrape_metrics(&pool);
    assert!(
        metrics.lines().any(|l| l == "forkpool_abandoned_total 1"),
        "{metrics}"
    );
}

/// A flood of 1,000 SYNs a second whose handshakes never complete (each
/// reserves a child for 30 ms) while a client sends a request every 50 ms:
/// every request is answered, the slowest within 250 ms, and the flood is
/// counted as abandoned. The pool grows past the children the flood keeps
/// reserved.
#[test]
fn a_syn_flood_of_a_thousand_a_second_costs_real_clients_nothing() {
    let Some(pool) = kernel_pool("2", &["--max-children", "64"]) else {
        return;
    };
    let SocketAddr::V4(addr) = pool.addr else {
        panic!("the demo listens on IPv4 in tests")
    };
    let port = addr.port();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flooding = std::sync::Arc::clone(&stop);
    let flood = std::thread::spawn(move || {
        let start = Instant::now();
        let mut sent = 0u32;
        // At most 5 s, whatever the stream does.
        while !flooding.load(std::sync::atomic::Ordering::SeqCst)
            && start.elapsed() < Duration::from_secs(5)
        {
            common::send_bare_syn(port, 20_000 + (sent % 30_000) as u16);
            sent += 1;
            let next = start + Duration::from_millis(u64::from(sent));
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        sent
    });
    std::thread::sleep(Duration::from_millis(300));
    let mut slowest = Duration::ZERO;
    let mut failed = Vec::new();
    for _ in 0..40 {
        let began = Instant::now();
        let mut client = send(pool.addr, "/");
        client
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        let mut raw = String::new();
        match client.read_to_string(&mut raw) {
            Ok(_) if raw.starts_with("HTTP/1.1 200") => {}
            other => failed.push(format!("{other:?} {raw:?}")),
        }
        slowest = slowest.max(began.elapsed());
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let sent = flood.join().unwrap();
    let status = pool.status();
    assert!(failed.is_empty(), "{} failed: {failed:?}", failed.len());
    assert!(
        slowest < Duration::from_millis(250),
        "the slowest answer took {slowest:?} under a flood of {sent} SYNs"
    );
    // A SYN that finds every child reserved goes to the overflow, where
    // it holds nothing and is not counted: most are, not all.
    assert!(
        total(&status, "abandoned") >= u64::from(sent) / 4,
        "{sent} SYNs sent: {status}"
    );
}

/// Where the kernel refuses the program (here: root without CAP_BPF and
/// CAP_SYS_ADMIN, under `setpriv`), the pool falls back to handoff, says
/// why in status, and still keeps the lowest child hot.
#[test]
fn without_the_capability_the_pool_falls_back_to_handoff() {
    let Some(setpriv) = common::require_program("setpriv", "apt-get install util-linux") else {
        return;
    };
    let mut command = Command::new(setpriv);
    command
        .args([
            "--bounding-set",
            "-bpf,-sys_admin,-perfmon,-net_admin",
            "--",
        ])
        .arg(common::forkpool_bin())
        .arg("demo");
    let pool = DemoPool::launch(
        command,
        &["--dispatch", "kernel", "--min-children", "3"],
        &[],
        true,
    );
    let status = pool.status();
    assert_eq!(status["dispatch"], "handoff", "{status}");
    let why = status["dispatch_fallback"].as_str().unwrap_or_default();
    assert!(why.contains("CAP_BPF"), "{why}");
    for _ in 0..10 {
        assert_eq!(pool.get("/").expect("request").slot, Some(0));
    }
}

/// Children report nothing per connection; the supervisor reads the
/// scoreboard: status shows a busy child while it serves, and the totals
/// count what the kernel gave them.
#[test]
fn status_follows_the_scoreboard() {
    let Some(pool) = kernel_pool("2", &[]) else {
        return;
    };
    let addr = pool.addr;
    let slow = std::thread::spawn(move || common::get(addr, "/?work_ms=1500"));
    let busy = pool.wait_status(Duration::from_secs(5), |s| s["busy"] == 1);
    assert!(busy.is_some(), "never seen busy: {}", pool.status());
    assert_eq!(slow.join().unwrap().expect("request").status, 200);
    for _ in 0..5 {
        pool.get("/").expect("request");
    }
    let status = pool
        .wait_status(Duration::from_secs(5), |s| {
            total(s, "accepted") >= 6 && s["busy"] == 0
        })
        .unwrap_or_else(|| panic!("{}", pool.status()));
    assert_eq!(status["slots"][0]["served"], 6, "{status}");
}

/// A child busy longer than the ping timeout is not taken for hung: the
/// supervisor sees it busy on the scoreboard and does not ping it.
#[test]
fn a_long_request_is_not_a_missed_ping() {
    let Some(pool) = kernel_pool(
        "1",
        &["--ping-interval", "100ms", "--ping-timeout", "300ms"],
    ) else {
        return;
    };
    let r = pool.get("/?work_ms=1500").expect("request");
    assert_eq!(r.status, 200);
    let status = pool.status();
    assert_eq!(total(&status, "killed"), 0, "{status}");
}

/// `--max-requests-per-child`: a kernel-dispatch child leaves on its own
/// after its share (the supervisor replaces it), and nothing is refused.
#[test]
fn a_child_leaves_after_its_share() {
    let Some(pool) = kernel_pool("1", &["--max-requests-per-child", "5"]) else {
        return;
    };
    let mut pids = Vec::new();
    for _ in 0..12 {
        let r = pool.get("/").expect("request");
        assert_eq!(r.status, 200);
        pids.push(r.pid.unwrap());
    }
    pids.dedup();
    assert!(pids.len() >= 3, "12 requests, 5 a child: {pids:?}");
    let status = pool.status();
    assert_eq!(total(&status, "died"), 0, "{status}");
    assert_eq!(total(&status, "killed"), 0, "{status}");
}

/// More slow requests at once than children: the kernel queues what no
/// idle child can take on the supervisor's socket, and every one is served.
#[test]
fn a_saturated_pool_serves_the_overflow() {
    let Some(pool) = kernel_pool("2", &["--max-children", "2"]) else {
        return;
    };
    let clients: Vec<_> = (0..6)
        .map(|_| {
            let addr = pool.addr;
            std::thread::spawn(move || common::get(addr, "/?work_ms=200"))
        })
        .collect();
    for c in clients {
        assert_eq!(c.join().unwrap().expect("request").status, 200);
    }
    let status = pool.status();
    assert_eq!(total(&status, "killed"), 0, "{status}");
}

/// The listener joins a `SO_REUSEPORT` group only after it is bound, so a
/// second pool on the same port fails to start instead of silently taking
/// a share of the connections.
#[test]
fn a_second_pool_on_the_same_port_is_refused() {
    let Some(pool) = kernel_pool("1", &[]) else {
        return;
    };
    let control = common::temp_path("second.sock");
    let mut second = Command::new(common::forkpool_bin())
        .args([
            "demo",
            "--dispatch",
            "kernel",
            "--listen",
            &pool.addr.to_string(),
        ])
        .arg("--control")
        .arg(&control)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = second.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if status.is_none() {
        let _ = second.kill();
        let _ = second.wait();
    }
    assert!(
        status.is_some_and(|s| !s.success()),
        "the second pool started: {status:?}"
    );
    assert_eq!(pool.get("/").expect("request").status, 200);
}

/// A connection taken from a slot's own socket inherits what the listener
/// gives its connections: the demo's 5 s read timeout, so a client that
/// connects and says nothing does not hold a child for ever.
#[test]
fn a_silent_client_does_not_hold_a_child() {
    let Some(pool) = kernel_pool("1", &[]) else {
        return;
    };
    let mut silent = std::net::TcpStream::connect(pool.addr).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let started = Instant::now();
    // The child answers 408 and closes once its read times out.
    let mut answer = Vec::new();
    let read = std::io::Read::read_to_end(&mut silent, &mut answer);
    assert!(read.is_ok(), "{read:?} after {:?}", started.elapsed());
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    // Its child is free again.
    assert!(pool
        .wait_status(Duration::from_secs(5), |s| s["slots"][0]["state"] == "idle")
        .is_some());
}

/// A child finishing a connection takes the next one waiting on the
/// overflow itself, and the scoreboard's count says so (`taken_next`).
#[test]
fn a_finishing_child_takes_the_overflow_itself() {
    // No ping meanwhile: a child with a message waiting reads it before it
    // takes the next connection (the supervisor then hands that one on).
    let Some(pool) = kernel_pool("1", &["--max-children", "1", "--ping-interval", "60s"]) else {
        return;
    };
    // One slow request holds the only child; three more wait on the
    // supervisor's listener (no child is idle), and the child, finishing,
    // takes them one after another.
    let addr = pool.addr;
    let slow = std::thread::spawn(move || common::get(addr, "/?work_ms=500"));
    assert!(pool
        .wait_status(Duration::from_secs(5), |s| s["busy"] == 1)
        .is_some());
    let queued: Vec<_> = (0..3).map(|_| send(pool.addr, "/")).collect();
    assert_eq!(slow.join().unwrap().expect("request").status, 200);
    for mut conn in queued {
        let mut raw = String::new();
        std::io::Read::read_to_string(&mut conn, &mut raw).expect("an answer");
        assert_eq!(
            common::parse_response(&raw).expect("a response").status,
            200
        );
    }
    let status = pool
        .wait_status(Duration::from_secs(5), |s| total(s, "accepted") == 4)
        .unwrap_or_else(|| panic!("{}", pool.status()));
    assert!(total(&status, "taken_next") >= 1, "{status}");
}

/// The supervisor's CPU time so far, in clock ticks (utime + stime).
fn cpu_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit(") ").next().unwrap().split(' ').collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// Both children reserved by connections whose request has not come yet
/// (TCP_DEFER_ACCEPT holds them in the kernel), a third connection on the
/// overflow: the supervisor's last reading says the children are idle,
/// the scoreboard says otherwise. It must wait for a child, not spin on
/// the overflow (it once woke, found no child, stopped watching, saw
/// "idle" and watched again, thousands of times a second); the third
/// connection is served once a child is free.
#[test]
fn the_supervisor_does_not_spin_while_its_children_are_reserved() {
    let Some(pool) = kernel_pool("2", &["--defer-accept", "5s", "--max-children", "2"]) else {
        return;
    };
    // Two silent clients: each SYN reserves an idle child.
    let silent: Vec<_> = (0..2)
        .map(|_| std::net::TcpStream::connect(pool.addr).unwrap())
        .collect();
    let mut third = send(pool.addr, "/");
    let before = cpu_ticks(pool.pid);
    let watched = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    let spent = cpu_ticks(pool.pid) - before;
    let elapsed = watched.elapsed().as_secs_f64();
    // Clock ticks are 1/100 s: a spinning loop takes most of the 2 s (a
    // whole core), an idle one next to nothing.
    assert!(
        (spent as f64) < 0.25 * 100.0 * elapsed,
        "the supervisor used {spent} ticks in {elapsed:.1}s with every child reserved"
    );
    // The silent clients leave: their close completes the handshakes, the
    // children take and drop them, and then the third connection.
    drop(silent);
    let mut raw = String::new();
    std::io::Read::read_to_string(&mut third, &mut raw).expect("an answer");
    let response = common::parse_response(&raw).expect("a response");
    assert_eq!(response.status, 200);
}

/// The supervisor never holds a kernel-dispatched connection, yet status
/// names a busy child's client (asked of the kernel when status is).
#[test]
fn status_names_a_busy_childs_client() {
    let Some(pool) = kernel_pool("2", &[]) else {
        return;
    };
    let busy = send(pool.addr, "/?work_ms=3000");
    let client = busy.local_addr().unwrap().to_string();
    let busy_peer = |s: &serde_json::Value| {
        s["slots"].as_array().and_then(|all| {
            all.iter()
                .find(|slot| slot["state"] == "busy" && slot["peer"].is_string())
                .map(|slot| slot["peer"].as_str().unwrap_or_default().to_string())
        })
    };
    let status = pool
        .wait_status(Duration::from_secs(10), |s| busy_peer(s).is_some())
        .unwrap_or_else(|| panic!("no busy child with a peer: {}", pool.status()));
    assert_eq!(
        busy_peer(&status).as_deref(),
        Some(client.as_str()),
        "{status}"
    );
}
