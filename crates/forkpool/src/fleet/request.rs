//! The request head of a health probe: method and path, with limits.
//!
//! Probes come from balancers and orchestrators, but the metrics address
//! may be reachable by anyone: the head is bounded in size and header
//! count, and anything that is not an HTTP/1.x request is refused with a
//! reason.

use std::fmt;

/// The most bytes a request head may take, up to and including the blank
/// line that ends it.
pub const MAX_HEAD: usize = 4096;

/// The most header lines a request head may carry.
pub const MAX_HEADERS: usize = 32;

/// The request method, as far as the health endpoints care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `GET`: status and body.
    Get,
    /// `HEAD`: status only.
    Head,
    /// Anything else: answered `405 Method Not Allowed`.
    Other,
}

/// Which endpoint a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `/live`: is the supervisor's loop turning.
    Live,
    /// `/ready`: should the balancer send work.
    Ready,
    /// Any other path: not a health endpoint (the metrics answer it).
    Other,
}

/// A parsed request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// The method.
    pub method: Method,
    /// The path, without its query string.
    pub path: String,
}

impl RequestHead {
    /// The endpoint this request is for.
    pub fn route(&self) -> Route {
        match self.path.as_str() {
            "/live" => Route::Live,
            "/ready" => Route::Ready,
            _ => Route::Other,
        }
    }
}

/// Why a request head was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadError {
    /// Longer than [`MAX_HEAD`] bytes without an end.
    TooLarge,
    /// More than [`MAX_HEADERS`] header lines.
    TooManyHeaders,
    /// Not an HTTP/1.x request head.
    Malformed(String),
}

impl fmt::Display for HeadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeadError::TooLarge => write!(
                f,
                "request head longer than {MAX_HEAD} bytes; a probe needs only \
                 `GET /ready HTTP/1.1` and a few headers"
            ),
            HeadError::TooManyHeaders => write!(
                f,
                "more than {MAX_HEADERS} header lines; send a plain probe request"
            ),
            HeadError::Malformed(why) => write!(
                f,
                "not an HTTP/1.x request ({why}); probe with e.g. `GET /ready HTTP/1.1`"
            ),
        }
    }
}

impl std::error::Error for HeadError {}

/// Parses the bytes received so far: `Ok(None)` while the head is still
/// incomplete (read more), the head once the blank line has arrived, or
/// why it can never be a valid one.
pub fn parse_head(buf: &[u8]) -> Result<Option<RequestHead>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(buf) {
        Ok(httparse::Status::Complete(len)) if len > MAX_HEAD => Err(HeadError::TooLarge),
        Ok(httparse::Status::Complete(_)) => {
            let method = match request.method {
                Some("GET") => Method::Get,
                Some("HEAD") => Method::Head,
                _ => Method::Other,
            };
            let target = request.path.unwrap_or("/");
            let path = target.split(['?', '#']).next().unwrap_or(target);
            Ok(Some(RequestHead {
                method,
                path: path.to_string(),
            }))
        }
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => Err(HeadError::TooLarge),
        Ok(httparse::Status::Partial) => Ok(None),
        Err(httparse::Error::TooManyHeaders) => Err(HeadError::TooManyHeaders),
        Err(e) => Err(HeadError::Malformed(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &str) -> RequestHead {
        parse_head(raw.as_bytes()).unwrap().unwrap()
    }

    #[test]
    fn reads_method_and_path() {
        let h = head("GET /ready HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(h.method, Method::Get);
        assert_eq!(h.route(), Route::Ready);
        let h = head("HEAD /live HTTP/1.0\r\n\r\n");
        assert_eq!(h.method, Method::Head);
        assert_eq!(h.route(), Route::Live);
    }

    #[test]
    fn other_methods_and_paths() {
        let h = head("POST /ready HTTP/1.1\r\n\r\n");
        assert_eq!(h.method, Method::Other);
        assert_eq!(head("GET /metrics HTTP/1.1\r\n\r\n").route(), Route::Other);
        assert_eq!(head("GET /readyz HTTP/1.1\r\n\r\n").route(), Route::Other);
        assert_eq!(head("GET / HTTP/1.1\r\n\r\n").route(), Route::Other);
    }

    #[test]
    fn the_query_string_is_not_part_of_the_path() {
        assert_eq!(
            head("GET /ready?x=1 HTTP/1.1\r\n\r\n").route(),
            Route::Ready
        );
    }

    #[test]
    fn an_incomplete_head_asks_for_more() {
        assert_eq!(parse_head(b"GET /rea").unwrap(), None);
        assert_eq!(
            parse_head(b"GET /ready HTTP/1.1\r\nHost: x\r\n").unwrap(),
            None
        );
        assert_eq!(parse_head(b"").unwrap(), None);
    }

    #[test]
    fn a_dripping_client_hits_the_size_limit() {
        let mut raw = b"GET /ready HTTP/1.1\r\n".to_vec();
        while raw.len() < MAX_HEAD {
            raw.extend_from_slice(b"X-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
        }
        let err = parse_head(&raw).unwrap_err();
        assert!(matches!(
            err,
            HeadError::TooLarge | HeadError::TooManyHeaders
        ));
        let mut long = b"GET /".to_vec();
        long.resize(MAX_HEAD + 10, b'a');
        assert_eq!(parse_head(&long).unwrap_err(), HeadError::TooLarge);
    }

    #[test]
    fn a_complete_head_over_the_limit_is_refused() {
        let raw = format!("GET /ready HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_HEAD));
        assert_eq!(parse_head(raw.as_bytes()).unwrap_err(), HeadError::TooLarge);
    }

    #[test]
    fn too_many_headers_are_refused() {
        let mut raw = String::from("GET /ready HTTP/1.1\r\n");
        for i in 0..=MAX_HEADERS {
            raw.push_str(&format!("X-{i}: 1\r\n"));
        }
        raw.push_str("\r\n");
        assert_eq!(
            parse_head(raw.as_bytes()).unwrap_err(),
            HeadError::TooManyHeaders
        );
    }

    #[test]
    fn garbage_is_malformed_with_a_hint() {
        let err = parse_head(b"\x16\x03\x01\x02\x00\x01\x00\r\n\r\n").unwrap_err();
        assert!(matches!(err, HeadError::Malformed(_)), "{err:?}");
        assert!(err.to_string().contains("GET /ready HTTP/1.1"));
        assert!(matches!(
            parse_head(b"GET /ready HTTP/2.0\r\n\r\n").unwrap_err(),
            HeadError::Malformed(_)
        ));
    }
}
