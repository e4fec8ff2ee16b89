//! A tiny HTTP/1.1 server for the benchmark's own tests: a thread per
//! connection, keep-alive unless asked to close, counting what it answers.
//!
//! It speaks the demo's contract closely enough for the load generator:
//! `?work_ms=N` sleeps, every response says `hello\n` with an
//! `X-Forkpool-Slot` (the connection's number here). Two paths misbehave
//! on purpose: `/status/503` answers 503 and `/truncate` hangs up halfway.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Default)]
struct Counters {
    stop: AtomicBool,
    connections: AtomicU64,
    responses: AtomicU64,
}

/// The running server; it stops when dropped.
pub struct TestServer {
    addr: SocketAddr,
    counters: Arc<Counters>,
}

impl TestServer {
    /// Listens on a free loopback port.
    pub fn start() -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let addr = listener.local_addr().unwrap();
        let counters = Arc::new(Counters::default());
        let shared = counters.clone();
        std::thread::spawn(move || accept_loop(listener, shared));
        TestServer { addr, counters }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Complete responses written so far.
    pub fn responses(&self) -> u64 {
        self.counters.responses.load(Ordering::SeqCst)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.counters.connections.load(Ordering::SeqCst)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.counters.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

fn accept_loop(listener: TcpListener, counters: Arc<Counters>) {
    for stream in listener.incoming() {
        if counters.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let id = counters.connections.fetch_add(1, Ordering::SeqCst);
        let counters = counters.clone();
        std::thread::spawn(move || serve(stream, id, &counters));
    }
}

fn serve(stream: TcpStream, id: u64, counters: &Counters) {
    // A short read timeout lets an idle connection notice the stop flag.
    let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
    let _ = stream.set_nodelay(true);
    let mut writer = stream.try_clone().expect("clone a socket");
    let mut reader = BufReader::new(stream);
    while !counters.stop.load(Ordering::SeqCst) {
        let Some((path, close)) = read_request(&mut reader, counters) else {
            return;
        };
        if let Some(ms) = path.split("work_ms=").nth(1) {
            let ms: u64 = ms.split('&').next().unwrap_or("0").parse().unwrap_or(0);
            std::thread::sleep(Duration::from_millis(ms));
        }
        let connection = if close { "Connection: close\r\n" } else { "" };
        let response = match path.as_str() {
            "/status/503" => format!("HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n{connection}\r\n"),
            "/truncate" => {
                let _ = writer.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nhel");
                return;
            }
            _ => format!(
                "HTTP/1.1 200 OK\r\nContent-Length: 6\r\nX-Forkpool-Slot: {id}\r\n\
                 X-Forkpool-Pid: {}\r\n{connection}\r\nhello\n",
                std::process::id()
            ),
        };
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
        counters.responses.fetch_add(1, Ordering::SeqCst);
        if close {
            return;
        }
    }
}

/// Reads one request head: its path and whether it asked to close.
fn read_request(reader: &mut BufReader<TcpStream>, counters: &Counters) -> Option<(String, bool)> {
    let mut path = None;
    let mut close = false;
    let mut line = String::new();
    loop {
        // On a timeout, a partly read line stays in `line` for the next try.
        match reader.read_line(&mut line) {
            Ok(0) => return None,
            Ok(_) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                if counters.stop.load(Ordering::SeqCst) {
                    return None;
                }
                continue;
            }
            Err(_) => return None,
        }
        let text = line.trim_end();
        if text.is_empty() {
            return path.map(|p| (p, close));
        }
        if path.is_none() {
            path = Some(text.split(' ').nth(1)?.to_string());
        } else if let Some((name, value)) = text.split_once(':') {
            close |= name.eq_ignore_ascii_case("connection")
                && value.trim().eq_ignore_ascii_case("close");
        }
        line.clear();
    }
}
