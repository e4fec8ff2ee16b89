"""HTTP/1.1 for forkpool's Python workers: reading requests, framing responses.

Standard library only. Every function here works on bytes or on a
`Reader` (a buffered socket with deadlines), so each piece can be tested
without a server. `forkpool_wsgi` and `example_http_worker.py` use it.

It implements the rule set every forkpool server shares, docs/http.md
(strict RFC 9110/9112, proven by the corpus in tests/http-corpus). In short:

- a request head that does not arrive whole within `Limits.head_timeout`
  seconds (a client dripping bytes): 408; a body that does not arrive whole
  within `Limits.body_timeout` seconds of the app's first read: 408;
- a request line longer than `Limits.max_request_line`: 414; a field line
  longer than `Limits.max_field_line`, a head longer than `Limits.max_head`
  or with more than `Limits.max_headers` fields: 431;
- a body larger than `Limits.max_body`: 413;
- anything malformed or ambiguous (a bare CR or LF, NUL, obs-fold, space
  before a colon, a target that is not origin-, absolute- or asterisk-form,
  no or several `Host`, differing `Content-Length`s, Content-Length with
  Transfer-Encoding, Transfer-Encoding on HTTP/1.0 or without chunked last,
  a bad chunk line or trailer): 400; a transfer coding other than chunked:
  501; CONNECT: 501; an HTTP version other than 1.x: 505; an `Expect` other
  than `100-continue`: 417.

Bodies are never read whole: `Body` hands out what the app asks for, a
block at a time, with a per-read timeout (`Limits.read_timeout`).
"""

import re
import select
import socket
import time

CRLF = b"\r\n"

REASONS = {
    100: "Continue",
    200: "OK",
    204: "No Content",
    304: "Not Modified",
    400: "Bad Request",
    408: "Request Timeout",
    413: "Content Too Large",
    414: "URI Too Long",
    417: "Expectation Failed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    505: "HTTP Version Not Supported",
}

# Every pattern is used with fullmatch: `$` would also match before a
# final newline.
# RFC 9110 token characters: methods and field names.
_TOKEN_CHARS = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_TOKEN = re.compile(_TOKEN_CHARS)
_VERSION = re.compile(rb"HTTP/([0-9])\.([0-9])")
# A request target: visible ASCII only (other bytes are percent-encoded).
_TARGET = re.compile(rb"[\x21-\x7e]+")
_ABSOLUTE_FORM = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://([^/?]*)(.*)", re.S)
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
# uri-host [":" port]: a reg-name (no comma) or an IP literal.
_HOST = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-._~%!$&'()*+;=]+)(?::[0-9]*)?")
_DIGITS = re.compile(r"[0-9]{1,18}")
# chunk-size [chunk-ext], BWS around ";" and "=" (RFC 9112 7.1.1).
_QUOTED = rb'"(?:[\t \x21\x23-\x5b\x5d-\x7e\x80-\xff]|\\[\t \x21-\x7e\x80-\xff])*"'
_CHUNK_LINE = re.compile(
    rb"([0-9A-Fa-f]{1,16})(?:[ \t]*;[ \t]*%s(?:[ \t]*=[ \t]*(?:%s|%s))?)*"
    % (_TOKEN_CHARS, _TOKEN_CHARS, _QUOTED)
)
# A LF without its CR.
_BARE_LF = re.compile(rb"(?<!\r)\n")
# Field values: visible characters, spaces and tabs, obs-text; no CR, LF, NUL.
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
# Empty lines a server skips before a request line (RFC 9112 2.2).
_MAX_EMPTY_LINES = 8
# A plain request head, checked whole by one pattern: an origin-form
# target, HTTP/1.x, and field lines that `parse_field_line` would take as
# they are (a token, a colon, a value with no control but tab). The head
# of nearly every request matches, and is split with `_PLAIN_FIELD` in one
# pass instead of a call per line; any other head takes the line-by-line
# path (`parse_head_by_lines`), which serves it or names its fault, so both
# accept and refuse exactly the same heads.
_FIELD_VALUE = rb"[\t\x20-\x7e\x80-\xff]*"
_PLAIN_HEAD = re.compile(
    rb"(%s) (/[\x21-\x7e]*) HTTP/1\.([0-9])\r\n((?:%s:%s\r\n)*)\r\n"
    % (_TOKEN_CHARS, _TOKEN_CHARS, _FIELD_VALUE)
)
_PLAIN_FIELD = re.compile(rb"(%s):(%s)\r\n" % (_TOKEN_CHARS, _FIELD_VALUE))
_MAX_CHUNK_LINE = 4096


class HttpError(Exception):
    """A request this server will not serve; `status` is the answer."""

    def __init__(self, status, why):
        super().__init__(why)
        self.status = status
        self.why = why


class ClientGone(Exception):
    """The client closed the connection or stopped answering mid-request."""


class Limits:
    """Every bound the server enforces. Times are in seconds, sizes in bytes."""

    def __init__(
        self,
        head_timeout=10.0,
        keepalive_timeout=5.0,
        keepalive_turn=0.0,
        read_timeout=30.0,
        body_timeout=30.0,
        max_requests=1000,
        max_request_line=8190,
        max_field_line=8190,
        max_head=65536,
        max_headers=100,
        max_body=1 << 30,
    ):
        self.head_timeout = head_timeout
        self.keepalive_timeout = keepalive_timeout
        # How long a kept-alive connection keeps its worker, from its first
        # request, while other connections wait for one (0: it gives way
        # at once; a WSGI request costs far more than a new connection).
        self.keepalive_turn = keepalive_turn
        self.read_timeout = read_timeout
        # The whole body, from the app's first read (a client dripping it).
        self.body_timeout = body_timeout
        self.max_requests = max_requests
        self.max_request_line = max_request_line
        self.max_field_line = max_field_line
        self.max_head = max_head
        self.max_headers = max_headers
        self.max_body = max_body


class Reader:
    """A socket with a read buffer. Every read has a deadline (monotonic
    seconds) or a timeout, so no read blocks for ever."""

    def __init__(self, sock, block=65536):
        self.sock = sock
        self.block = block
        self.buf = b""
        self.eof = False

    def fill(self, deadline):
        """Reads one more block into the buffer before `deadline`; False at
        end of file. Raises TimeoutError once the deadline has passed.

        The read does not wait (MSG_DONTWAIT), and only when nothing has
        come yet does it poll until the deadline: a request that is there
        already costs one system call. (A Python socket timeout costs
        three: setting the blocking mode, a poll, the read.) So the
        socket is kept without a Python timeout here."""
        if self.eof:
            return False
        if self.sock.gettimeout() is not None:
            self.sock.settimeout(None)
        while True:
            try:
                data = self.sock.recv(self.block, socket.MSG_DONTWAIT)
                break
            except BlockingIOError:
                pass
            except (ConnectionResetError, BrokenPipeError) as e:
                raise ClientGone(str(e)) from e
            if not wait_ready(self.sock, select.POLLIN, deadline - time.monotonic()):
                raise TimeoutError("deadline passed")
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def wait_readable(self, timeout):
        """True when a byte (or end of file) is waiting, within `timeout`."""
        if self.buf or self.eof:
            return True
        try:
            return self.fill(time.monotonic() + timeout) or self.eof
        except TimeoutError:
            return False

    def read_head(self, limits, deadline):
        """The request head up to and including the blank line, as bytes, or
        None when the client closed before sending anything. Empty lines
        before it are skipped; a bare LF in it is 400 at once (else the
        server would wait for a CRLF CRLF that never comes)."""
        while True:
            # Nothing read yet (a new connection): read before looking.
            if self.buf:
                start = 0
                while start < 2 * _MAX_EMPTY_LINES and self.buf.startswith(CRLF, start):
                    start += 2
                end = self.buf.find(b"\r\n\r\n", start)
                if _BARE_LF.search(self.buf, start, len(self.buf) if end < 0 else end + 4):
                    raise HttpError(400, "a line of the request head ends with LF alone, not CRLF")
                if end >= 0:
                    head, self.buf = self.buf[start : end + 4], self.buf[end + 4 :]
                    check_head_size(head, limits)
                    return head
                check_head_size(self.buf[start:], limits)
            try:
                more = self.fill(deadline)
            except TimeoutError:
                raise HttpError(408, "the request head did not arrive in time") from None
            if not more:
                if self.buf.strip():
                    raise ClientGone("closed in the middle of a request head")
                return None

    def read_some(self, limit, deadline):
        """Up to `limit` bytes (at least one) from the buffer or the socket;
        b"" at end of file. TimeoutError past `deadline`."""
        if not self.buf and not self.fill(deadline):
            return b""
        data, self.buf = self.buf[:limit], self.buf[limit:]
        return data

    def read_line(self, limit, deadline):
        """One CRLF-terminated line without its CRLF, at most `limit` bytes;
        400 for a line ended by a bare LF or too long. TimeoutError past
        `deadline`."""
        while True:
            end = self.buf.find(b"\n")
            if end >= 0:
                if end == 0 or self.buf[end - 1] != 13:
                    raise HttpError(400, "a chunk or trailer line ends with LF alone, not CRLF")
                if end - 1 > limit:
                    break
                line, self.buf = self.buf[: end - 1], self.buf[end + 1 :]
                return line
            if len(self.buf) > limit + 1:
                break
            if not self.fill(deadline):
                raise ClientGone("closed in the middle of a chunked body")
        raise HttpError(400, "a chunk-size or trailer line is too long")


def wait_ready(sock, events, timeout):
    """True when `sock` has `events` (select.POLLIN, POLLOUT) within
    `timeout` seconds; an error or hang-up counts as ready, so that the
    next call on the socket reports it."""
    if timeout <= 0:
        return False
    poller = select.poll()
    poller.register(sock, events)
    return bool(poller.poll(timeout * 1000))


def send_all(sock, data, timeout):
    """Sends all of `data`, each send without waiting (MSG_DONTWAIT): one
    system call when the socket has room, as it nearly always has. When
    it has none, waits for room for at most `timeout` seconds in all (the
    socket is kept without a Python timeout, as `Reader.fill` keeps it).
    Raises ClientGone when the client has gone or does not read."""
    if sock.gettimeout() is not None:
        sock.settimeout(None)  # see Reader.fill
    try:
        sent = sock.send(data, socket.MSG_DONTWAIT)
    except BlockingIOError:
        sent = 0
    except OSError as e:
        raise ClientGone(str(e)) from e
    if sent == len(data):
        return
    view = memoryview(data)[sent:]
    deadline = None
    while view:
        try:
            view = view[sock.send(view, socket.MSG_DONTWAIT) :]
            continue
        except BlockingIOError:
            pass
        except OSError as e:
            raise ClientGone(str(e)) from e
        if deadline is None:
            deadline = time.monotonic() + timeout
        if not wait_ready(sock, select.POLLOUT, deadline - time.monotonic()):
            raise ClientGone(f"the client did not read for {timeout:g} s")


def check_head_size(head, limits):
    """Raises 414 for an overlong request line, 431 for an overlong head."""
    line_end = head.find(CRLF)
    line_len = len(head) if line_end < 0 else line_end
    if line_len > limits.max_request_line:
        raise HttpError(414, "the request line is too long")
    if len(head) > limits.max_head:
        raise HttpError(431, "the request head is too large")


def parse_request_line(line):
    """(method, target, (major, minor)) from b"GET / HTTP/1.1". A version
    HTTP/1.2 to 1.9 is served as HTTP/1.1 (RFC 9110 2.5)."""
    parts = line.split(b" ")
    if len(parts) != 3:
        raise HttpError(400, "the request line is not METHOD SP TARGET SP VERSION")
    method, target, version = parts
    if not _TOKEN.fullmatch(method):
        raise HttpError(400, "the method is not a token")
    if not _TARGET.fullmatch(target):
        raise HttpError(400, "the request target is empty or has a byte that must be percent-encoded")
    match = _VERSION.fullmatch(version)
    if not match:
        raise HttpError(400, "the HTTP version is malformed")
    major, minor = int(match.group(1)), int(match.group(2))
    if major != 1:
        raise HttpError(505, f"HTTP/{major}.{minor} is not supported")
    return method.decode("ascii"), target.decode("ascii"), (1, min(minor, 1))


def parse_target(method, target):
    """(raw path, raw query, authority or None) from a request target,
    the fragment dropped (docs/http.md, "Request target")."""
    if method == "CONNECT":
        raise HttpError(501, "CONNECT is not implemented: this is an origin server, not a tunnel")
    target = target.partition("#")[0]
    authority = None
    if target == "*":
        if method != "OPTIONS":
            raise HttpError(400, "the target * is for OPTIONS only")
        return "*", "", None
    if not target.startswith("/"):
        match = _ABSOLUTE_FORM.fullmatch(target)
        if not match:
            raise HttpError(400, "the request target does not start with / (nor is it an http URI)")
        scheme, authority, target = match.groups()
        if scheme.lower() not in ("http", "https"):
            raise HttpError(400, f"a {scheme}: URI is not served here")
        if not _HOST.fullmatch(authority):
            raise HttpError(400, "the target URI's host is empty, has userinfo, or is malformed")
        if not target.startswith("/"):
            target = "/" + target
    path, _, query = target.partition("?")
    if _BAD_ESCAPE.search(path):
        raise HttpError(400, "a % in the path does not start a %XX escape")
    return path, query, authority


def parse_field_line(line, limits):
    """(lower-case name, value) from one field line (a header or a trailer)."""
    if len(line) > limits.max_field_line:
        raise HttpError(431, f"a header line is longer than {limits.max_field_line} bytes")
    if line[:1] in (b" ", b"\t"):
        raise HttpError(400, "obsolete line folding in a header field")
    name, colon, value = line.partition(b":")
    if not colon or not _TOKEN.fullmatch(name):
        raise HttpError(400, "a header line is not NAME: VALUE (no space before the colon)")
    value = value.strip(b" \t")
    if _BAD_VALUE.search(value):
        raise HttpError(400, "a header value has a CR, LF, NUL or another control character")
    return name.decode("ascii").lower(), value.decode("latin-1")


def parse_header_lines(lines, limits):
    """A list of (lower-case name, value) pairs from the head's field lines."""
    if len(lines) > limits.max_headers:
        raise HttpError(431, f"more than {limits.max_headers} header fields")
    return [parse_field_line(line, limits) for line in lines]


class Request:
    """One parsed request head."""

    def __init__(self, method, target, version, fields):
        self.method = method
        self.target = target
        self.version = version
        self.fields = fields
        self.headers = {}
        for name, value in fields:
            if name in self.headers:
                self.headers[name] += ", " + value
            else:
                self.headers[name] = value
        # The path (still percent-encoded) and query the target names.
        self.path, self.query = target, ""
        # The Content-Length as a number, once `body_framing` has read it.
        self.content_length = None
        # What `wants_keepalive` found, once asked.
        self._keepalive = None
        # The version as the status line and SERVER_PROTOCOL give it.
        self.version_text = "HTTP/%d.%d" % version

    def tokens(self, name):
        """A comma-separated header as a set of lower-case tokens."""
        return {t.strip().lower() for t in self.headers.get(name, "").split(",") if t.strip()}

    def wants_keepalive(self):
        """Whether the client allows the connection to stay open."""
        if self._keepalive is None:
            connection = self.tokens("connection")
            if self.version >= (1, 1):
                self._keepalive = "close" not in connection
            else:
                self._keepalive = "keep-alive" in connection
        return self._keepalive

    def expects_continue(self):
        """True for `Expect: 100-continue`; 417 for any other expectation."""
        expect = self.headers.get("expect")
        if expect is None:
            return False
        if expect.strip().lower() != "100-continue":
            raise HttpError(417, f"cannot meet the expectation {expect!r}")
        return self.version >= (1, 1)

    def body_framing(self, limits):
        """("chunked", None), ("length", N) or ("length", 0) for no body
        (docs/http.md, "Content-Length" and "Transfer-Encoding")."""
        if "transfer-encoding" in self.headers:
            if self.version < (1, 1):
                raise HttpError(400, "Transfer-Encoding on HTTP/1.0 is faulty framing")
            if "content-length" in self.headers:
                raise HttpError(400, "both Transfer-Encoding and Content-Length")
            codings = [t.strip(" \t").lower() for t in self.headers["transfer-encoding"].split(",")]
            if codings[-1] != "chunked" or "" in codings:
                raise HttpError(400, "Transfer-Encoding does not end with chunked")
            if codings.count("chunked") > 1:
                raise HttpError(400, "Transfer-Encoding has chunked twice")
            if len(codings) > 1:
                raise HttpError(501, "no transfer coding but chunked is implemented")
            return "chunked", None
        if "content-length" not in self.headers:
            return "length", 0
        members = [m.strip(" \t") for m in self.headers["content-length"].split(",")]
        if not all(_DIGITS.fullmatch(m) for m in members):
            raise HttpError(400, "Content-Length is not a number")
        lengths = {int(m) for m in members}
        if len(lengths) != 1:
            raise HttpError(400, "conflicting Content-Length values")
        length = lengths.pop()
        if length > limits.max_body:
            raise HttpError(413, f"the body is larger than {limits.max_body} bytes")
        self.content_length = length
        return "length", length


def parse_head(head, limits):
    """A `Request` from a complete head (ending with the blank line)."""
    plain = _PLAIN_HEAD.fullmatch(head)
    # A head no longer than a field line may be has no line too long.
    if plain is None or len(head) > limits.max_field_line:
        return parse_head_by_lines(head, limits)
    method, target, minor, block = plain.groups()
    fields = [
        (name.decode("ascii").lower(), value.strip(b" \t").decode("latin-1"))
        for name, value in _PLAIN_FIELD.findall(block)
    ]
    if len(fields) > limits.max_headers:
        raise HttpError(431, f"more than {limits.max_headers} header fields")
    version = (1, min(int(minor), 1))
    return _checked(Request(method.decode("ascii"), target.decode("ascii"), version, fields))


def parse_head_by_lines(head, limits):
    """`parse_head` a line at a time: any head, the faulty ones included."""
    lines = head[:-4].split(CRLF) if head.endswith(b"\r\n\r\n") else head.split(CRLF)
    # RFC 9112: a server should ignore empty lines before the request line.
    while lines and not lines[0]:
        lines.pop(0)
    if not lines:
        raise HttpError(400, "an empty request")
    method, target, version = parse_request_line(lines[0])
    return _checked(Request(method, target, version, parse_header_lines(lines[1:], limits)))


def _checked(request):
    """`request` once its Host and target pass (docs/http.md, "Host" and
    "Request target")."""
    version = request.version
    hosts = [value for name, value in request.fields if name == "host"]
    if len(hosts) > 1:
        raise HttpError(400, "more than one Host header")
    if version >= (1, 1) and not hosts:
        raise HttpError(400, "an HTTP/1.1 request without Host")
    if hosts and hosts[0] and not _HOST.fullmatch(hosts[0]):
        raise HttpError(400, "the Host header is not host[:port]")
    request.path, request.query, authority = parse_target(request.method, request.target)
    if authority is not None:
        request.headers["host"] = authority  # RFC 9112 3.2.2: the URI wins
    return request


class Body:
    """A request body, read on demand: the WSGI `wsgi.input` stream.

    Nothing is read before the app asks. `on_first_read` is called once,
    before the first read from the socket (it sends `100 Continue`). From
    then on the whole body must arrive within `Limits.body_timeout` (else
    408), and each read within `Limits.read_timeout` (else ClientGone)."""

    def __init__(self, reader, limits, framing, length, on_first_read=None):
        self.reader = reader
        self.limits = limits
        self.chunked = framing == "chunked"
        self.left = 0 if self.chunked else length  # bytes left in this chunk/body
        self.done = not self.chunked and length == 0
        self.received = 0
        self.pending = b""
        self.on_first_read = on_first_read
        self.body_deadline = None

    def _start(self):
        if self.body_deadline is None:
            self.body_deadline = time.monotonic() + self.limits.body_timeout
        if self.on_first_read is not None:
            callback, self.on_first_read = self.on_first_read, None
            callback()

    def _reading(self, read, limit):
        """`read(limit, deadline)` on the reader, within both timeouts."""
        now = time.monotonic()
        try:
            return read(limit, min(now + self.limits.read_timeout, self.body_deadline))
        except TimeoutError:
            if time.monotonic() >= self.body_deadline:
                raise HttpError(408, f"the body did not arrive within {self.limits.body_timeout:g} s") from None
            raise ClientGone("the body stopped arriving") from None

    def _next_chunk(self):
        line = self._reading(self.reader.read_line, _MAX_CHUNK_LINE)
        match = _CHUNK_LINE.fullmatch(line)
        if not match:
            raise HttpError(400, "a malformed chunk-size line")
        self.left = int(match.group(1), 16)
        if self.left >= 1 << 63:
            raise HttpError(400, "a chunk size of 2^63 or more")
        if self.left == 0:
            self._trailers()

    def _trailers(self):
        """Reads the trailer section: checked like header lines, then
        dropped (never merged into the headers the app already has)."""
        for _ in range(self.limits.max_headers + 1):
            line = self._reading(self.reader.read_line, self.limits.max_field_line)
            if not line:
                self.done = True
                return
            parse_field_line(line, self.limits)
        raise HttpError(431, "too many trailer fields")

    def _chunk_end(self):
        if self._reading(self.reader.read_line, 0) != b"":
            raise HttpError(400, "a chunk is longer than its size")

    def _read_block(self, limit):
        """At most `limit` bytes (at least one unless the body is done)."""
        if self.done:
            return b""
        self._start()
        if self.chunked and self.left == 0:
            self._next_chunk()
            if self.done:
                return b""
        data = self._reading(self.reader.read_some, min(limit, self.left))
        if not data:
            raise ClientGone("closed in the middle of a request body")
        self.left -= len(data)
        self.received += len(data)
        if self.received > self.limits.max_body:
            raise HttpError(413, f"the body is larger than {self.limits.max_body} bytes")
        if self.left == 0:
            if self.chunked:
                self._chunk_end()
            else:
                self.done = True
        return data

    def _take(self, size):
        """Up to `size` bytes: first what `readline` looked ahead at."""
        if self.pending:
            data, self.pending = self.pending[:size], self.pending[size:]
            return data
        return self._read_block(size)

    def read(self, size=-1):
        """Up to `size` bytes, or the rest of the body when size is -1/None."""
        if size is None or size < 0:
            size = float("inf")
        parts = []
        while size > 0:
            block = self._take(min(size, 65536))
            if not block:
                break
            parts.append(block)
            size -= len(block)
        return b"".join(parts)

    def readline(self, size=-1):
        """One line, with its b"\\n", at most `size` bytes when size >= 0."""
        if size is None or size < 0:
            size = float("inf")
        while b"\n" not in self.pending and len(self.pending) < size:
            block = self._read_block(65536)
            if not block:
                break
            self.pending += block
        newline = self.pending.find(b"\n")
        end = len(self.pending) if newline < 0 else newline + 1
        end = int(min(end, size))
        line, self.pending = self.pending[:end], self.pending[end:]
        return line

    def readlines(self, hint=-1):
        lines = []
        total = 0
        for line in self:
            lines.append(line)
            total += len(line)
            if 0 < hint <= total:
                break
        return lines

    def __iter__(self):
        while True:
            line = self.readline()
            if not line:
                return
            yield line

    def drain(self, most):
        """Reads and drops what the app left unread, at most `most` bytes.
        True when the body is fully consumed (the connection can be reused)."""
        while not self.done and most > 0:
            block = self._read_block(min(most, 65536))
            if not block:
                break
            most -= len(block)
        return self.done


def status_line(version, status):
    """b"HTTP/1.1 200 OK\\r\\n" for a numeric status."""
    return b"%s %d %s\r\n" % (version.encode("ascii"), status, REASONS.get(status, "").encode())


def error_response(status, why, version="HTTP/1.1"):
    """A complete plain-text error response that closes the connection."""
    body = b"%d %s: %s\n" % (status, REASONS.get(status, "").encode(), why.encode("utf-8", "replace"))
    return (
        status_line(version, status)
        + b"Content-Type: text/plain; charset=utf-8\r\n"
        + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
        + body
    )


def close_after_refusal(sock, seconds=2.0, most=1 << 20):
    """After an error answer: stop sending (the client sees the answer end),
    then read and drop what the client still sends, for up to `seconds` or
    `most` bytes, before the caller closes. Closing on unread bytes makes
    the kernel reset the connection, and a reset can destroy the answer
    before the client reads it (RFC 9112, 9.6)."""
    try:
        sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + seconds
        dropped = 0
        while dropped < most:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            sock.settimeout(left)
            data = sock.recv(65536)
            if not data:
                return
            dropped += len(data)
    except OSError:
        pass


def no_body_status(status):
    """Statuses whose responses never have a body."""
    return 100 <= status < 200 or status in (204, 304)


def chunk(data):
    """One chunk of a chunked response body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"
