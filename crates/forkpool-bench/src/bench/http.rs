//! Just enough HTTP/1.1 for a load generator: one request line out, one
//! response framed back in.
//!
//! Framing is what makes keep-alive work: a response ends after its headers
//! plus `Content-Length` bytes, and the next one starts right after. Chunked
//! bodies and bodies that run until the connection closes are refused as
//! malformed; the servers we measure (forkpool's demo, Apache serving a
//! static file, nginx's `return`) all send a length.

use super::target::Target;

/// The bytes of a `GET` for `target`, asking the server to close the
/// connection after answering unless `keep_alive`.
pub fn request(target: &Target, keep_alive: bool) -> Vec<u8> {
    let connection = if keep_alive {
        ""
    } else {
        "Connection: close\r\n"
    };
    format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\n{connection}\r\n",
        target.path, target.host
    )
    .into_bytes()
}

/// One complete response at the start of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Bytes the response takes in the buffer, headers and body.
    pub len: usize,
    /// Whether the server lets the connection carry another request.
    pub keep_alive: bool,
    /// The `X-Forkpool-Slot` header, when the server sent one.
    pub slot: Option<u32>,
}

/// Headers beyond this many make a response malformed.
const MAX_HEADERS: usize = 32;

/// Reads the response at the start of `buf`: `Ok(None)` while it is still
/// incomplete, an error when it can never become a valid response.
pub fn parse_response(buf: &[u8]) -> Result<Option<Response>, String> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut headers);
    let head_len = match parsed.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("bad response head: {e}")),
    };
    let status = parsed.code.unwrap_or_default();
    let mut keep_alive = parsed.version == Some(1);
    let mut content_length = None;
    let mut slot = None;
    for header in parsed.headers.iter() {
        let value = std::str::from_utf8(header.value)
            .map_err(|_| format!("header {} is not text", header.name))?
            .trim();
        if header.name.eq_ignore_ascii_case("content-length") {
            let n: usize = value
                .parse()
                .map_err(|_| format!("bad Content-Length '{value}'"))?;
            if content_length.is_some_and(|m| m != n) {
                return Err("two different Content-Length headers".to_string());
            }
            content_length = Some(n);
        } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(format!("Transfer-Encoding '{value}' is not supported"));
        } else if header.name.eq_ignore_ascii_case("connection") {
            for token in value.split(',').map(str::trim) {
                if token.eq_ignore_ascii_case("close") {
                    keep_alive = false;
                } else if token.eq_ignore_ascii_case("keep-alive") {
                    keep_alive = true;
                }
            }
        } else if header.name.eq_ignore_ascii_case("x-forkpool-slot") {
            slot = value.parse().ok();
        }
    }
    let body_len = match (status, content_length) {
        (100..=199 | 204 | 304, _) => 0,
        (_, Some(n)) => n,
        (_, None) => return Err(format!("status {status} response without Content-Length")),
    };
    let len = head_len + body_len;
    if buf.len() < len {
        return Ok(None);
    }
    Ok(Some(Response {
        status,
        len,
        keep_alive,
        slot,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELLO: &[u8] =
        b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nX-Forkpool-Slot: 3\r\nX-Forkpool-Pid: 77\r\n\r\nhello\n";

    #[test]
    fn request_bytes() {
        let t = Target::parse("http://127.0.0.1:8080/?work_ms=1").unwrap();
        assert_eq!(
            request(&t, true),
            b"GET /?work_ms=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n"
        );
        assert_eq!(
            request(&t, false),
            b"GET /?work_ms=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn one_complete_response() {
        let r = parse_response(HELLO).unwrap().unwrap();
        assert_eq!(
            r,
            Response {
                status: 200,
                len: HELLO.len(),
                keep_alive: true,
                slot: Some(3)
            }
        );
    }

    #[test]
    fn keep_alive_framing_stops_at_the_body_end() {
        let mut two = HELLO.to_vec();
        two.extend_from_slice(
            b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
        let first = parse_response(&two).unwrap().unwrap();
        assert_eq!(first.len, HELLO.len());
        let second = parse_response(&two[first.len..]).unwrap().unwrap();
        assert_eq!(second.status, 503);
        assert!(!second.keep_alive);
        assert_eq!(first.len + second.len, two.len());
    }

    #[test]
    fn truncated_responses_are_incomplete_at_every_cut() {
        for cut in 0..HELLO.len() {
            assert_eq!(parse_response(&HELLO[..cut]), Ok(None), "cut at {cut}");
        }
    }

    #[test]
    fn connection_semantics_by_version() {
        let old = b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n";
        assert!(!parse_response(old).unwrap().unwrap().keep_alive);
        let old_ka = b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n";
        assert!(parse_response(old_ka).unwrap().unwrap().keep_alive);
        let no_body = b"HTTP/1.1 204 No Content\r\n\r\n";
        assert_eq!(parse_response(no_body).unwrap().unwrap().len, no_body.len());
    }

    #[test]
    fn malformed_responses() {
        for bad in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\n\r\nhello\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"SMTP ready\r\n\r\n",
        ] {
            assert!(
                parse_response(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
