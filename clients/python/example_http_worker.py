#!/usr/bin/env python3
"""An HTTP worker for `forkpool run`, answering like `forkpool demo`.

    forkpool run --listen 127.0.0.1:8080 -- python3 clients/python/example_http_worker.py
    curl -i 'http://127.0.0.1:8080/?work_ms=100'

Any GET answers `hello`; `?work_ms=N` sleeps N ms first (a slow handler).
Every response names the worker in `X-Forkpool-Slot` and `X-Forkpool-Pid`
and closes the connection. The request head must arrive whole within 5 s
(else 408), and a body is read and dropped in blocks, at most 1 MiB (else
413), so neither a dripping client nor a huge upload holds the worker.

With `--chaos` (fault-injection tests only), `?chaos=garbage` makes the
worker write a malformed message on its back-channel, `?chaos=exit`
makes it exit in the middle of the request, `?leak_fds=N` (at most
1000) makes it open N descriptors of /dev/null and keep them for the life
of the process, as a leaking app does (500 if one cannot be opened), and
`?grow_mib=N` (at most 1024) makes it keep N MiB more of memory it has
written to (its own, unshared) for the life of the process, as an app
that leaks memory does.
"""

import os
import sys
import time
import urllib.parse

import forkpool_http as http
import forkpool_worker

MAX_WORK_MS = 60_000
MAX_LEAK = 1000
MAX_GROW_MIB = 1024
# What `?leak_fds=N` opened (with --chaos), never closed.
leaked = []
# What `?grow_mib=N` kept (with --chaos), never freed.
grown = []
# A whole head must arrive within head_timeout seconds (a client dripping
# a byte at a time gets 408); a body is read and dropped a block at a time,
# never held in memory, and one over max_body bytes is refused with 413.
LIMITS = http.Limits(head_timeout=5.0, read_timeout=5.0, max_head=8192, max_body=1 << 20)


def read_request(conn):
    """The request, with its body read and dropped; None if the client
    closed. Raises forkpool_http.HttpError for a request to refuse."""
    reader = http.Reader(conn)
    head = reader.read_head(LIMITS, time.monotonic() + LIMITS.head_timeout)
    if head is None:
        return None
    request = http.parse_head(head, LIMITS)
    framing, length = request.body_framing(LIMITS)
    http.Body(reader, LIMITS, framing, length).drain(LIMITS.max_body + 1)
    return request


def main():
    chaos = "--chaos" in sys.argv[1:]
    worker = forkpool_worker.Worker.from_env()

    def handle(conn, _listener):
        try:
            request = read_request(conn)
        except http.HttpError as e:
            conn.settimeout(LIMITS.read_timeout)
            try:
                conn.sendall(http.error_response(e.status, e.why))
                http.close_after_refusal(conn)
            except OSError:
                pass
            return
        except (http.ClientGone, OSError):
            return
        if request is None:
            return
        conn.settimeout(LIMITS.read_timeout)
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(request.target).query)
        what = query.get("chaos", [""])[0] if chaos else ""
        if what == "exit":
            os._exit(3)
        try:
            work_ms = min(int(query.get("work_ms", ["0"])[0]), MAX_WORK_MS)
        except ValueError:
            work_ms = 0
        time.sleep(work_ms / 1000)
        status, body = b"200 OK", b"hello\n"
        try:
            grow_mib = min(int(query.get("grow_mib", ["0"])[0]), MAX_GROW_MIB) if chaos else 0
        except ValueError:
            grow_mib = 0
        if grow_mib:
            # Written to, so the pages are resident and this process's own.
            grown.append(b"\x01" * (grow_mib << 20))
        try:
            for _ in range(min(int(query.get("leak_fds", ["0"])[0]), MAX_LEAK) if chaos else 0):
                leaked.append(os.open("/dev/null", os.O_RDONLY))
        except ValueError:
            pass
        except OSError as e:
            status, body = b"500 Internal Server Error", f"{e}\n".encode()
        conn.sendall(
            b"HTTP/1.1 " + status + b"\r\nContent-Type: text/plain\r\n"
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
