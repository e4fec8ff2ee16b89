"""A WSGI app that leaks a descriptor on every request (tests only).

Each request opens /dev/null and never closes it, as a handler with a
leak does; the answer is the worker's pid, or 500 with the error once an
open fails. tests/leaky_apps.rs serves it kept alive under a small
RLIMIT_NOFILE.
"""

import os

leaked = []


def app(environ, start_response):
    try:
        leaked.append(os.open("/dev/null", os.O_RDONLY))
    except OSError as e:
        start_response("500 Internal Server Error", [("Content-Type", "text/plain")])
        return [f"{e}\n".encode()]
    body = f"{os.getpid()}\n".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
