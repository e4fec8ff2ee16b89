//! The demo's request parser: `httparse` reads the head, and the checks of
//! docs/http.md that `httparse` leaves to its caller (or is lenient about)
//! come after it: bare LF line ends, the limits (414, 431), Host, the
//! target's forms, versions 1.2 to 1.9, Content-Length lists,
//! Transfer-Encoding order, and the chunked body's grammar.

/// The longest request line, and the longest field line (without CRLF).
pub const MAX_LINE: usize = 8190;
/// The most field lines in a head (and trailer lines after a chunked body).
pub const MAX_FIELDS: usize = 100;
/// The largest head; a larger one is answered 431.
pub const MAX_HEAD: usize = 65536;
/// Empty lines allowed before the request line (RFC 9112 section 2.2).
const MAX_EMPTY_LINES: usize = 8;
/// The longest chunk-size line (or trailer line) of a chunked body.
const MAX_CHUNK_LINE: usize = 4096;
/// Heads with up to this many fields are parsed without a second try.
const COMMON_FIELDS: usize = 32;

/// A request refused: the status to answer and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// The status code.
    pub status: u16,
    /// The reason, for the response's body.
    pub why: &'static str,
}

const fn refuse(status: u16, why: &'static str) -> Refusal {
    Refusal { status, why }
}

/// How the body of a request is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    None,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// A parsed request head: just what the demo needs.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    /// The request method.
    pub method: String,
    /// The path, still percent-encoded, without query or fragment.
    pub path: String,
    /// The raw query string, if any (without the fragment).
    pub query: Option<String>,
    /// Whether the connection stays open after the response.
    pub keep_alive: bool,
    /// How the body is delimited.
    pub framing: Framing,
    /// Whether the client waits for `100 Continue` before its body.
    pub expects_continue: bool,
}

/// The outcome of parsing a buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A full head of this many bytes.
    Complete(Request, usize),
    /// More bytes needed.
    Partial,
    /// A request to refuse.
    Refused(Refusal),
}

/// Parses one request head at the start of `buf`.
pub fn parse_request(buf: &[u8]) -> Parsed {
    parse_head(buf, &mut |_, _| {}).0
}

/// Parses one request head, telling `field` each header (name, value);
/// also returns the authority of an absolute-form
/// target, which replaces the Host the app sees.
#[inline]
fn parse_head<'b>(buf: &'b [u8], field: &mut dyn FnMut(&str, &[u8])) -> (Parsed, Option<&'b str>) {
    let mut headers = [httparse::EMPTY_HEADER; COMMON_FIELDS];
    match parse_with(buf, &mut headers, field) {
        Err(httparse::Error::TooManyHeaders) => {
            let mut headers = [httparse::EMPTY_HEADER; MAX_FIELDS];
            match parse_with(buf, &mut headers, field) {
                Err(httparse::Error::TooManyHeaders) => (
                    Parsed::Refused(refuse(431, "more than 100 header fields")),
                    None,
                ),
                other => settle(buf, other, field),
            }
        }
        other => settle(buf, other, field),
    }
}

type HeadResult<'b> = Result<(Parsed, Option<&'b str>), httparse::Error>;

#[inline]
fn settle<'b>(
    buf: &'b [u8],
    result: HeadResult<'b>,
    field: &mut dyn FnMut(&str, &[u8]),
) -> (Parsed, Option<&'b str>) {
    match result {
        Ok(done) => done,
        Err(httparse::Error::Version) => (version_problem(buf, field), None),
        Err(httparse::Error::Token) => (Parsed::Refused(refuse(400, "malformed method")), None),
        Err(httparse::Error::HeaderName) => (
            Parsed::Refused(refuse(
                400,
                "malformed header name (or whitespace before its colon, or a folded line)",
            )),
            None,
        ),
        Err(httparse::Error::HeaderValue) => (
            Parsed::Refused(refuse(400, "control character in a header value")),
            None,
        ),
        Err(_) => (Parsed::Refused(refuse(400, "malformed request head")), None),
    }
}

#[inline]
fn parse_with<'b>(
    buf: &'b [u8],
    headers: &mut [httparse::Header<'b>],
    field: &mut dyn FnMut(&str, &[u8]),
) -> HeadResult<'b> {
    let mut req = httparse::Request::new(headers);
    let head_len = match req.parse(buf)? {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => return Ok((partial_problem(buf), None)),
    };
    Ok(match check_head(buf, head_len, &req, field) {
        Ok((request, authority)) => (Parsed::Complete(request, head_len), authority),
        Err(refusal) => (Parsed::Refused(refusal), None),
    })
}

/// Where the request line starts: after up to MAX_EMPTY_LINES CRLFs.
#[inline]
fn request_line_start(buf: &[u8]) -> Result<usize, Refusal> {
    let mut at = 0;
    while buf[at..].starts_with(b"\r\n") {
        at += 2;
    }
    if at > 2 * MAX_EMPTY_LINES {
        return Err(refuse(
            400,
            "more than 8 empty lines before the request line",
        ));
    }
    Ok(at)
}

/// An incomplete head that already breaks a limit.
fn partial_problem(buf: &[u8]) -> Parsed {
    let Ok(start) = request_line_start(buf) else {
        return Parsed::Refused(refuse(400, "too many empty lines"));
    };
    let line_end = buf[start..].iter().position(|&b| b == b'\n');
    if line_end.unwrap_or(buf.len() - start) > MAX_LINE + 1 {
        return Parsed::Refused(refuse(414, "request line over 8190 bytes"));
    }
    if buf.len() > MAX_HEAD {
        return Parsed::Refused(refuse(431, "request head over 65536 bytes"));
    }
    Parsed::Partial
}

/// httparse knows HTTP/1.0 and 1.1 only: a later 1.x is served as 1.1
/// (RFC 9110 section 2.5), another major version is 505, the rest 400.
fn version_problem(buf: &[u8], field: &mut dyn FnMut(&str, &[u8])) -> Parsed {
    let start = request_line_start(buf).unwrap_or(0);
    let line_end = buf[start..]
        .iter()
        .position(|&b| b == b'\r' || b == b'\n')
        .map_or(buf.len(), |p| start + p);
    let line = &buf[start..line_end];
    let version_at = line.iter().rposition(|&b| b == b' ').map_or(0, |p| p + 1);
    let parts = line.split(|&b| b == b' ');
    let well_formed = parts.clone().count() == 3 && parts.clone().all(|p| !p.is_empty());
    match &line[version_at..] {
        _ if line.len() > MAX_LINE => Parsed::Refused(refuse(414, "request line over 8190 bytes")),
        _ if !well_formed => Parsed::Refused(refuse(400, "malformed request line")),
        [b'H', b'T', b'T', b'P', b'/', b'1', b'.', b'2'..=b'9'] => {
            let mut copy = buf.to_vec();
            copy[start + version_at + 7] = b'1';
            match parse_head(&copy, field).0 {
                Parsed::Complete(request, n) => Parsed::Complete(request, n),
                other => other,
            }
        }
        [b'H', b'T', b'T', b'P', b'/', major, b'.', minor]
            if major.is_ascii_digit() && minor.is_ascii_digit() =>
        {
            Parsed::Refused(refuse(505, "HTTP version not supported"))
        }
        _ => Parsed::Refused(refuse(400, "malformed request line")),
    }
}

/// The checks httparse leaves to its caller, on a complete head.
#[inline]
fn check_head<'b>(
    buf: &'b [u8],
    head_len: usize,
    req: &httparse::Request<'_, 'b>,
    field: &mut dyn FnMut(&str, &[u8]),
) -> Result<(Request, Option<&'b str>), Refusal> {
    let head = &buf[..head_len];
    let start = request_line_start(head)?;
    let method = req.method.unwrap_or("");
    let target = req.path.unwrap_or("");
    // httparse takes a bare LF for a line end (and skips leading empty
    // lines that are bare LFs); docs/http.md does not. A field value
    // holds no CR or LF, so each line ends just before the next line
    // starts: the request line where the first field's name starts, each
    // field where the next one's starts, the last line before the final
    // CRLF. Checking those ends is a few compares, not a scan.
    let offset = |s: &str| s.as_ptr() as usize - buf.as_ptr() as usize;
    let line_starts = req.headers.iter().map(|h| offset(h.name));
    let crlf_before = |at: usize| at >= 2 && &head[at - 2..at] == b"\r\n";
    if offset(method) != start
        || !line_starts.clone().all(crlf_before)
        || !crlf_before(head_len)
        || !crlf_before(head_len - 2)
    {
        return Err(refuse(400, "a line of the head does not end in CRLF"));
    }
    let line_end = line_starts.clone().next().unwrap_or(head_len - 2) - 2;
    if line_end - start > MAX_LINE {
        return Err(refuse(414, "request line over 8190 bytes"));
    }
    if head_len > MAX_HEAD {
        return Err(refuse(431, "request head over 65536 bytes"));
    }
    // httparse lets bytes above 0x7F into the target.
    if !target.is_ascii() {
        return Err(refuse(400, "request target with non-ASCII bytes"));
    }
    let (path, query, authority) = split_target(method, target)?;
    let minor = req.version.unwrap_or(1);
    let mut host = None;
    let mut hosts = 0;
    let mut length: Option<u64> = None;
    let mut te: Option<(bool, bool)> = None; // (ends in chunked, is exactly chunked)
    let mut te_lines = 0;
    let mut close = false;
    let mut keep = false;
    let mut expects_continue = false;
    for h in req.headers.iter() {
        let line = h.value.as_ptr() as usize + h.value.len() - h.name.as_ptr() as usize;
        if line > MAX_LINE {
            return Err(refuse(431, "a header field over 8190 bytes"));
        }
        let name = h.name;
        // The names looked at, told apart by length first: most fields
        // are none of them and cost one compare.
        let is = |wanted: &str| name.len() == wanted.len() && name.eq_ignore_ascii_case(wanted);
        if is("host") {
            hosts += 1;
            host = Some(h.value);
        } else if is("content-length") {
            for item in h.value.split(|&b| b == b',') {
                let n = content_length(trim(item))?;
                if length.is_some_and(|l| l != n) {
                    return Err(refuse(400, "differing Content-Length values"));
                }
                length = Some(n);
            }
        } else if is("transfer-encoding") {
            te_lines += 1;
            te = Some(transfer_coding(h.value, te, te_lines)?);
        } else if is("connection") {
            for option in h.value.split(|&b| b == b',').map(trim) {
                close |= option.eq_ignore_ascii_case(b"close");
                keep |= option.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if is("expect") {
            if !trim(h.value).eq_ignore_ascii_case(b"100-continue") {
                return Err(refuse(417, "unsupported expectation"));
            }
            expects_continue = minor == 1;
        }
        field(name, h.value);
    }
    if hosts > 1 {
        return Err(refuse(400, "more than one Host header"));
    }
    match host {
        None if minor == 1 => return Err(refuse(400, "an HTTP/1.1 request without Host")),
        Some(value) if !valid_host(value) => return Err(refuse(400, "malformed Host header")),
        _ => {}
    }
    let framing = match (te, length) {
        (Some(_), Some(_)) => return Err(refuse(400, "both Transfer-Encoding and Content-Length")),
        (Some(_), None) if minor == 0 => {
            return Err(refuse(400, "Transfer-Encoding in an HTTP/1.0 request"))
        }
        (Some((false, _)), None) => {
            return Err(refuse(400, "Transfer-Encoding does not end in chunked"))
        }
        (Some((true, false)), None) => {
            return Err(refuse(
                501,
                "transfer codings other than chunked are not supported",
            ))
        }
        (Some((true, true)), None) => Framing::Chunked,
        (None, Some(n)) => Framing::Length(n),
        (None, None) => Framing::None,
    };
    let keep_alive = if minor == 1 { !close } else { keep && !close };
    let request = Request {
        method: method.to_string(),
        path: path.to_string(),
        query: query.map(str::to_string),
        keep_alive,
        framing,
        expects_continue: expects_continue && framing != Framing::None,
    };
    Ok((request, authority))
}

/// The path, query and (absolute-form) authority of a target.
#[inline]
fn split_target<'t>(
    method: &str,
    target: &'t str,
) -> Result<(&'t str, Option<&'t str>, Option<&'t str>), Refusal> {
    let target = target.split_once('#').map_or(target, |(t, _)| t);
    let (origin, authority) = if target.starts_with('/') {
        (target, None)
    } else if target == "*" {
        if method != "OPTIONS" {
            return Err(refuse(400, "the target * is only for OPTIONS"));
        }
        return Ok(("*", None, None));
    } else if method == "CONNECT" {
        return Err(refuse(501, "CONNECT is not served"));
    } else if let Some(rest) = strip_scheme(target) {
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let authority = &rest[..end];
        if authority.is_empty() || authority.contains('@') || !valid_host(authority.as_bytes()) {
            return Err(refuse(400, "absolute-form target without a valid host"));
        }
        (&rest[end..], Some(authority))
    } else {
        return Err(refuse(
            400,
            "the target is neither a path nor an absolute URI",
        ));
    };
    let (path, query) = match origin.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (origin, None),
    };
    let path = if path.is_empty() { "/" } else { path };
    if !path.contains('%') {
        return Ok((path, query, authority));
    }
    let bytes = path.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'%'
            && !(bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
        {
            return Err(refuse(
                400,
                "a % in the path not followed by two hex digits",
            ));
        }
    }
    Ok((path, query, authority))
}

fn strip_scheme(target: &str) -> Option<&str> {
    let (scheme, rest) = target.split_once("://")?;
    (scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")).then_some(rest)
}

/// `uri-host [":" port]`: a reg-name (no comma) or a bracketed IP literal.
#[inline]
fn valid_host(value: &[u8]) -> bool {
    let (host, port) = if value.first() == Some(&b'[') {
        match value.iter().position(|&b| b == b']') {
            Some(end) => {
                let literal = &value[1..end];
                if !literal
                    .iter()
                    .all(|&b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
                {
                    return false;
                }
                (&value[..0], &value[end + 1..])
            }
            None => return false,
        }
    } else {
        let colon = value.iter().position(|&b| b == b':').unwrap_or(value.len());
        (&value[..colon], &value[colon..])
    };
    let reg_name = host.iter().all(|&b| REG_NAME[usize::from(b)]);
    let port_ok = match port {
        [] => true,
        [b':', digits @ ..] => digits.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    reg_name && port_ok
}

/// The bytes of a reg-name (RFC 3986 section 3.2.2) but the comma, which
/// would make a Host a list.
const REG_NAME: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'%'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b';'
                    | b'='
            );
        b += 1;
    }
    table
};

/// One member of a Content-Length list: 1 to 18 digits.
fn content_length(item: &[u8]) -> Result<u64, Refusal> {
    if item.is_empty() || item.len() > 18 || !item.iter().all(u8::is_ascii_digit) {
        return Err(refuse(400, "malformed Content-Length"));
    }
    Ok(item.iter().fold(0, |n, &d| n * 10 + u64::from(d - b'0')))
}

/// Folds one Transfer-Encoding line into what the lines before said:
/// (ends in chunked, is exactly one chunked). Chunked anywhere but last,
/// chunked twice, and malformed members are refused here.
fn transfer_coding(
    value: &[u8],
    before: Option<(bool, bool)>,
    lines: usize,
) -> Result<(bool, bool), Refusal> {
    let (mut last_chunked, mut only_chunked) = before.map_or((false, true), |(l, _)| (l, false));
    for (members, item) in value.split(|&b| b == b',').map(trim).enumerate() {
        if item.is_empty() || !item.iter().all(|&b| is_token(b)) {
            return Err(refuse(400, "malformed Transfer-Encoding"));
        }
        if last_chunked {
            return Err(refuse(400, "chunked is not the last transfer coding"));
        }
        last_chunked = item.eq_ignore_ascii_case(b"chunked");
        only_chunked &= last_chunked && members == 0 && lines == 1;
    }
    Ok((last_chunked, only_chunked))
}

fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn trim(bytes: &[u8]) -> &[u8] {
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    let start = bytes.iter().position(|b| !blank(b)).unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !blank(b))
        .map_or(start, |p| p + 1);
    &bytes[start..end]
}

/// Reads a chunked body at the start of `buf`, giving each piece of data
/// to `data`: the bytes it took (the last chunk and the trailers
/// included) once it is complete, None while it is not. More than
/// `max_body` bytes of data is 413. Trailers are checked and dropped.
pub fn chunked_body(
    buf: &[u8],
    max_body: u64,
    data: &mut dyn FnMut(&[u8]),
) -> Result<Option<usize>, Refusal> {
    let mut at = 0;
    let mut total = 0u64;
    loop {
        let Some(line) = chunk_line(&buf[at..])? else {
            return Ok(None);
        };
        let size = chunk_size(line)?;
        at += line.len() + 2;
        if size == 0 {
            return trailers(buf, at);
        }
        total += size;
        if total > max_body {
            return Err(refuse(413, "chunked body over the limit"));
        }
        let size = size as usize; // at most max_body
        if buf.len() < at + size + 2 {
            return Ok(None);
        }
        data(&buf[at..at + size]);
        if &buf[at + size..at + size + 2] != b"\r\n" {
            return Err(refuse(400, "chunk data longer than its size"));
        }
        at += size + 2;
    }
}

/// The next line of chunk framing (without CRLF), None if incomplete.
fn chunk_line(buf: &[u8]) -> Result<Option<&[u8]>, Refusal> {
    let Some(end) = buf
        .iter()
        .take(MAX_CHUNK_LINE + 2)
        .position(|&b| b == b'\n')
    else {
        if buf.len() > MAX_CHUNK_LINE {
            return Err(refuse(400, "chunk framing line too long"));
        }
        return Ok(None);
    };
    let line = &buf[..end];
    match line.split_last() {
        Some((b'\r', line)) if !line.contains(&b'\r') => Ok(Some(line)),
        _ => Err(refuse(400, "a chunk line does not end in CRLF")),
    }
}

/// The size of a chunk-size line; its extensions checked by the grammar
/// `*( BWS ";" BWS token [ BWS "=" BWS ( token / quoted-string ) ] )`.
fn chunk_size(line: &[u8]) -> Result<u64, Refusal> {
    let bad = || refuse(400, "malformed chunk size");
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 16 {
        return Err(bad());
    }
    let hex = std::str::from_utf8(&line[..digits]).map_err(|_| bad())?;
    let size = u64::from_str_radix(hex, 16).map_err(|_| bad())?;
    if size > i64::MAX as u64 {
        return Err(bad());
    }
    let mut rest = &line[digits..];
    let blanks = |s: &[u8]| s.iter().take_while(|&&b| b == b' ' || b == b'\t').count();
    let token = |s: &[u8]| s.iter().take_while(|&&b| is_token(b)).count();
    while !rest.is_empty() {
        rest = &rest[blanks(rest)..];
        rest = rest.strip_prefix(b";").ok_or_else(bad)?;
        rest = &rest[blanks(rest)..];
        let name = token(rest);
        if name == 0 {
            return Err(bad());
        }
        rest = &rest[name..];
        let after = &rest[blanks(rest)..];
        if let Some(value) = after.strip_prefix(b"=") {
            let value = &value[blanks(value)..];
            let len = if value.first() == Some(&b'"') {
                quoted_len(value).ok_or_else(bad)?
            } else {
                token(value)
            };
            if len == 0 {
                return Err(bad());
            }
            rest = &value[len..];
        }
    }
    Ok(size)
}

/// The length of the quoted-string at the start of `s`, if it is one.
fn quoted_len(s: &[u8]) -> Option<usize> {
    let mut i = 1;
    while i < s.len() {
        match s[i] {
            b'"' => return Some(i + 1),
            b'\\' => {
                let next = *s.get(i + 1)?;
                if next != b'\t' && !(0x20..=0x7e).contains(&next) && next < 0x80 {
                    return None;
                }
                i += 2;
            }
            b'\t' | 0x20..=0x7e | 0x80..=0xff => i += 1,
            _ => return None,
        }
    }
    None
}

/// The trailer section from `at`: field lines, then an empty line.
fn trailers(buf: &[u8], mut at: usize) -> Result<Option<usize>, Refusal> {
    let mut lines = 0;
    loop {
        let Some(line) = chunk_line(&buf[at..])? else {
            return Ok(None);
        };
        at += line.len() + 2;
        if line.is_empty() {
            return Ok(Some(at));
        }
        lines += 1;
        if lines > MAX_FIELDS {
            return Err(refuse(431, "more than 100 trailer fields"));
        }
        let name = line.iter().take_while(|&&b| is_token(b)).count();
        let value_ok = line[name + 1.min(line.len() - name)..]
            .iter()
            .all(|&b| b == b'\t' || b >= 0x20 && b != 0x7f);
        if name == 0 || line.get(name) != Some(&b':') || !value_ok {
            return Err(refuse(400, "malformed trailer field line"));
        }
    }
}

/// What an app would see of one request: the corpus test
/// (tests/demo_http_corpus.rs) compares it with the expected outcome.
#[derive(Debug, PartialEq, Eq)]
pub struct Seen {
    /// The method.
    pub method: String,
    /// The percent-decoded path, each byte one character (Latin-1).
    pub path: String,
    /// The raw query string ("" if none).
    pub query: String,
    /// The headers that reach the app: lower-case names, values trimmed,
    /// repeats joined with ", ", Content-Length normalised, Host from an
    /// absolute-form target.
    pub headers: Vec<(String, String)>,
    /// The decoded body, each byte one character (Latin-1).
    pub body: String,
    /// Whether the connection stays open after the response.
    pub keep_alive: bool,
}

/// Parses one whole request (head and body) at the start of `buf` as the
/// demo's server does: what the app would see and the bytes it took,
/// None if the request is incomplete, or the refusal.
pub fn parse_message(buf: &[u8]) -> Result<Option<(Seen, usize)>, Refusal> {
    let mut headers: Vec<(String, String)> = Vec::new();
    let mut field = |name: &str, value: &[u8]| {
        if name.contains('_') {
            return; // dropped: HTTP_X_Y could not tell it from X-Y (http.md)
        }
        let name = name.to_ascii_lowercase();
        let value = latin1(trim(value));
        match headers.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => {
                v.push_str(", ");
                v.push_str(&value);
            }
            None => headers.push((name, value)),
        }
    };
    let (parsed, authority) = parse_head(buf, &mut field);
    let (request, head_len) = match parsed {
        Parsed::Complete(request, n) => (request, n),
        Parsed::Partial => return Ok(None),
        Parsed::Refused(refusal) => return Err(refusal),
    };
    let (body, used) = match request.framing {
        Framing::None => (Vec::new(), 0),
        Framing::Length(n) => match buf.len() - head_len {
            have if (have as u64) < n => return Ok(None),
            _ => (buf[head_len..head_len + n as usize].to_vec(), n as usize),
        },
        Framing::Chunked => {
            let mut body = Vec::new();
            match chunked_body(&buf[head_len..], u64::MAX >> 1, &mut |d| {
                body.extend_from_slice(d)
            })? {
                Some(used) => (body, used),
                None => return Ok(None),
            }
        }
    };
    for (name, value) in headers.iter_mut() {
        match (name.as_str(), request.framing, authority) {
            ("content-length", Framing::Length(n), _) => *value = n.to_string(),
            ("host", _, Some(authority)) => *value = authority.to_string(),
            _ => {}
        }
    }
    let seen = Seen {
        method: request.method,
        path: percent_decoded(&request.path),
        query: request.query.unwrap_or_default(),
        headers,
        body: latin1(&body),
        keep_alive: request.keep_alive,
    };
    Ok(Some((seen, head_len + used)))
}

fn latin1(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| char::from(b)).collect()
}

fn percent_decoded(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).and_then(|&b| hex(b)),
            bytes.get(i + 2).and_then(|&b| hex(b)),
        ) {
            (b'%', Some(hi), Some(lo)) => {
                out.push(char::from((hi * 16 + lo) as u8));
                i += 3;
            }
            (b, _, _) => {
                out.push(char::from(b));
                i += 1;
            }
        }
    }
    out
}
