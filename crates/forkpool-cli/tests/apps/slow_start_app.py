"""A WSGI app that takes 0.3 s of CPU to import, as a large app does when
each worker loads it (no --preload); crates/forkpool-cli/tests/scaling.rs."""

import time

_done = time.process_time() + 0.3
while time.process_time() < _done:
    pass


def application(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"ok"]
