"""Serve a WSGI (PEP 3333) application from a forkpool pool.

    forkpool run --listen 127.0.0.1:8000 -- python3 -m forkpool_wsgi app:app

`MODULE:APP` names the application: `APP` is a name in `MODULE` (dots
reach attributes: `pkg.wsgi:application`, `app:server.wsgi_app`), or a call
of an app factory with literal arguments (`app:create_app()`,
`app:create_app("production")`). Without `:APP`, the name `application`
is used. The current directory comes first on the module search path, as
with gunicorn; `--chdir DIR` changes to DIR first.

Each worker serves one connection at a time, HTTP/1.1 with keep-alive,
and reports to the supervisor between connections. An exception in the
app is a 500 (the traceback goes to stderr, which the supervisor logs with
the slot) and the worker goes on serving. An app that knows its process is
broken calls `environ["forkpool.recycle"]()`: the worker finishes the
response, closes the connection and exits, and the supervisor starts a
fresh one. `environ["forkpool.slot"]` is the worker's slot number.

One access-log line per request goes to stderr (common log format, then
the duration in seconds and the slot); `--no-access-log` turns it off.
The app is imported before the worker starts serving (`load_app`, then
`serve`), so a preloading supervisor can import it once for every worker.
"""

import argparse
import ast
import importlib
import os
import re
import select
import sys
import time
import traceback
import urllib.parse

import forkpool_http as http
import forkpool_worker

# How much of a body the app left unread the server reads and drops so
# that the connection can serve another request; past it, it closes.
DRAIN_LIMIT = 65536
# Headers the server frames the response with; an app's own are dropped.
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "upgrade"}
# What an app's status and headers may hold (docs/http.md, "Responses from
# the app"): no CR, LF, NUL or other control but tab, nothing past Latin-1.
_STATUS = re.compile(r"[1-9][0-9]{2} [\t\x20-\x7e\x80-\xff]*")
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")
# An idle kept-alive connection gives way to a client waiting on a
# listener (docs/http.md, "Give-way") once it has been idle GIVE_WAY_IDLE
# and the client has waited a step per slot (slot % 4 + 1 steps, so that
# one worker gives way, not all). Without the idle minimum a client that
# is merely slow to send its next request (a loaded machine) would lose
# its connection with that request on the way.
GIVE_WAY_IDLE = 0.05
GIVE_WAY_STEP = 0.01


class BadResponse(Exception):
    """The app's status or headers cannot be sent as they are (a CR or LF
    would split the response): the client gets a 500 instead."""


class AppNotFound(Exception):
    """`MODULE:APP` does not name a callable."""


def load_app(spec):
    """Imports `MODULE:APP` and returns the WSGI callable (see the module doc)."""
    module_name, _, attr = spec.partition(":")
    attr = attr or "application"
    if not module_name:
        raise AppNotFound(f"{spec!r} names no module: give MODULE:APP, e.g. app:app")
    try:
        node = ast.parse(attr, mode="eval").body
    except SyntaxError:
        raise AppNotFound(f"{attr!r} is neither a name nor a call like create_app()") from None
    call = None
    if isinstance(node, ast.Call):
        call, node = node, node.func
    path = []
    while isinstance(node, ast.Attribute):
        path.insert(0, node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        raise AppNotFound(f"{attr!r} is neither a name nor a call like create_app()")
    path.insert(0, node.id)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            raise AppNotFound(
                f"no module {module_name!r} in {os.getcwd()} or on sys.path: "
                "run from the app's directory, pass --chdir DIR, or set PYTHONPATH"
            ) from None
        raise
    app = module
    for name in path:
        try:
            app = getattr(app, name)
        except AttributeError:
            raise AppNotFound(f"module {module_name!r} has no {'.'.join(path)!r}") from None
    if call is not None:
        try:
            args = [ast.literal_eval(a) for a in call.args]
            kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
        except ValueError:
            raise AppNotFound(f"{attr!r}: factory arguments must be literals") from None
        app = app(*args, **kwargs)
    if not callable(app):
        raise AppNotFound(f"{spec!r} is not callable (got {type(app).__name__})")
    return app


class FileWrapper:
    """`wsgi.file_wrapper`: iterates a file in blocks; the server sends it
    with `socket.sendfile` when it can frame the response without chunks."""

    def __init__(self, filelike, blksize=65536):
        self.filelike = filelike
        self.blksize = blksize
        if hasattr(filelike, "close"):
            self.close = filelike.close

    def __iter__(self):
        while True:
            data = self.filelike.read(self.blksize)
            if not data:
                return
            yield data


# The largest last write a worker goes idle before (Response._ending): the
# first of its response, it fits the socket's send buffer and does not wait
# for the client to read.
ENDING_WRITE_MAX = 16384


class Response:
    """The response side of one request: `start_response`, `write`, framing."""

    def __init__(self, conn, request, keepalive, timeout, leaving=lambda: False, ending=None):
        self.conn = conn
        self.leaving = leaving
        # Called once, just before the write that completes a response
        # ending the connection (Worker.ending_connection).
        self.ending = ending
        self.written = False  # a write of this response went out
        self.request = request
        self.keepalive = keepalive
        self.timeout = timeout
        self.status = None
        self.code = 0
        self.headers = []
        self.length = None  # the Content-Length the app gave, or one computed
        self.chunked = False
        self.head_sent = False
        self.sent = 0  # body bytes sent
        self.head_only = request.method == "HEAD"
        # Whether the status is one that never has a body (1xx, 204, 304).
        self.bodyless = False

    def start_response(self, status, headers, exc_info=None):
        if exc_info:
            if self.head_sent:
                raise exc_info[1].with_traceback(exc_info[2])
        elif self.status is not None:
            raise AssertionError("start_response called twice without exc_info")
        check_response_head(status, headers)
        self.status = status
        self.code = int(status[:3])
        self.bodyless = http.no_body_status(self.code)
        self.headers = []
        self.length = None
        for name, value in headers:
            lower = name.lower()
            if lower in _HOP_BY_HOP:
                if lower == "connection" and "close" in value.lower():
                    self.keepalive = False
                continue
            if lower == "content-length":
                self.length = int(value)
            self.headers.append((name, value))
        return self.write

    def _head(self):
        if self.status is None:
            raise AssertionError("the app returned without calling start_response")
        lines = ["%s %s\r\n" % (self.request.version_text, self.status)]
        lines += ["%s: %s\r\n" % pair for pair in self.headers]
        if self.length is None and not self.bodyless and not self.head_only:
            if self.keepalive and self.request.version >= (1, 1):
                self.chunked = True
                lines.append("Transfer-Encoding: chunked\r\n")
            else:
                self.keepalive = False  # the close ends the body
        if self.leaving():
            self.keepalive = False
        if not self.keepalive:
            lines.append("Connection: close\r\n")
        elif self.request.version < (1, 1):
            lines.append("Connection: keep-alive\r\n")
        lines.append("\r\n")
        return "".join(lines).encode("latin-1")

    def _send(self, data):
        http.send_all(self.conn, data, self.timeout)
        self.written = True

    def write(self, data):
        """Sends body bytes; the head goes with the first non-empty write."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"a WSGI body must be bytes, not {type(data).__name__}")
        if not data and self.head_sent:
            return
        out = b""
        if not self.head_sent:
            out = self._head()
            self.head_sent = True
        if data and not self.head_only and not self.bodyless:
            if self.length is not None:
                data = data[: max(0, self.length - self.sent)]
            self.sent += len(data)
            out += http.chunk(data) if self.chunked else bytes(data)
        if out:
            completes = self.head_only or self.bodyless or (self.length is not None and self.sent >= self.length)
            if completes and not self.written and len(out) <= ENDING_WRITE_MAX:
                self._ending()  # this write completes the response and will not wait
            self._send(out)

    def _ending(self):
        """Once, before the last write of a response that ends the
        connection."""
        if self.ending is not None and not self.keepalive:
            self.ending()
            self.ending = None

    def send_file(self, wrapper):
        """Sends a `FileWrapper` with sendfile when the framing allows;
        False when it must be iterated instead."""
        fileno = getattr(wrapper.filelike, "fileno", None)
        if fileno is None or self.head_only or self.bodyless:
            return False
        if self.length is None and self.keepalive and self.request.version >= (1, 1):
            return False  # it would need chunks
        try:
            fileno()
        except (OSError, ValueError):
            return False
        self.write(b"")
        # socket.sendfile needs a Python timeout; the reads and sends
        # around it want none (see http.Reader.fill).
        self.conn.settimeout(self.timeout)
        try:
            self.sent += self.conn.sendfile(wrapper.filelike, count=self.length)
        except OSError as e:
            raise http.ClientGone(str(e)) from e
        finally:
            self.conn.settimeout(None)
        return True

    def finish(self):
        """Ends the body. False when the connection cannot be reused."""
        if not self.head_sent:
            if self.length is None and not self.bodyless:
                self.length = 0
                self.headers.append(("Content-Length", "0"))
            self.write(b"")
        elif self.chunked:
            self._send(http.LAST_CHUNK)
        else:
            self._ending()  # a body the close ends: all of it is out
        if self.length is not None and self.sent < self.length and not self.head_only:
            if not self.bodyless:
                return False  # the app gave less than it announced
        return self.keepalive


def check_response_head(status, headers):
    """Raises BadResponse for a status or header that is not safe to send."""
    if not isinstance(status, str) or not _STATUS.fullmatch(status):
        raise BadResponse(f"the app's status {status!r} is not like '200 OK', or has a CR, LF or NUL")
    for pair in headers:
        name, value = pair if isinstance(pair, tuple) and len(pair) == 2 else (pair, None)
        if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
            raise BadResponse(f"the app's header name {name!r} is not a token")
        if not isinstance(value, str) or not _HEADER_VALUE.fullmatch(value):
            raise BadResponse(f"the app's header {name!r} has a CR, LF, NUL or another control character: {value!r}")


class Server:
    """Serves one WSGI app on the connections a forkpool worker gets."""

    def __init__(self, app, worker, limits, access_log=True):
        self.app = app
        self.worker = worker
        self.limits = limits
        self.access_log = access_log
        # Built on the first connection, in the worker itself: under
        # --preload `worker` is the template until then.
        self._listener_poll = None
        self._pool_listeners = None
        # What a Response calls just before a connection's last answer
        # goes out: the worker's `ending_connection` (None for a worker
        # without one).
        self._ending = None
        self._leaving = lambda: self.worker.leaving

    def _watch_pool_listeners(self):
        """The listeners where connections wait for any worker (in
        `kernel` dispatch the overflow, not the worker's own sockets) and
        one poll of them all, and the worker's `ending_connection`: taken
        once, in the worker (a template has neither)."""
        self._ending = getattr(self.worker, "ending_connection", None)
        self._pool_listeners = list(self.worker.pool_listeners)
        if self._pool_listeners:
            self._listener_poll = select.poll()
            for listener in self._pool_listeners:
                self._listener_poll.register(listener.fileno(), select.POLLIN)

    def handle(self, conn, _listener):
        """One connection: requests until close, a limit, or an idle timeout."""
        if self._pool_listeners is None:
            self._watch_pool_listeners()
        reader = http.Reader(conn)
        peer = _peer(conn, self.worker.peer)
        opened = None
        for number in range(self.limits.max_requests):
            if number and not self._next_request_waiting(conn, reader, opened):
                return
            started = time.monotonic()
            try:
                head = reader.read_head(self.limits, started + self.limits.head_timeout)
                if head is None:
                    return
                request = http.parse_head(head, self.limits)
            except http.HttpError as e:
                self._refuse(conn, e, peer, started)
                return
            except (http.ClientGone, OSError):
                return
            if opened is None:
                opened = started
            # Every 8th request of a kept-alive connection, a look at the
            # descriptor table: a leak must not fill it before the
            # connection ends (the worker then leaves, and this answer
            # says Connection: close).
            if number % 8 == 7:
                self.worker.check_headroom()
            # A request that ends its connection anyway needs no look at
            # the listeners (a poll) to end it.
            last = number + 1 == self.limits.max_requests or (
                request.wants_keepalive() and self._turn_over(opened, started)
            )
            if not self.serve_request(conn, reader, request, peer, last, started):
                return
            if self.worker.leaving:
                return

    def _next_request_waiting(self, conn, reader, opened):
        """Between two requests on a kept-alive connection: True when the
        client sends more within the keep-alive timeout; False when it does
        not, when the supervisor has a message (a Quit) for this worker, or
        when, its turn over (`--keepalive-turn` since `opened`), the idle
        connection gives way to a client waiting on a listener this worker
        holds that no other worker takes within a short grace."""
        if reader.buf:
            return not self.worker.channel_waiting()
        own = select.poll()
        own.register(conn.fileno(), select.POLLIN)
        own.register(self.worker.channel.fileno(), select.POLLIN)
        watch = select.poll()
        watch.register(conn.fileno(), select.POLLIN)
        watch.register(self.worker.channel.fileno(), select.POLLIN)
        for listener in self._pool_listeners:
            watch.register(listener.fileno(), select.POLLIN)
        step = GIVE_WAY_STEP * (self.worker.slot % 4 + 1)
        idle_since = time.monotonic()
        deadline = idle_since + self.limits.keepalive_timeout
        turn_ends = opened + self.limits.keepalive_turn
        while True:
            now = time.monotonic()
            if now >= deadline:
                return False
            if now < turn_ends:
                fds = {fd for fd, _ in own.poll((min(deadline, turn_ends) - now) * 1000)}
            else:
                fds = {fd for fd, _ in watch.poll((deadline - now) * 1000)}
            if not fds:
                continue
            if fds - {conn.fileno(), self.worker.channel.fileno()}:
                # A client waits: give it a moment to find a free worker.
                grace = max(step, idle_since + GIVE_WAY_IDLE - time.monotonic())
                fds = {fd for fd, _ in own.poll(grace * 1000)}
                if not fds and self._listener_poll.poll(0):
                    return False
                if not fds:
                    continue
            return conn.fileno() in fds and self.worker.channel.fileno() not in fds

    def _turn_over(self, opened, now):
        """True when a kept-alive connection has had its turn
        (`--keepalive-turn` since its first request) and a listener this
        worker holds has a connection waiting: this one is then closed
        after its response, so a kept-alive client does not keep a busy
        pool from the clients queued behind it. Not asked before the turn
        is over: closing at once would cost a new connection per request
        whenever clients outnumber workers."""
        if self._listener_poll is None or now - opened < self.limits.keepalive_turn:
            return False
        return bool(self._listener_poll.poll(0))

    def _refuse(self, conn, error, peer, started, request_line="-"):
        try:
            conn.settimeout(self.limits.read_timeout)
            conn.sendall(http.error_response(error.status, error.why))
            http.close_after_refusal(conn)
        except OSError:
            pass
        self._log(peer, request_line, error.status, "-", started)

    def serve_request(self, conn, reader, request, peer, last, started):
        """Runs the app for one request; True when the connection stays open."""
        request_line = f"{request.method} {request.target} {request.version_text}"
        try:
            expect = request.expects_continue()
            framing, length = request.body_framing(self.limits)
        except http.HttpError as e:
            self._refuse(conn, e, peer, started, request_line)
            return False
        continued = []
        send_continue = None
        if expect:

            def send_continue():
                http.send_all(conn, b"HTTP/1.1 100 Continue\r\n\r\n", self.limits.read_timeout)
                continued.append(True)

        body = http.Body(reader, self.limits, framing, length, send_continue)
        response = Response(
            conn,
            request,
            request.wants_keepalive() and not last and not self.worker.leaving,
            self.limits.read_timeout,
            self._leaving,
            self._ending,
        )
        environ = self.environ(request, body, peer, conn)
        keep = False
        try:
            keep = self._run_app(environ, response, body)
        except http.ClientGone:
            keep = False
        except http.HttpError as e:  # from reading the body
            if not response.head_sent:
                self._refuse(conn, e, peer, started, request_line)
                return False
            keep = False
        except BadResponse as e:
            os.write(2, f"forkpool_wsgi: 500 instead of the app's answer to {request_line}: {e}\n".encode("utf-8", "replace"))
            if not response.head_sent:
                error = http.HttpError(500, "the application's response could not be sent")
                self._refuse(conn, error, peer, started, request_line)
                return False
            keep = False
        except Exception:
            traceback.print_exc(file=sys.stderr)
            sys.stderr.flush()
            if not response.head_sent:
                error = http.HttpError(500, "the application raised an exception")
                self._refuse(conn, error, peer, started, request_line)
                return False
            keep = False
        if keep and not body.done:
            # The client may still be sending a body the app did not read:
            # drop a little of it to reuse the connection, or close.
            keep = (not expect or continued) and _drained(body)
        self._log(peer, request_line, response.code, response.sent, started)
        return keep and not self.worker.leaving

    def _run_app(self, environ, response, body):
        result = self.app(environ, response.start_response)
        try:
            if isinstance(result, FileWrapper) and response.status is not None:
                if response.send_file(result):
                    return response.finish()
            if response.length is None and isinstance(result, (list, tuple)):
                total = sum(len(part) for part in result)
                response.length = total
                response.headers.append(("Content-Length", str(total)))
            for data in result:
                response.write(data)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        return response.finish()

    def environ(self, request, body, peer, conn):
        """The PEP 3333 environ for one request. SERVER_NAME and SERVER_PORT
        come from the Host header (port 80 when it names none); only a
        request without one (HTTP/1.0) costs a getsockname."""
        host = request.headers.get("host", "")
        server_name, _, server_port = host.rpartition(":") if host.rsplit(":", 1)[-1].isdigit() else (host, "", "80")
        if not server_name:
            server_name, server_port = _local(conn)
        env = {
            "REQUEST_METHOD": request.method,
            "SCRIPT_NAME": "",
            "PATH_INFO": _path_info(request.path),
            "QUERY_STRING": request.query,
            "RAW_URI": request.target,
            "SERVER_NAME": server_name,
            "SERVER_PORT": server_port,
            "SERVER_PROTOCOL": request.version_text,
            "REMOTE_ADDR": peer[0],
            "REMOTE_PORT": peer[1],
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "http",
            "wsgi.input": body,
            "wsgi.input_terminated": True,
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": False,
            "wsgi.multiprocess": True,
            "wsgi.run_once": False,
            "wsgi.file_wrapper": FileWrapper,
            "forkpool.recycle": self.worker.leave,
            "forkpool.slot": self.worker.slot,
        }
        for name, value in request.headers.items():
            key = _ENVIRON_KEYS.get(name) or _environ_key(name)
            if key:
                env[key] = value
        if body.chunked:
            env.pop("CONTENT_LENGTH", None)
        elif request.content_length is not None:
            env["CONTENT_LENGTH"] = str(request.content_length)  # `5, 5` is 5
        return env

    def _log(self, peer, request_line, status, sent, started):
        if not self.access_log:
            return
        stamp = time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime())
        line = '%s - - [%s] "%s" %s %s %.6f slot=%d\n' % (
            peer[0] or "-",
            stamp,
            request_line.replace('"', "%22"),
            status,
            sent if sent else "-",
            time.monotonic() - started,
            self.worker.slot,
        )
        os.write(2, line.encode("utf-8", "replace"))


def _path_info(path):
    """PATH_INFO: the target's path with its %XX escapes decoded, each
    byte a Latin-1 character (PEP 3333). The target holds ASCII only."""
    if "%" not in path:
        return path
    return urllib.parse.unquote_to_bytes(path).decode("latin-1")


def _environ_key(name):
    """The environ key of header `name` (lower case): HTTP_ and the name in
    upper case with dashes as underscores; CONTENT_TYPE and CONTENT_LENGTH
    without the prefix; None for a name with an underscore, which would be
    confused with a dash (gunicorn drops them too)."""
    if "_" in name:
        return None
    key = name.upper().replace("-", "_")
    return key if key in ("CONTENT_TYPE", "CONTENT_LENGTH") else "HTTP_" + key


# The keys of the headers most requests carry, worked out once.
_ENVIRON_KEYS = {
    name: _environ_key(name)
    for name in (
        "host", "connection", "user-agent", "accept", "accept-encoding", "accept-language",
        "content-type", "content-length", "cookie", "referer", "origin", "authorization",
        "cache-control", "x-forwarded-for", "x-forwarded-proto", "x-real-ip",
    )
}


def _drained(body):
    try:
        return body.drain(DRAIN_LIMIT)
    except (http.HttpError, http.ClientGone, OSError):
        return False


def _peer(conn, accepted=None):
    """The client's (address, port) as strings: what accept() gave, if
    anything, else asked of the connection."""
    addr = accepted
    if addr is None:
        try:
            addr = conn.getpeername()
        except OSError:
            return ("", "")
    if isinstance(addr, tuple):
        return (str(addr[0]), str(addr[1]))
    return ("", "")


def _local(conn):
    try:
        addr = conn.getsockname()
    except OSError:
        return ("localhost", "0")
    if isinstance(addr, tuple):
        return (str(addr[0]), str(addr[1]))
    return ("localhost", "0")


def parse_args(argv):
    """The command line (see `python3 -m forkpool_wsgi --help`)."""
    d = http.Limits()
    p = argparse.ArgumentParser(
        prog="python3 -m forkpool_wsgi",
        description="Serve a WSGI app as a forkpool worker: "
        "forkpool run [pool options] -- python3 -m forkpool_wsgi MODULE:APP",
    )
    p.add_argument("app", metavar="MODULE:APP", help="the app: module:name, module:factory() or module (name `application`)")
    p.add_argument("--chdir", metavar="DIR", help="change to DIR before importing the app")
    p.add_argument("--no-access-log", action="store_true", help="do not log a line per request on stderr")
    p.add_argument("--head-timeout", type=_positive(float), default=d.head_timeout, metavar="SECONDS",
                   help=f"deadline for a whole request head, answered with 408 (default {d.head_timeout:g})")
    p.add_argument("--keepalive-timeout", type=_positive(float), default=d.keepalive_timeout, metavar="SECONDS",
                   help=f"how long a kept-alive connection may wait for its next request (default {d.keepalive_timeout:g})")
    p.add_argument("--keepalive-turn", type=_not_negative(float), default=d.keepalive_turn, metavar="SECONDS",
                   help="how long a kept-alive connection keeps its worker, from its first request, while other "
                   f"connections wait on the listener; the next response then closes it (default {d.keepalive_turn:g}; 0: at once)")
    p.add_argument("--body-timeout", type=_positive(float), default=d.body_timeout, metavar="SECONDS",
                   help="deadline for a whole request body, from the app's first read, answered with 408 "
                   f"(default {d.body_timeout:g})")
    p.add_argument("--read-timeout", type=_positive(float), default=d.read_timeout, metavar="SECONDS",
                   help=f"longest wait for one read of a body or one write of a response (default {d.read_timeout:g})")
    p.add_argument("--max-requests-per-connection", type=_positive(int), default=d.max_requests, metavar="N",
                   help=f"requests on one kept-alive connection before it is closed; 1 turns keep-alive off (default {d.max_requests})")
    p.add_argument("--max-request-line", type=_positive(int), default=d.max_request_line, metavar="BYTES",
                   help=f"longest request line, else 414 (default {d.max_request_line})")
    p.add_argument("--max-head", type=_positive(int), default=d.max_head, metavar="BYTES",
                   help=f"largest request head, else 431 (default {d.max_head})")
    p.add_argument("--max-headers", type=_positive(int), default=d.max_headers, metavar="N",
                   help=f"most header fields, else 431 (default {d.max_headers})")
    p.add_argument("--max-body", type=_positive(int), default=d.max_body, metavar="BYTES",
                   help=f"largest request body, else 413 (default {d.max_body})")
    return p.parse_args(argv)


def _positive(kind):
    return _bounded(kind, lambda value: value > 0, "greater than 0")


def _not_negative(kind):
    return _bounded(kind, lambda value: value >= 0, "0 or more")


def _bounded(kind, allowed, what):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if not allowed(value):
            raise argparse.ArgumentTypeError(f"{text!r} must be {what}")
        return value

    parse.__name__ = kind.__name__
    return parse


def limits_from(args):
    """The `forkpool_http.Limits` the command line asks for."""
    return http.Limits(
        head_timeout=args.head_timeout,
        keepalive_timeout=args.keepalive_timeout,
        keepalive_turn=args.keepalive_turn,
        read_timeout=args.read_timeout,
        body_timeout=args.body_timeout,
        max_requests=args.max_requests_per_connection,
        max_request_line=args.max_request_line,
        max_head=args.max_head,
        max_headers=args.max_headers,
        max_body=args.max_body,
    )


def prepare(args):
    """Everything done once, before serving: --chdir, sys.path, the import."""
    if args.chdir:
        os.chdir(args.chdir)
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    return load_app(args.app)


def serve(app, args, worker=None):
    """Serves `app` in this worker process until the supervisor says quit."""
    worker = worker or forkpool_worker.Worker.from_env()
    server = Server(app, worker, limits_from(args), access_log=not args.no_access_log)
    worker.serve(server.handle)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        app = prepare(args)
    except AppNotFound as e:
        sys.exit(f"forkpool_wsgi: {e}")
    except OSError as e:
        sys.exit(f"forkpool_wsgi: {e}")
    try:
        serve(app, args)
    except RuntimeError as e:
        sys.exit(f"forkpool_wsgi: {e}")


if __name__ == "__main__":
    main()
