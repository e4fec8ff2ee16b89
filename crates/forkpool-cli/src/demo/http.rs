//! The demo handler: a tiny HTTP/1.1 server for one connection at a time.
//!
//! `GET /` answers `hello`. `?work_ms=N` sleeps N ms first (a slow, blocking
//! handler), `?cpu_ms=N` burns N ms of CPU. Every response names the child
//! that served it in `X-Forkpool-Slot` and `X-Forkpool-Pid`. Keep-alive is
//! the HTTP/1.1 default; `Connection: close` and HTTP/1.0 close.

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use forkpool::Connection;

use super::request::{chunked_body, parse_request, Framing, Parsed, Refusal, Request};

/// The body every successful response carries.
pub const BODY: &[u8] = b"hello\n";
/// How long a kept-alive connection may sit idle before the child drops it.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest request body accepted (and read only to be discarded); a
/// longer `Content-Length` is answered 413 without reading it.
pub const MAX_BODY: u64 = 1024 * 1024;
/// How long one request (head and body) may take to arrive once the
/// child is waiting for it, however the bytes trickle in; a request not
/// complete by then is answered 408 and the connection closed.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest `work_ms` / `cpu_ms` honoured, so a typo cannot wedge a child.
const MAX_SIMULATED_MS: u64 = 60_000;

/// Fault injection that a test build plugs in (`forkpool-bench demo
/// --chaos`; the shipped command has none): a request with `?chaos=WHAT`
/// calls `before_response` ahead of its answer and `after_response` once
/// the answer is written.
#[derive(Debug, Clone, Copy)]
pub struct ChaosHooks {
    /// Called before the response, with WHAT.
    pub before_response: fn(&str),
    /// Called after the response is written, with WHAT and the child.
    pub after_response: fn(&str, &forkpool::WorkerInfo),
}

/// Options of the demo handler.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Honour `?chaos=...` with these hooks. None by default.
    pub chaos: Option<ChaosHooks>,
    /// Requests served on one kept-alive connection before it is closed.
    pub keepalive_requests: u32,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            chaos: None,
            keepalive_requests: 100,
        }
    }
}

/// The value of `key` in a query string such as `work_ms=50&cpu_ms=2`.
pub fn query_value<'q>(query: Option<&'q str>, key: &str) -> Option<&'q str> {
    query?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// Serves one connection: requests until the client closes, asks to close,
/// or stays quiet for [`KEEPALIVE_TIMEOUT`].
pub fn serve(conn: Connection<'_>, options: &DemoOptions) {
    let Connection {
        mut stream, worker, ..
    } = conn;
    // A TCP connection got its read timeout (KEEPALIVE_TIMEOUT) from the
    // listener (see demo::run); a Unix-socket one does not inherit it.
    if let forkpool::Stream::Unix(_) = stream {
        let _ = stream.set_read_timeout(Some(KEEPALIVE_TIMEOUT));
    }
    // The read timeout the socket has now: set again only when it changes,
    // which on a prompt client is never (one system call less per read).
    let mut timeout = KEEPALIVE_TIMEOUT;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let mut served = 0u32;
    loop {
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        let (request, head_len) = loop {
            match parse_request(&buf) {
                Parsed::Complete(req, n) => break (req, n),
                Parsed::Refused(Refusal { status, why }) => {
                    refuse_and_close(&mut stream, status, &format!("{why}\n"), worker);
                    return;
                }
                Parsed::Partial => {}
            }
            match read_before(&mut stream, &mut chunk, deadline, &mut timeout) {
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                // Quiet between requests: a kept-alive connection ends.
                Err(Ended::Timeout) if buf.is_empty() && served > 0 => return,
                Err(Ended::Timeout) => {
                    refuse_and_close(&mut stream, 408, "request head too slow\n", worker);
                    return;
                }
                Err(Ended::Closed) => return,
            }
        };
        if request.expects_continue
            && buf.len() == head_len
            && stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").is_err()
        {
            return;
        }
        let body = match request.framing {
            Framing::None => {
                buf.drain(..head_len);
                Ok(())
            }
            Framing::Length(len) => discard_body(
                &mut stream,
                &mut buf,
                head_len,
                len,
                &mut chunk,
                deadline,
                &mut timeout,
            ),
            Framing::Chunked => discard_chunked(
                &mut stream,
                &mut buf,
                head_len,
                &mut chunk,
                deadline,
                &mut timeout,
            ),
        };
        match body {
            Ok(()) => {}
            Err(Some(Refusal { status, why })) => {
                refuse_and_close(&mut stream, status, &format!("{why}\n"), worker);
                return;
            }
            Err(None) => return,
        }

        served += 1;
        // Like Apache's MaxKeepAliveRequests: a connection that has had its
        // share gives way, so clients beyond the pool's size get a turn.
        let end = if request.keep_alive && served < options.keepalive_requests {
            End::KeepAlive
        } else if !request.keep_alive && buf.is_empty() {
            // The answer's end may wait for the close (its FIN rides with
            // it) only when the client asked to close and sent nothing
            // after this request: closing on unread input resets the
            // connection, and a reset throws away what the kernel holds.
            End::CloseHeld
        } else {
            End::Close
        };
        if !matches!(
            answer(&mut stream, &request, end, worker, options),
            Ok(End::KeepAlive)
        ) {
            return;
        }
    }
}

/// Reads and drops a body of `len` bytes after the head that ends at
/// `head_len` in `buf`; `buf` then starts with what follows it. Err(None)
/// when the client left, Err(Some) for a refusal (too large, too slow).
fn discard_body(
    stream: &mut forkpool::Stream,
    buf: &mut Vec<u8>,
    head_len: usize,
    len: u64,
    chunk: &mut [u8],
    deadline: Instant,
    timeout: &mut Duration,
) -> Result<(), Option<Refusal>> {
    if len > MAX_BODY {
        return Err(Some(Refusal {
            status: 413,
            why: "request body over 1 MiB",
        }));
    }
    let in_buf = (buf.len() - head_len).min(len as usize);
    buf.drain(..head_len + in_buf);
    let mut left = len - in_buf as u64;
    while left > 0 {
        let want = chunk.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        match read_before(stream, &mut chunk[..want], deadline, timeout) {
            Ok(n) => left -= n as u64,
            Err(ended) => return Err(ended.refusal()),
        }
    }
    Ok(())
}

/// Like [`discard_body`] for a chunked body: read until its last chunk
/// and trailers are in `buf`, checked by the chunked grammar.
fn discard_chunked(
    stream: &mut forkpool::Stream,
    buf: &mut Vec<u8>,
    head_len: usize,
    chunk: &mut [u8],
    deadline: Instant,
    timeout: &mut Duration,
) -> Result<(), Option<Refusal>> {
    loop {
        if let Some(used) = chunked_body(&buf[head_len..], MAX_BODY, &mut |_| {}).map_err(Some)? {
            buf.drain(..head_len + used);
            return Ok(());
        }
        match read_before(stream, chunk, deadline, timeout) {
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(ended) => return Err(ended.refusal()),
        }
    }
}

/// How long, and how much, a refused client's input is read and dropped
/// before the connection is closed.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 1 << 20;

/// Answers `status` and closes the connection gracefully. A client that
/// is still sending (a dripping head, a body over the limit) has bytes
/// the handler never read; closing on them makes the kernel reset the
/// connection, and a reset can destroy the answer before the client reads
/// it. So the handler stops sending (the client sees the end of the
/// answer) and reads and drops what still comes, for a moment, as Apache
/// and nginx linger on close.
fn refuse_and_close(
    stream: &mut forkpool::Stream,
    status: u16,
    why: &str,
    worker: &forkpool::WorkerInfo,
) {
    if respond(stream, status, why, worker).is_err() {
        return;
    }
    let shut = match stream {
        forkpool::Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Write),
        forkpool::Stream::Unix(s) => s.shutdown(std::net::Shutdown::Write),
    };
    if shut.is_err() {
        return;
    }
    let deadline = Instant::now() + LINGER;
    let mut sink = [0u8; 4096];
    let mut dropped = 0;
    let mut timeout = Duration::ZERO; // not known here: set on the first read
    while dropped < LINGER_BYTES {
        match read_before(stream, &mut sink, deadline, &mut timeout) {
            Ok(n) => dropped += n,
            Err(_) => return,
        }
    }
}

/// Why a read gave no bytes.
enum Ended {
    /// The request's deadline passed (or the read timed out).
    Timeout,
    /// The client closed or reset the connection.
    Closed,
}

impl Ended {
    /// The answer to a body that ended so: 408 if it was too slow,
    /// none if the client left.
    fn refusal(self) -> Option<Refusal> {
        match self {
            Ended::Timeout => Some(Refusal {
                status: 408,
                why: "request body too slow",
            }),
            Ended::Closed => None,
        }
    }
}

/// One read that ends by `deadline`: the read timeout is what is left of
/// the request's time, so a client dripping bytes cannot stretch it.
/// `timeout` is the read timeout the socket has; it is set only when the
/// read needs another.
fn read_before(
    stream: &mut forkpool::Stream,
    buf: &mut [u8],
    deadline: Instant,
    timeout: &mut Duration,
) -> Result<usize, Ended> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Ended::Timeout);
    }
    let wanted = left.min(KEEPALIVE_TIMEOUT);
    if wanted != *timeout {
        let _ = stream.set_read_timeout(Some(wanted));
        *timeout = wanted;
    }
    match stream.read(buf) {
        Ok(0) => Err(Ended::Closed),
        Ok(n) => Ok(n),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Err(Ended::Timeout)
        }
        Err(_) => Err(Ended::Closed),
    }
}

/// Answers one request, ending it as `end` says unless it is refused (a
/// refusal closes); returns how it ended. An answer that says
/// `Connection: close` is always followed by the close.
fn answer(
    stream: &mut forkpool::Stream,
    request: &Request,
    end: End,
    worker: &forkpool::WorkerInfo,
    options: &DemoOptions,
) -> io::Result<End> {
    if request.method != "GET" && request.method != "HEAD" {
        respond(stream, 405, "only GET and HEAD are served\n", worker)?;
        return Ok(End::Close);
    }
    let query = request.query.as_deref();
    let millis = |key| -> Result<u64, String> {
        match query_value(query, key) {
            None => Ok(0),
            Some(v) => v
                .parse::<u64>()
                .map(|n| n.min(MAX_SIMULATED_MS))
                .map_err(|_| format!("{key} must be a whole number of milliseconds, got '{v}'\n")),
        }
    };
    let (work, cpu) = match (millis("work_ms"), millis("cpu_ms")) {
        (Ok(w), Ok(c)) => (w, c),
        (Err(why), _) | (_, Err(why)) => {
            respond(stream, 400, &why, worker)?;
            return Ok(End::Close);
        }
    };
    let chaos = options
        .chaos
        .and_then(|hooks| Some((hooks, query_value(query, "chaos")?)));
    if let Some((hooks, what)) = chaos {
        (hooks.before_response)(what);
    }
    if cpu > 0 {
        burn_cpu(Duration::from_millis(cpu));
    }
    if work > 0 {
        std::thread::sleep(Duration::from_millis(work));
    }
    let body = if request.method == "HEAD" {
        ""
    } else {
        "hello\n"
    };
    respond_with_body(stream, 200, body, BODY.len(), end, worker)?;
    if let Some((hooks, what)) = chaos {
        (hooks.after_response)(what, worker);
    }
    Ok(end)
}

fn burn_cpu(duration: Duration) {
    let start = Instant::now();
    let mut x: u64 = 1;
    while start.elapsed() < duration {
        for _ in 0..1000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
}

/// An answer of `status` with `body` that closes the connection.
fn respond(
    stream: &mut forkpool::Stream,
    status: u16,
    body: &str,
    worker: &forkpool::WorkerInfo,
) -> io::Result<()> {
    respond_with_body(stream, status, body, body.len(), End::Close, worker)
}

/// How an answer's connection goes on.
#[derive(Clone, Copy, PartialEq)]
enum End {
    /// Kept alive for the next request.
    KeepAlive,
    /// Closed after the answer.
    Close,
    /// Closed after the answer, whose last bytes wait for the close so
    /// its FIN rides with them ([`forkpool::Stream::write_all_before_close`]):
    /// only when nothing unread can be left at the close.
    CloseHeld,
}

fn respond_with_body(
    stream: &mut forkpool::Stream,
    status: u16,
    body: &str,
    content_length: usize,
    end: End,
    worker: &forkpool::WorkerInfo,
) -> io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        414 => "URI Too Long",
        417 => "Expectation Failed",
        431 => "Request Header Fields Too Large",
        501 => "Not Implemented",
        505 => "HTTP Version Not Supported",
        _ => "Error",
    };
    let connection = if end == End::KeepAlive {
        "keep-alive"
    } else {
        "close"
    };
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {content_length}\r\n\
         X-Forkpool-Slot: {}\r\nX-Forkpool-Pid: {}\r\nConnection: {connection}\r\n\r\n{body}",
        worker.slot, worker.pid
    );
    if end == End::CloseHeld {
        stream.write_all_before_close(response.as_bytes())
    } else {
        stream.write_all(response.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_keep_alive_get_with_query() {
        let Parsed::Complete(req, n) =
            parse_request(b"GET /?work_ms=5 HTTP/1.1\r\nHost: x\r\n\r\nrest")
        else {
            panic!("should parse");
        };
        assert_eq!(n, 37);
        assert_eq!(req.path, "/");
        assert_eq!(req.query.as_deref(), Some("work_ms=5"));
        assert!(req.keep_alive);
    }

    #[test]
    fn http10_and_connection_close_do_not_keep_alive() {
        let Parsed::Complete(req, _) = parse_request(b"GET / HTTP/1.0\r\n\r\n") else {
            panic!()
        };
        assert!(!req.keep_alive);
        let Parsed::Complete(req, _) =
            parse_request(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        else {
            panic!()
        };
        assert!(!req.keep_alive);
    }

    #[test]
    fn partial_and_refused_heads() {
        assert_eq!(parse_request(b"GET / HTTP/1.1\r\nHo"), Parsed::Partial);
        let status = |head: &[u8]| match parse_request(head) {
            Parsed::Refused(r) => r.status,
            other => panic!("{other:?}"),
        };
        assert_eq!(status(b"\x00\x01garbage\r\n\r\n"), 400);
        assert_eq!(
            status(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: x\r\n\r\n"),
            400
        );
        assert_eq!(
            status(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"),
            400
        );
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
            501
        );
        assert_eq!(status(b"GET / HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(status(b"GET / HTTP/1.1\nHost: x\n\n"), 400);
    }

    #[test]
    fn query_values() {
        assert_eq!(query_value(Some("a=1&work_ms=20"), "work_ms"), Some("20"));
        assert_eq!(query_value(Some("a=1"), "work_ms"), None);
        assert_eq!(query_value(None, "work_ms"), None);
    }
}
