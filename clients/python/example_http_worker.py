#!/usr/bin/env python3
"""An HTTP worker for `forkpool run`, answering like `forkpool demo`.

    forkpool run --listen 127.0.0.1:8080 -- python3 clients/python/example_http_worker.py
    curl -i 'http://127.0.0.1:8080/?work_ms=100'

Any GET answers `hello`; `?work_ms=N` sleeps N ms first (a slow handler).
Every response names the worker in `X-Forkpool-Slot` and `X-Forkpool-Pid`
and closes the connection.

With `--chaos` (fault-injection tests only), `?chaos=garbage` makes the
worker write a malformed message on its back-channel and `?chaos=exit`
makes it exit in the middle of the request.
"""

import os
import sys
import time
import urllib.parse

import forkpool_worker

MAX_HEAD = 8192
MAX_WORK_MS = 60_000


def read_head(conn):
    head = b""
    while b"\r\n\r\n" not in head and len(head) < MAX_HEAD:
        chunk = conn.recv(2048)
        if not chunk:
            return None
        head += chunk
    return head


def main():
    chaos = "--chaos" in sys.argv[1:]
    worker = forkpool_worker.Worker.from_env()

    def handle(conn, _listener):
        conn.settimeout(5)
        try:
            head = read_head(conn)
        except OSError:
            return
        if head is None:
            return
        parts = head.split(b"\r\n", 1)[0].split(b" ")
        target = parts[1].decode("latin-1") if len(parts) > 1 else "/"
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query)
        what = query.get("chaos", [""])[0] if chaos else ""
        if what == "exit":
            os._exit(3)
        try:
            work_ms = min(int(query.get("work_ms", ["0"])[0]), MAX_WORK_MS)
        except ValueError:
            work_ms = 0
        time.sleep(work_ms / 1000)
        body = b"hello\n"
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
            + b"Content-Length: %d\r\n" % len(body)
            + b"X-Forkpool-Slot: %d\r\nX-Forkpool-Pid: %d\r\n" % (worker.slot, worker.pid)
            + b"Connection: close\r\n\r\n"
            + body
        )
        if what == "garbage":
            # After the response, so the client gets it before the
            # supervisor kills this worker for what follows.
            worker.channel.send(b"\x01Zjunk")  # version 1, no kind 'Z'

    worker.serve(handle)


if __name__ == "__main__":
    main()
