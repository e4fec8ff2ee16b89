"""A worker program for the template tests: it preloads, hooks and reports.

Run unchanged as an exec'd worker or under a template. Each connection is
answered with one JSON line saying who served it and what state it saw:
`preloaded` is the pid of the process that imported this module (the
template's pid in a forked worker), `warm` the pid of the worker that served
this program's first connection (state a refork carries over), and
`after_fork` whether the hook ran in this process.
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import forkpool_worker  # noqa: E402

PRELOADED = os.getpid()
# A descriptor the program opens while it loads: a forked worker must not
# have it (the harness checks its descriptors).
LOADED_FROM = open(__file__, "rb")
WARM = None
HOOKED = None


@forkpool_worker.Worker.after_fork
def hook():
    global HOOKED
    HOOKED = os.getpid()
    print(f"after_fork ran in {os.getpid()}", file=sys.stderr, flush=True)


def handle(conn, listener):
    global WARM
    if WARM is None:
        WARM = os.getpid()
    reply = {
        "pid": os.getpid(),
        "slot": int(os.environ["FORKPOOL_SLOT"]),
        "preloaded": PRELOADED,
        "warm": WARM,
        "after_fork": HOOKED == os.getpid(),
    }
    conn.sendall(json.dumps(reply).encode() + b"\n")


forkpool_worker.Worker.from_env().serve(handle)
