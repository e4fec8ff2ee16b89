"""Unit tests of forkpool_http: parsing, limits, bodies, deadlines.

Run from clients/python: python3 -m unittest discover -s tests
"""

import socket
import threading
import time
import unittest

import forkpool_http as http

LIMITS = http.Limits(head_timeout=1.0, read_timeout=1.0, max_body=1000)


def pair(data=b"", close=True):
    """A Reader on one end of a socket pair whose other end sent `data`."""
    a, b = socket.socketpair()
    b.sendall(data)
    if close:
        b.close()
        return http.Reader(a), None
    return http.Reader(a), b


def drip(writer, every=0.05):
    """Sends a byte on `writer` every `every` seconds, from a thread,
    until the Event it returns is set."""
    stop = threading.Event()

    def send():
        while not stop.wait(every):
            try:
                writer.send(b"x")
            except OSError:
                return

    threading.Thread(target=send, daemon=True).start()
    return stop


def refusal(head):
    try:
        http.parse_head(head, LIMITS)
    except http.HttpError as e:
        return e.status
    return None


class ParseHead(unittest.TestCase):
    def test_a_plain_get(self):
        r = http.parse_head(b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nA: 1\r\na: 2\r\n\r\n", LIMITS)
        self.assertEqual((r.method, r.target, r.version), ("GET", "/a?b=1", (1, 1)))
        self.assertEqual(r.headers["a"], "1, 2")
        self.assertTrue(r.wants_keepalive())

    def test_keepalive_rules(self):
        h10 = http.parse_head(b"GET / HTTP/1.0\r\n\r\n", LIMITS)
        self.assertFalse(h10.wants_keepalive())
        h10ka = http.parse_head(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", LIMITS)
        self.assertTrue(h10ka.wants_keepalive())
        close = http.parse_head(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", LIMITS)
        self.assertFalse(close.wants_keepalive())

    def test_malformed_heads_are_400(self):
        for head in [
            b"GARBAGE\r\n\r\n",
            b"GET / HTTP/1.1\r\n\r\n",  # no Host
            b"GET / HTTP/1.1\r\nHost: x\r\nno colon\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nBad Name: 1\r\n\r\n",
            b"G(T / HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET / HTTX/1.1\r\nHost: x\r\n\r\n",
        ]:
            self.assertEqual(refusal(head), 400, head)

    def test_other_versions_are_505(self):
        self.assertEqual(refusal(b"GET / HTTP/2.0\r\nHost: x\r\n\r\n"), 505)

    def test_too_many_headers_is_431(self):
        many = b"".join(b"X%d: 1\r\n" % i for i in range(LIMITS.max_headers + 1))
        self.assertEqual(refusal(b"GET / HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n"), 431)

    def test_body_framing(self):
        def framing(extra):
            r = http.parse_head(b"POST / HTTP/1.1\r\nHost: x\r\n" + extra + b"\r\n", LIMITS)
            try:
                return r.body_framing(LIMITS)
            except http.HttpError as e:
                return e.status

        self.assertEqual(framing(b""), ("length", 0))
        self.assertEqual(framing(b"Content-Length: 12\r\n"), ("length", 12))
        self.assertEqual(framing(b"Transfer-Encoding: chunked\r\n"), ("chunked", None))
        self.assertEqual(framing(b"Content-Length: 1\r\nContent-Length: 2\r\n"), 400)
        self.assertEqual(framing(b"Content-Length: -1\r\n"), 400)
        self.assertEqual(framing(b"Content-Length: 1\r\nTransfer-Encoding: chunked\r\n"), 400)
        self.assertEqual(framing(b"Transfer-Encoding: gzip, chunked\r\n"), 501)
        self.assertEqual(framing(b"Transfer-Encoding: chunked, gzip\r\n"), 400)
        self.assertEqual(framing(b"Content-Length: 5, 5\r\n"), ("length", 5))
        self.assertEqual(framing(b"Content-Length: 1001\r\n"), 413)

    def test_expect(self):
        r = http.parse_head(b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n", LIMITS)
        self.assertTrue(r.expects_continue())
        r = http.parse_head(b"POST / HTTP/1.1\r\nHost: x\r\nExpect: magic\r\n\r\n", LIMITS)
        with self.assertRaises(http.HttpError) as e:
            r.expects_continue()
        self.assertEqual(e.exception.status, 417)


class Targets(unittest.TestCase):
    def test_forms_and_what_the_app_gets(self):
        def target(line):
            r = http.parse_head(line + b"\r\nHost: h\r\n\r\n", LIMITS)
            return r.path, r.query, r.headers["host"]

        self.assertEqual(target(b"GET /a%20b?x=1#f HTTP/1.1"), ("/a%20b", "x=1", "h"))
        self.assertEqual(target(b"GET http://u.example:8/p?q HTTP/1.1"), ("/p", "q", "u.example:8"))
        self.assertEqual(target(b"GET http://u.example HTTP/1.1"), ("/", "", "u.example"))
        self.assertEqual(target(b"OPTIONS * HTTP/1.1"), ("*", "", "h"))

    def test_refused_targets(self):
        for line, status in [
            (b"GET * HTTP/1.1", 400),
            (b"GET foo HTTP/1.1", 400),
            (b"GET h.example:443 HTTP/1.1", 400),
            (b"GET ftp://h/ HTTP/1.1", 400),
            (b"GET http://u@h/ HTTP/1.1", 400),
            (b"GET /%zz HTTP/1.1", 400),
            (b"GET /\xc3\xa9 HTTP/1.1", 400),
            (b"CONNECT h:443 HTTP/1.1", 501),
        ]:
            self.assertEqual(refusal(line + b"\r\nHost: h\r\n\r\n"), status, line)


class ReadHead(unittest.TestCase):
    def test_head_and_what_follows(self):
        reader, _ = pair(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nBODY")
        head = reader.read_head(LIMITS, time.monotonic() + 1)
        self.assertTrue(head.endswith(b"\r\n\r\n"))
        self.assertEqual(reader.buf, b"BODY")

    def test_closed_before_anything_is_none(self):
        reader, _ = pair(b"")
        self.assertIsNone(reader.read_head(LIMITS, time.monotonic() + 1))

    def test_a_dripping_client_gets_408_at_the_deadline(self):
        reader, writer = pair(b"GET / HT", close=False)
        stop = drip(writer)
        started = time.monotonic()
        with self.assertRaises(http.HttpError) as e:
            reader.read_head(LIMITS, started + 0.5)
        stop.set()
        writer.close()
        self.assertEqual(e.exception.status, 408)
        self.assertLess(time.monotonic() - started, 5)

    def test_the_deadline_holds_whatever_timeout_the_socket_had(self):
        reader, writer = pair(b"GET / HT", close=False)
        reader.sock.settimeout(30)  # as an app or an earlier sendfile may leave it
        started = time.monotonic()
        with self.assertRaises(http.HttpError) as e:
            reader.read_head(LIMITS, started + 0.2)
        writer.close()
        self.assertEqual(e.exception.status, 408)
        self.assertLess(time.monotonic() - started, 5)

    def test_a_bare_lf_is_400_without_waiting_for_more(self):
        reader, writer = pair(b"GET / HTTP/1.1\nHost: x\n\n", close=False)
        with self.assertRaises(http.HttpError) as e:
            reader.read_head(LIMITS, time.monotonic() + 5)
        writer.close()
        self.assertEqual(e.exception.status, 400)

    def test_long_request_line_is_414_and_long_head_431(self):
        reader, _ = pair(b"GET /" + b"a" * LIMITS.max_request_line)
        with self.assertRaises(http.HttpError) as e:
            reader.read_head(LIMITS, time.monotonic() + 1)
        self.assertEqual(e.exception.status, 414)
        reader, _ = pair(b"GET / HTTP/1.1\r\nX: " + b"a" * LIMITS.max_head)
        with self.assertRaises(http.HttpError) as e:
            reader.read_head(LIMITS, time.monotonic() + 1)
        self.assertEqual(e.exception.status, 431)


class Bodies(unittest.TestCase):
    def test_content_length_stops_at_the_length(self):
        reader, _ = pair(b"hello\nworld\nNEXT")
        body = http.Body(reader, LIMITS, "length", 12)
        self.assertEqual(body.readline(), b"hello\n")
        self.assertEqual(body.read(), b"world\n")
        self.assertEqual(body.read(), b"")
        self.assertTrue(body.done)
        self.assertEqual(reader.buf, b"NEXT")

    def test_chunked_with_extensions_and_trailers(self):
        reader, _ = pair(b"5;x=1\r\nhello\r\n6\r\n world\r\n0\r\nT: 1\r\n\r\nNEXT")
        body = http.Body(reader, LIMITS, "chunked", None)
        self.assertEqual(body.read(3), b"hel")
        self.assertEqual(body.read(), b"lo world")
        self.assertTrue(body.done)
        self.assertEqual(reader.buf, b"NEXT")

    def test_bad_chunks_are_400(self):
        for data in [b"zz\r\nhello\r\n0\r\n\r\n", b"2\r\nhello\r\n0\r\n\r\n"]:
            reader, _ = pair(data)
            with self.assertRaises(http.HttpError) as e:
                http.Body(reader, LIMITS, "chunked", None).read()
            self.assertEqual(e.exception.status, 400)

    def test_a_chunked_body_over_the_limit_is_413(self):
        reader, _ = pair(b"%x\r\n" % 1200 + b"a" * 1200 + b"\r\n0\r\n\r\n")
        with self.assertRaises(http.HttpError) as e:
            http.Body(reader, LIMITS, "chunked", None).read()
        self.assertEqual(e.exception.status, 413)

    def test_the_first_read_sends_continue_once(self):
        calls = []
        reader, _ = pair(b"abc")
        body = http.Body(reader, LIMITS, "length", 3, lambda: calls.append(1))
        self.assertEqual(calls, [])
        body.read(1)
        body.read()
        self.assertEqual(calls, [1])

    def test_drain_stops_at_its_bound(self):
        reader, _ = pair(b"a" * 500)
        body = http.Body(reader, LIMITS, "length", 500)
        self.assertFalse(body.drain(100))
        self.assertTrue(body.drain(1000))

    def test_a_stalled_body_times_out(self):
        reader, writer = pair(b"ab", close=False)
        limits = http.Limits(read_timeout=0.2)
        body = http.Body(reader, limits, "length", 10)
        with self.assertRaises(http.ClientGone):
            body.read()
        writer.close()

    def test_a_dripping_body_gets_408_at_the_body_deadline(self):
        reader, writer = pair(b"a", close=False)
        stop = drip(writer)
        limits = http.Limits(read_timeout=5.0, body_timeout=0.3)
        started = time.monotonic()
        with self.assertRaises(http.HttpError) as e:
            http.Body(reader, limits, "length", 60).read()  # 3 s of drip
        stop.set()
        writer.close()
        self.assertEqual(e.exception.status, 408)
        self.assertLess(time.monotonic() - started, 3)


class SendAll(unittest.TestCase):
    def test_everything_arrives_through_a_full_buffer(self):
        a, b = socket.socketpair()
        data = bytes(range(256)) * 8192  # 2 MiB: many times the socket buffer
        got = bytearray()

        def read():
            while len(got) < len(data):
                chunk = b.recv(65536)
                if not chunk:
                    return
                got.extend(chunk)

        reader = threading.Thread(target=read)
        reader.start()
        http.send_all(a, data, 5.0)
        reader.join(10)
        a.close()
        b.close()
        self.assertEqual(bytes(got), data)

    def test_a_client_that_does_not_read_is_gone_after_the_timeout(self):
        a, b = socket.socketpair()
        started = time.monotonic()
        with self.assertRaises(http.ClientGone):
            http.send_all(a, b"x" * (8 << 20), 0.2)
        a.close()
        b.close()
        self.assertLess(time.monotonic() - started, 5)


class Responses(unittest.TestCase):
    def test_chunk_framing(self):
        self.assertEqual(http.chunk(b"hello"), b"5\r\nhello\r\n")
        self.assertEqual(http.LAST_CHUNK, b"0\r\n\r\n")

    def test_error_response_closes(self):
        raw = http.error_response(431, "too big")
        self.assertTrue(raw.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"))
        self.assertIn(b"Connection: close\r\n", raw)


if __name__ == "__main__":
    unittest.main()
