"""Serve connections as a forkpool worker, in Python (standard library only).

`forkpool run -- python3 my_worker.py` starts this program once per slot.
The supervisor decides which worker gets each connection and how many
workers there are; the worker only has to say when it is ready and idle,
and answer pings. This module does that part:

    import forkpool_worker

    def handle(conn, listener):
        conn.sendall(b"hello\\n")

    forkpool_worker.Worker.from_env().serve(handle)

`handle` is called once per connection with a connected, blocking
`socket.socket` and the index of the listener it arrived on. The worker
closes the connection after `handle` returns. An exception in `handle`
ends the worker process (with the traceback on stderr, which the
supervisor logs with the slot); the supervisor starts a replacement.

A handler that knows its process is no longer fit to serve (a leak, a
broken library) calls `worker.leave()`: after the current connection
`serve` returns without reporting Idle (so no new connection can be on its
way to it), the process exits with status 0 and the supervisor starts a
replacement. Between two requests on one
kept-alive connection, `worker.channel_waiting()` says whether the
supervisor has sent something (a Quit), so the handler can end the
connection and let the worker read it.

Every dispatch mode is supported: `handoff` (connections arrive over the
back-channel with SCM_RIGHTS; needs Python 3.9 for `socket.recv_fds`),
`order` (accept on the inherited listener when told) and `shared`/`herd`
(wait on the listeners with epoll). `--dispatch none` has no back-channel
at all: such a worker just accepts on the `LISTEN_FDS` sockets.

The wire format is in forkpool's docs/protocol.md.
"""

import os
import select
import socket
import struct
import sys

PROTOCOL_VERSION = 1
# Longer than any message (10 bytes), so an oversized one is caught by
# MSG_TRUNC instead of being silently cut to a valid length.
_RECV_SIZE = 16
# Parent-to-child messages: kind -> payload length.
_PAYLOAD = {b"C": 2, b"A": 2, b"p": 4, b"Q": 0}
_LISTEN_FDS_START = 3


class ProtocolError(Exception):
    """The supervisor sent something this worker does not understand."""


class Worker:
    """One worker process's end of the back-channel, and its listeners."""

    def __init__(self, channel, listeners, slot, generation, dispatch):
        self.channel = channel
        self.listeners = listeners
        self.slot = slot
        self.generation = generation
        self.dispatch = dispatch
        self.pid = os.getpid()
        self.leaving = False

    @classmethod
    def from_env(cls, environ=None):
        """Finds the back-channel and listeners `forkpool run` passed.

        Raises RuntimeError, naming the fix, when the program was not
        started by `forkpool run` or the environment is inconsistent.
        """
        env = os.environ if environ is None else environ

        def required(name):
            value = env.get(name)
            if value is None:
                raise RuntimeError(
                    f"{name} is not set: run this program under "
                    "`forkpool run ... -- python3 PROGRAM`"
                )
            return value

        dispatch = required("FORKPOOL_DISPATCH")
        if dispatch == "none":
            raise RuntimeError(
                "the pool runs with --dispatch none, which has no back-channel: "
                "accept on the LISTEN_FDS listeners directly instead"
            )
        version = required("FORKPOOL_PROTOCOL")
        if version != str(PROTOCOL_VERSION):
            raise RuntimeError(
                f"the supervisor speaks back-channel protocol {version}, "
                f"this helper speaks {PROTOCOL_VERSION}"
            )
        count = 0
        if "LISTEN_FDS" in env:
            if int(required("LISTEN_PID")) != os.getpid():
                raise RuntimeError(
                    "LISTEN_PID names another process: the listeners were passed "
                    "to a parent (a shell wrapper that forks instead of exec'ing?)"
                )
            count = int(env["LISTEN_FDS"])
        channel_fd = int(required("FORKPOOL_CHANNEL_FD"))
        if channel_fd != _LISTEN_FDS_START + count:
            raise RuntimeError(
                f"FORKPOOL_CHANNEL_FD is {channel_fd}, but with {count} "
                f"listener(s) it must be {_LISTEN_FDS_START + count}"
            )
        # socket(fileno=...) asks the kernel for family and type and leaves
        # the descriptor's flags alone. That matters for the listeners:
        # their open file is shared with the supervisor and every other
        # worker, so they must stay non-blocking (never setblocking on them).
        listeners = [
            socket.socket(fileno=_LISTEN_FDS_START + i) for i in range(count)
        ]
        channel = socket.socket(fileno=channel_fd)
        if channel.type != socket.SOCK_SEQPACKET:
            raise RuntimeError(f"descriptor {channel_fd} is not the back-channel")
        # Programs the handler starts must not inherit these.
        for sock in listeners + [channel]:
            sock.set_inheritable(False)
        return cls(
            channel,
            listeners,
            int(required("FORKPOOL_SLOT")),
            int(required("FORKPOOL_GENERATION")),
            dispatch,
        )

    def serve(self, handle):
        """Says Ready, then serves until told to quit or the supervisor is
        gone. Returns normally in both cases; raises ProtocolError on a
        message it does not understand."""
        self._send(b"R", struct.pack(">I", self.pid))
        if self.dispatch in ("handoff", "order"):
            while self._take_message(handle) and not self.leaving:
                pass
        elif self.dispatch in ("shared", "herd"):
            self._wait_on_listeners(handle, exclusive=self.dispatch == "shared")
        else:
            raise ProtocolError(f"unknown dispatch mode {self.dispatch!r}")

    def leave(self):
        """Asks to exit after the current connection: `serve` returns
        without reporting Idle, and the supervisor starts a replacement."""
        self.leaving = True

    def channel_waiting(self, timeout=0.0):
        """True when a message (or end of file) from the supervisor waits,
        within `timeout` seconds."""
        ready, _, _ = select.select([self.channel], [], [], timeout)
        return bool(ready)

    # -- the back-channel ------------------------------------------------

    def _send(self, kind, payload=b""):
        self.channel.send(bytes([PROTOCOL_VERSION]) + kind + payload)

    def _receive(self):
        """One message: (kind, payload, fd or None), or None at end of file."""
        data, fds, flags, _addr = socket.recv_fds(self.channel, _RECV_SIZE, 1)
        fd = fds[0] if fds else None
        if not data and fd is None:
            return None
        try:
            if flags & socket.MSG_TRUNC:
                raise ProtocolError("message longer than any message of protocol 1")
            if data[0] != PROTOCOL_VERSION:
                raise ProtocolError(f"protocol version {data[0]} is not supported")
            kind, payload = data[1:2], data[2:]
            if _PAYLOAD.get(kind) != len(payload):
                raise ProtocolError(f"malformed message {data!r}")
            if (kind == b"C") != (fd is not None):
                raise ProtocolError(f"message {data!r} with a wrong descriptor")
        except ProtocolError:
            if fd is not None:
                os.close(fd)
            raise
        return kind, payload, fd

    def _take_message(self, handle):
        """Acts on one message; False when it is time to exit."""
        message = self._receive()
        if message is None:
            return False  # the supervisor is gone
        kind, payload, fd = message
        if kind == b"p":
            self._send(b"P", payload)
        elif kind == b"Q":
            return False
        elif kind == b"C" and self.dispatch == "handoff":
            (listener,) = struct.unpack(">H", payload)
            conn = socket.socket(fileno=fd)
            conn.set_inheritable(False)
            self._serve(conn, listener, handle)
        elif kind == b"A" and self.dispatch == "order":
            (listener,) = struct.unpack(">H", payload)
            if listener >= len(self.listeners):
                raise ProtocolError(f"told to accept on unknown listener {listener}")
            self._accept(listener, handle)
        else:
            if fd is not None:
                os.close(fd)
            raise ProtocolError(f"{kind!r} is not expected in {self.dispatch} mode")
        return True

    # -- connections -----------------------------------------------------

    def _accept(self, listener, handle):
        """Accepts one connection: B and serve it, or M if none is waiting."""
        try:
            conn, _addr = self.listeners[listener].accept()
        except BlockingIOError:
            self._send(b"M")  # another worker was faster
            return
        except OSError as e:
            print(f"forkpool worker: accept failed: {e}", file=sys.stderr)
            self._send(b"M")
            return
        self._send(b"B")
        self._serve(conn, listener, handle)

    def _serve(self, conn, listener, handle):
        # Keep a duplicate open until Idle is sent, so the client sees the
        # connection close only once the supervisor knows this worker is
        # free: a client that reconnects at once then finds the same (hot)
        # worker rather than the next one.
        held = os.dup(conn.fileno())
        try:
            with conn:
                handle(conn, listener)
            # A leaving worker does not report Idle: the supervisor could
            # hand it a connection before it sees the exit, and that
            # connection would die with the process.
            if not self.leaving:
                self._send(b"I")
        finally:
            os.close(held)

    def _wait_on_listeners(self, handle, exclusive):
        """`shared` (one worker woken per connection) and `herd`."""
        poller = select.epoll()
        poller.register(self.channel.fileno(), select.EPOLLIN)
        events = select.EPOLLIN | (select.EPOLLEXCLUSIVE if exclusive else 0)
        index_of = {}
        for i, listener in enumerate(self.listeners):
            poller.register(listener.fileno(), events)
            index_of[listener.fileno()] = i
        while True:
            for fd, _event in poller.poll():
                if fd == self.channel.fileno():
                    if not self._take_message(handle):
                        return
                else:
                    self._accept(index_of[fd], handle)
                if self.leaving:
                    return
