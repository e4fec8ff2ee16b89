"""A WSGI app that names the worker answering, for tests that check which
worker got a connection (crates/forkpool-cli/tests/kernel_python.rs).

Every request gets `hello` with `X-Forkpool-Slot` (forkpool_wsgi's
`forkpool.slot`) and `X-Forkpool-Pid`; `?work_ms=N` waits N ms first.
"""

import os
import time
import urllib.parse


def app(environ, start_response):
    query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""))
    try:
        work_ms = min(int(query.get("work_ms", ["0"])[0]), 10_000)
    except ValueError:
        work_ms = 0
    if work_ms > 0:
        time.sleep(work_ms / 1000)
    body = b"hello\n"
    start_response(
        "200 OK",
        [
            ("Content-Type", "text/plain"),
            ("Content-Length", str(len(body))),
            ("X-Forkpool-Slot", str(environ["forkpool.slot"])),
            ("X-Forkpool-Pid", str(os.getpid())),
        ],
    )
    return [body]
