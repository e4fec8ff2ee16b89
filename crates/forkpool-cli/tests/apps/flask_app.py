"""The Flask app the WSGI tests (crates/forkpool-cli/tests/wsgi.rs) serve."""

import hashlib
import os
import time

from flask import Flask, Response, request

app = Flask(__name__)
# Let exceptions reach the WSGI server, whose own 500 is under test.
app.config["PROPAGATE_EXCEPTIONS"] = True


@app.get("/")
def hello():
    return "hello"


@app.get("/pid")
def pid():
    return str(os.getpid())


@app.post("/digest")
def digest():
    # Reads the body a block at a time, so a large upload never sits in
    # memory; answers its length, its SHA-256 and this worker's pid.
    h = hashlib.sha256()
    total = 0
    while True:
        block = request.stream.read(65536)
        if not block:
            break
        h.update(block)
        total += len(block)
    return f"{total} {h.hexdigest()} {os.getpid()}"


@app.get("/raise")
def fail():
    raise RuntimeError("the test app fails on purpose")


@app.get("/stream")
def stream():
    def parts():
        for i in range(5):
            yield f"part {i}\n"
            time.sleep(0.01)

    return Response(parts(), mimetype="text/plain")


@app.get("/recycle")
def recycle():
    request.environ["forkpool.recycle"]()
    return str(os.getpid())


def create_app():
    """An app factory, for MODULE:create_app()."""
    return app
