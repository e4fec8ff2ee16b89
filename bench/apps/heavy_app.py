"""A stand-in for a heavy WSGI app, for `forkpool-bench --only preload`.

At import it fills a 100 MiB table (every page written, so it is really
resident) and sleeps 0.5 s, as a real app's imports, rule sets or models
would; a request sleeps `?work_ms=N` milliseconds, then answers `hello`.
`?hold=PATH` sleeps instead for as long as the file PATH exists (looking
every 20 ms, at most 60 s): the benchmark holds workers busy until it has
seen what it measures, however long that takes on a loaded machine.
`HEAVY_TABLE_MIB` and `HEAVY_START_S` change the two costs.
"""

import os
import time
import urllib.parse

TABLE = bytearray(b"\x01") * (int(os.environ.get("HEAVY_TABLE_MIB", "100")) << 20)
time.sleep(float(os.environ.get("HEAVY_START_S", "0.5")))

MAX_WORK_MS = 60_000


def app(environ, start_response):
    query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""))
    try:
        work_ms = min(int(query.get("work_ms", ["0"])[0]), MAX_WORK_MS)
    except ValueError:
        work_ms = 0
    time.sleep(work_ms / 1000)
    hold = query.get("hold", [""])[0]
    if hold:
        until = time.monotonic() + MAX_WORK_MS / 1000
        while os.path.exists(hold) and time.monotonic() < until:
            time.sleep(0.02)
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"hello\n"]
