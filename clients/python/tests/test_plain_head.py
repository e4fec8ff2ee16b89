"""forkpool_http.parse_head's one-pattern path for plain heads gives what
the line-by-line path gives, for every head: the same Request or the same
refusal.

Run from clients/python: python3 -m unittest discover -s tests
"""

import pathlib
import unittest

import forkpool_http as http

LIMITS = http.Limits(max_headers=4, max_field_line=120)
CORPUS = pathlib.Path(__file__).resolve().parents[3] / "tests" / "http-corpus"

# Heads at the edges of what the pattern takes (with LIMITS).
EDGES = [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"get /a%20b?c=%zz#frag HTTP/1.0\r\n\r\n",
    b"GET /a%zz HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET / HTTP/1.7\r\nHost: x\r\n\r\n",
    b"GET / HTTP/2.0\r\nHost: x\r\n\r\n",
    b"CONNECT / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET http://y/p HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nA: \t v \t \r\nB:\r\nC:\xe9\xff\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nA: 1\r\na: 2\r\nHOST: y\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nA: " + b"v" * 110 + b"\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nA: " + b"v" * 125 + b"\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nA: \x01\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nA: \x7f\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nA: a\rb\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nA : 1\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\n A: 1\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\n: 1\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x y\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost:\r\n\r\n",
    b"GET / HTTP/1.0\r\nHost:\r\n\r\n",
    b"GET  / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET / HTTP/1.1 \r\nHost: x\r\n\r\n",
    b"G@T / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\n",
]


def outcome(parse, head):
    """What `parse` makes of `head`: the request's parts, or the refusal."""
    try:
        r = parse(head, LIMITS)
    except http.HttpError as e:
        return ("refused", e.status, e.why)
    return (r.method, r.target, r.version, r.fields, r.headers, r.path, r.query, r.wants_keepalive())


def corpus_heads():
    """The head of every request in tests/http-corpus, as read_head would
    pass it on (the empty lines before it skipped)."""
    heads = []
    for case in sorted(CORPUS.glob("*/*.req")):
        data = case.read_bytes()
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            heads.append((case.name, data[: end + 4].lstrip(b"\r\n")))
    return heads


class PlainHead(unittest.TestCase):
    def test_the_corpus_is_there(self):
        self.assertGreater(len(corpus_heads()), 100, f"no http corpus at {CORPUS}")

    def test_both_paths_agree_on_every_corpus_head(self):
        for name, head in corpus_heads():
            with self.subTest(case=name):
                self.assertEqual(outcome(http.parse_head, head), outcome(http.parse_head_by_lines, head))

    def test_both_paths_agree_at_the_edges(self):
        for head in EDGES:
            with self.subTest(head=head):
                self.assertEqual(outcome(http.parse_head, head), outcome(http.parse_head_by_lines, head))

    def test_a_plain_head_takes_the_pattern(self):
        head = b"GET /a?b HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n"
        self.assertIsNotNone(http._PLAIN_HEAD.fullmatch(head))
        r = http.parse_head(head, LIMITS)
        self.assertEqual(r.fields, [("host", "x"), ("accept", "*/*")])
        self.assertEqual((r.path, r.query), ("/a", "b"))


if __name__ == "__main__":
    unittest.main()
