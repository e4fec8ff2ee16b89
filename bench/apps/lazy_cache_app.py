"""A WSGI app that warms up on traffic, for the refork part of
`forkpool-bench --only preload`.

Its first ten requests each add a 5 MiB entry to a module-level cache (a
stand-in for lazily imported modules, compiled templates or memoised
lookups), so a worker that has served ten requests holds 50 MiB that a
fresh worker does not. Every request reads one entry. Forked from a warm
worker (`--refork-after`), new workers share the cache instead of
building their own. `?work_ms=N` sleeps N ms first.
"""

import time
import urllib.parse

ENTRIES = 10
ENTRY_BYTES = 5 << 20
CACHE = []


def app(environ, start_response):
    query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""))
    try:
        time.sleep(min(int(query.get("work_ms", ["0"])[0]), 1000) / 1000)
    except ValueError:
        pass
    if len(CACHE) < ENTRIES:
        CACHE.append(bytes([len(CACHE) + 1]) * ENTRY_BYTES)
    body = b"hello %d\n" % CACHE[-1][0]
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [body]
