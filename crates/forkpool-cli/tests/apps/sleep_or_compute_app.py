"""A WSGI app whose request sleeps `?sleep_ms=N` (a database, a remote
call) or computes for `?cpu_ms=N` of CPU time, then answers `ok`; for
crates/forkpool-cli/tests/cpu_hold.rs."""

import time
import urllib.parse


def application(environ, start_response):
    query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""))
    cpu_ms = int(query.get("cpu_ms", ["0"])[0])
    if cpu_ms:
        done = time.process_time() + cpu_ms / 1000
        while time.process_time() < done:
            pass
    else:
        time.sleep(int(query.get("sleep_ms", ["0"])[0]) / 1000)
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"ok"]
