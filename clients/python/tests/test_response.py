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
