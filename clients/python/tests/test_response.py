"""forkpool_wsgi.Response.start_response: what it sends on and what it
refuses (docs/http.md, "Responses from the app").

Run from clients/python: python3 -m unittest discover -s tests
"""

import collections
import socket
import unittest

import forkpool_http as http
import forkpool_wsgi as wsgi

Pair = collections.namedtuple("Pair", "name value")


class Name(str):
    pass


def response():
    a, b = socket.socketpair()
    a.close()
    b.close()
    request = http.parse_head(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", http.Limits())
    return wsgi.Response(a, request, True, 1.0)


class StartResponse(unittest.TestCase):
    def test_headers_kept_framing_read_hop_by_hop_dropped(self):
        r = response()
        r.start_response(
            "200 OK",
            [("Content-Type", "text/plain"), ("Content-Length", "5"), ("Connection", "close"),
             ("Keep-Alive", "timeout=5"), Pair("X-A", "1"), (Name("X-B"), Name("2"))],
        )
        self.assertEqual((r.status, r.code, r.length, r.keepalive), ("200 OK", 200, 5, False))
        self.assertEqual(r.headers, [("Content-Type", "text/plain"), ("Content-Length", "5"), ("X-A", "1"), ("X-B", "2")])
        self.assertIn(b"Content-Length: 5\r\n", r._head())
        self.assertIn(b"Connection: close\r\n", r._head())

    def test_bodyless_status(self):
        r = response()
        r.start_response("304 Not Modified", [])
        self.assertTrue(r.bodyless)

    def test_refusals_leave_nothing_set(self):
        for status, headers in [
            ("200 OK\r\nX-Injected: 1", []),
            (b"200 OK", []),
            ("200 OK", [("X-Bad", "a\r\nX-Injected: 1")]),
            ("200 OK", [("X-Bad", "a\x00")]),
            ("200 OK", [("Bad Name", "1")]),
            ("200 OK", [("X-A", 1)]),
            ("200 OK", [["X-A", "1"]]),
            ("200 OK", [("X-A", "1", "2")]),
            ("200 OK", ["X-A: 1"]),
        ]:
            with self.subTest(status=status, headers=headers):
                r = response()
                with self.assertRaises(wsgi.BadResponse):
                    r.start_response(status, headers)
                self.assertIsNone(r.status)
                self.assertTrue(r.keepalive)


if __name__ == "__main__":
    unittest.main()


class Ending(unittest.TestCase):
    """When a response that ends its connection calls `ending` (the
    worker going idle early, Worker.ending_connection): before its one
    write when that write completes it and is small, else after the last
    write; never for a kept-alive connection."""

    def run_app(self, body, keepalive=False, length=True):
        events = []
        a, b = socket.socketpair()
        self.addCleanup(a.close)
        self.addCleanup(b.close)
        b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        request = http.parse_head(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", http.Limits())
        r = wsgi.Response(a, request, keepalive, 5.0, ending=lambda: events.append("ending"))
        sent = wsgi.Response._send

        def send(this, data):
            events.append("send")
            sent(this, data)
            b.recv(1 << 20)  # the client reads, so no send waits

        r._send = send.__get__(r)
        headers = [("Content-Length", str(len(body)))] if length else []
        r.start_response("200 OK", headers)
        r.write(body)
        r.finish()
        return events

    def test_a_small_last_answer_goes_idle_first(self):
        self.assertEqual(self.run_app(b"hello\n"), ["ending", "send"])

    def test_a_large_last_answer_goes_idle_after_its_write(self):
        self.assertEqual(self.run_app(b"x" * (wsgi.ENDING_WRITE_MAX + 1)), ["send", "ending"])

    def test_a_body_the_close_ends_goes_idle_after_it(self):
        self.assertEqual(self.run_app(b"hello\n", length=False), ["send", "ending"])

    def test_a_kept_alive_connection_never_ends(self):
        self.assertEqual(self.run_app(b"hello\n", keepalive=True), ["send"])
