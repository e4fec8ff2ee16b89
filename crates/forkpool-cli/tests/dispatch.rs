//! Where connections go: the lowest idle child, in every mode.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{parse_response, DemoPool};

fn sequential_requests_go_to_slot_zero(mode: &str) {
    let pool = DemoPool::start(&[
        "--dispatch",
        mode,
        "--min-children",
        "4",
        "--min-spare",
        "2",
    ]);
    assert!(pool.wait_children(Duration::from_secs(5), |n| n == 4));
    let mut slots = Vec::new();
    for _ in 0..20 {
        let r = pool.get("/").expect("request");
        assert_eq!(r.status, 200);
        assert_eq!(r.body, "hello\n");
        slots.push(r.slot.expect("slot header"));
    }
    assert!(
        slots.iter().all(|s| *s == 0),
        "{mode}: sequential requests should all go to slot 0, got {slots:?}\n{}",
        pool.stderr.dump()
    );
}

#[test]
fn handoff_keeps_the_lowest_child_hot() {
    sequential_requests_go_to_slot_zero("handoff");
}

#[test]
fn order_keeps_the_lowest_child_hot() {
    sequential_requests_go_to_slot_zero("order");
}

#[test]
fn shared_mode_serves_and_reports() {
    let pool = DemoPool::start(&["--dispatch", "shared", "--min-children", "3"]);
    for _ in 0..10 {
        let r = pool.get("/").expect("request");
        assert_eq!(r.status, 200);
        assert!(r.slot.is_some_and(|s| s < 3), "slot {:?}", r.slot);
    }
    // Children tell the supervisor when they accept.
    assert!(pool
        .stderr
        .wait_for_count("child accepted a connection", 10, Duration::from_secs(5)));
}

#[test]
fn keep_alive_serves_several_requests_on_one_connection() {
    let pool = DemoPool::start(&[]);
    let mut stream = TcpStream::connect(pool.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut pids = Vec::new();
    for _ in 0..3 {
        stream
            .write_all(b"GET /?work_ms=1 HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        // Read exactly one response: head, then the 6-byte body.
        while !buf.ends_with(b"\r\n\r\n") {
            stream.read_exact(&mut byte).unwrap();
            buf.push(byte[0]);
        }
        let mut body = [0u8; 6];
        stream.read_exact(&mut body).unwrap();
        buf.extend_from_slice(&body);
        let r = parse_response(std::str::from_utf8(&buf).unwrap()).unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body, "hello\n");
        pids.push(r.pid.unwrap());
    }
    assert!(
        pids.windows(2).all(|w| w[0] == w[1]),
        "one child serves the connection: {pids:?}"
    );
}

#[test]
fn unix_listener_serves() {
    let dir = std::env::temp_dir().join(format!("forkpool-unix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("demo.sock");
    let listen = format!("unix:{}", path.display());
    let pool = DemoPool::start(&["--listen", &listen]);
    assert!(pool
        .stdout
        .wait_for(&format!("listening on {listen}"), Duration::from_secs(5)));
    let mut stream = std::os::unix::net::UnixStream::connect(&path).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    let r = parse_response(&raw).unwrap();
    assert_eq!((r.status, r.body.as_str()), (200, "hello\n"));
    drop(pool);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_requests_get_clear_errors() {
    let pool = DemoPool::start(&[]);
    let r = pool.get("/?work_ms=soon").unwrap();
    assert_eq!(r.status, 400);
    assert!(
        r.body.contains("work_ms must be a whole number"),
        "{}",
        r.body
    );
    let mut stream = TcpStream::connect(pool.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(b"\x16\x03\x01 not http\r\n\r\n").unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    assert!(raw.starts_with("HTTP/1.1 400"), "{raw}");
}
