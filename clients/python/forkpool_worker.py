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
replacement. The worker leaves the same way by itself when its
descriptor table is filling (a handler that leaks them; docs/protocol.md,
"Running out of descriptors"). Between two requests on one
kept-alive connection, `worker.channel_waiting()` says whether the
supervisor has sent something (a Quit), so the handler can end the
connection and let the worker read it.

Every dispatch mode is supported: `handoff` (connections arrive over the
back-channel with SCM_RIGHTS; needs Python 3.9 for `socket.recv_fds`),
`order` (accept on the inherited listener when told), `shared`/`herd`
(wait on the listeners with epoll) and `kernel` (the kernel queues each
connection on the lowest idle worker's own socket; the worker says idle or
busy on the shared scoreboard, `forkpool_board`, and reports nothing per
connection). `--dispatch none` has no back-channel at all: such a worker
just accepts on the `LISTEN_FDS` sockets.

The wire format is in forkpool's docs/protocol.md.
"""

import _socket
import ctypes
import errno
import fcntl
import gc
import os
import random
import resource
import select
import signal
import socket
import struct
import sys
import time

import forkpool_board

PROTOCOL_VERSION = 1
# Version 2: version 1 plus templates (`forkpool run --preload`).
TEMPLATE_PROTOCOL_VERSION = 2
# Longer than any message (10 bytes), so an oversized one is caught by
# MSG_TRUNC instead of being silently cut to a valid length.
_RECV_SIZE = 16
# Parent-to-child messages: kind -> payload length.
_PAYLOAD = {b"C": 2, b"A": 2, b"p": 4, b"Q": 0}
_LISTEN_FDS_START = 3


class ProtocolError(Exception):
    """The supervisor sent something this worker does not understand."""


# Descriptors kept free below the soft RLIMIT_NOFILE (at most a quarter of
# it): once the one at the reserve's start is open, the worker leaves after
# its connection (docs/protocol.md, "Running out of descriptors").
DESCRIPTOR_RESERVE = 32
# An accept failing with one of these: this process is out of descriptors
# or memory, and a retry would fail again at once.
_EXHAUSTED = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class Limits:
    """`kernel` dispatch: the memory and lifetime limits this worker checks
    itself after each connection, before it goes idle on the scoreboard
    (docs/protocol.md, "Recycling: the parent counts"): there the kernel
    gives the worker its next connection without the supervisor, which
    would learn of a limit passed only some connections later.

    `max_memory` is FORKPOOL_MAX_CHILD_MEMORY, bytes of unshared memory
    (USS); `lifetime_ms` is FORKPOOL_MAX_CHILD_LIFETIME_MS, counted from
    `start()`; 0: no limit. A pool without limits costs the worker
    nothing; a lifetime, one clock read (no system call); memory, one
    `pread` of /proc/self/statm (RSS), and /proc/self/smaps_rollup (about
    16 µs per resident MiB) only when RSS is above the limit (USS is never
    above RSS), and then only when `rollup_due` says so: a `--preload`
    worker's RSS counts what it shares with its template."""

    def __init__(self, max_memory=0, lifetime_ms=0):
        self.max_memory = max_memory
        self.lifetime_ms = lifetime_ms
        self._statm = None
        self._page = 0
        self._leave_at = None
        # What the last read of smaps_rollup found: (uss, rss, when), or None.
        self.last_rollup = None

    @classmethod
    def from_env(cls, env):
        """The limits the supervisor set in `env` (none when it set none)."""
        return cls(
            int(env.get("FORKPOOL_MAX_CHILD_MEMORY") or 0),
            int(env.get("FORKPOOL_MAX_CHILD_LIFETIME_MS") or 0),
        )

    def start(self):
        """Starts the checks in this process (a worker forked by a template
        starts them after its fork: /proc/self is then its own, and its
        lifetime counts from here). False when there is nothing to check."""
        if self._statm is not None:
            os.close(self._statm)
            self._statm = None
        if self.max_memory:
            try:
                self._statm = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
                self._page = os.sysconf("SC_PAGE_SIZE")
            except OSError as e:
                # The supervisor's own look (every second) still holds.
                print(f"forkpool worker: cannot read /proc/self/statm ({e}): "
                      "the worker does not check its memory", file=sys.stderr)
        self._leave_at = time.monotonic() + self.lifetime_ms / 1000 if self.lifetime_ms else None
        return self._statm is not None or self._leave_at is not None

    def past(self):
        """Which limit the worker is past now: "memory", "lifetime" or None."""
        if self._statm is not None:
            resident = int(os.pread(self._statm, 128, 0).split()[1]) * self._page
            # Under the limit (the usual case): no clock read either.
            if resident > self.max_memory and self.memory_past(
                    resident, time.monotonic(), _unshared_memory) is not None:
                return "memory"
        if self._leave_at is not None and time.monotonic() >= self._leave_at:
            return "lifetime"
        return None

    def memory_past(self, rss, now, read_uss):
        """The memory look, given RSS `rss` (bytes) at `now` (monotonic
        seconds): its USS when that is above the limit, read with
        `read_uss()` (and kept in `last_rollup`) only when RSS is above the
        limit and `rollup_due` says so; else None."""
        if rss <= self.max_memory or not rollup_due(self.max_memory, rss, self.last_rollup, now):
            return None
        uss = read_uss()
        self.last_rollup = (uss, rss, now)
        return uss if uss > self.max_memory else None


# The longest a worker whose RSS is above its memory limit goes between two
# reads of smaps_rollup while its RSS does not grow enough to matter, in
# seconds: memory that becomes its own without RSS growing (a copy-on-write
# break) is seen within this.
SMAPS_REREAD = 0.1


def rollup_due(limit, rss, last, now):
    """Whether a worker whose RSS, `rss`, is above its memory `limit` reads
    smaps_rollup now, given its `last` read, (uss, rss, when) or None: when
    there was none; when RSS grew since then by at least what USS had left
    below the limit (USS grows by at most what RSS grows, plus copy-on-write
    breaks, so a smaller growth cannot by itself have taken it past); or
    when SMAPS_REREAD has passed since (copy-on-write breaks raise USS
    without RSS: they are seen within that). Otherwise it counts as under
    the limit: a worker sitting above the limit on memory it shares with
    its template reads it every 100 ms at most, not after every connection."""
    if last is None:
        return True
    uss_then, rss_then, then = last
    return max(rss - rss_then, 0) >= limit - uss_then or now - then >= SMAPS_REREAD


def _unshared_memory():
    """This process's USS in bytes, as the supervisor counts it: Private_Clean
    plus Private_Dirty in /proc/self/smaps_rollup."""
    with open("/proc/self/smaps_rollup", "rb") as rollup:
        text = rollup.read()
    uss = 0
    for line in text.splitlines():
        if line.startswith((b"Private_Clean:", b"Private_Dirty:")):
            uss += int(line.split()[1]) * 1024
    return uss


def _descriptor_ceiling():
    """The descriptor at the start of the reserve, and the soft limit it
    comes from; (None, None) without a limit."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None, None
    return soft - min(DESCRIPTOR_RESERVE, soft // 4), soft


# A socket's address family as a plain number: socket.socket's own
# `family` (and `type`) make an enum on every read.
_family_of = _socket.socket.family.__get__


def _accept_from(listener):
    """`listener.accept()` without what socket.py adds per call (the
    listener's family and type read back as enums, its timeout looked
    at): the connection, close-on-exec and blocking (or with the default
    timeout, when a program set one) as accept() makes it, and the peer's
    address."""
    fd, peer = listener._accept()
    return socket.socket(_family_of(listener), socket.SOCK_STREAM, 0, fileno=fd), peer


def _dispatch_of(env, required):
    """The dispatch mode: `kernel` dispatch is announced as `handoff` plus
    FORKPOOL_KERNEL_DISPATCH=1, so that a worker written before it serves
    as in handoff."""
    dispatch = required("FORKPOOL_DISPATCH")
    if dispatch == "handoff" and env.get("FORKPOOL_KERNEL_DISPATCH") == "1":
        return "kernel"
    return dispatch

class Worker:
    """One worker process's end of the back-channel, and its listeners."""

    def __init__(
        self, channel, listeners, slot, generation, dispatch, version=1, overflow=(), board=None
    ):
        self.version = version
        self.channel = channel
        # In `kernel` dispatch, the worker's own sockets (one per pool
        # listener); otherwise the pool's listeners.
        self.listeners = listeners
        self.slot = slot
        self.generation = generation
        self.dispatch = dispatch
        self.pid = os.getpid()
        self.leaving = False
        # The peer address accept() gave for the connection being served,
        # or None (a connection handed over the channel): a handler that
        # logs it is spared a getpeername.
        self.peer = None
        # `kernel` dispatch: the pool's listeners, where connections no
        # idle worker took wait (the overflow), and this slot's record on
        # the scoreboard (a forkpool_board.Record). Without a board the
        # worker is served as in `handoff`.
        self.board = board
        # `kernel` dispatch: this worker's share of connections
        # (FORKPOOL_MAX_REQUESTS, or the seat's), after which it leaves;
        # 0: no limit.
        self.max_requests = 0
        # `kernel` dispatch: the memory and lifetime limits it checks after
        # each connection (from_env reads them), whether it checks them
        # (started with `serve`), and whether it left for one.
        self.limits = Limits()
        self._checks_limits = False
        self._past_limit = None
        self._fd_ceiling, self._fd_limit = _descriptor_ceiling()
        self._watch_overflow(overflow)

    def _watch_overflow(self, overflow):
        """Takes `overflow` as the pool's listeners in kernel dispatch."""
        self.overflow = list(overflow)
        # The listeners where a connection waits for any worker: what a
        # kept-alive connection gives way to.
        self.pool_listeners = self.overflow if self.board is not None else self.listeners
        # Idle on the board before the connection ended (ending_connection).
        self._idle_early = False
        # The descriptor table was looked at for this connection already
        # (ending_connection, when it did not go idle early after all).
        self._headroom_checked = False
        # Per listener: a poll of (channel, overflow listener) and the
        # overflow's descriptor, for the one look a finishing worker takes.
        self._finish_polls = []
        for sock in self.overflow:
            look = select.poll()
            look.register(self.channel.fileno(), select.POLLIN)
            look.register(sock.fileno(), select.POLLIN)
            self._finish_polls.append((look, sock.fileno()))

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

        if "FORKPOOL_TEMPLATE_FD" in env:
            return Template.from_env(env)
        dispatch = _dispatch_of(env, required)
        if dispatch == "none":
            raise RuntimeError(
                "the pool runs with --dispatch none, which has no back-channel: "
                "accept on the LISTEN_FDS listeners directly instead"
            )
        version = required("FORKPOOL_PROTOCOL")
        if version not in (str(PROTOCOL_VERSION), str(TEMPLATE_PROTOCOL_VERSION)):
            raise RuntimeError(
                f"the supervisor speaks back-channel protocol {version}, "
                f"this helper speaks {PROTOCOL_VERSION} and "
                f"{TEMPLATE_PROTOCOL_VERSION}"
            )
        count = 0
        if "LISTEN_FDS" in env:
            if int(required("LISTEN_PID")) != os.getpid():
                raise RuntimeError(
                    "LISTEN_PID names another process: the listeners were passed "
                    "to a parent (a shell wrapper that forks instead of exec'ing?)"
                )
            count = int(env["LISTEN_FDS"])
        channel_at = _LISTEN_FDS_START + count
        board_fd = env.get("FORKPOOL_BOARD_FD") if dispatch == "kernel" else None
        if board_fd is not None:
            # Own sockets, the channel, the overflow, then the board.
            overflow_fd = int(required("FORKPOOL_OVERFLOW_FD"))
            if overflow_fd != channel_at + 1:
                raise RuntimeError(
                    f"FORKPOOL_OVERFLOW_FD is {overflow_fd}, but with {count} "
                    f"listener(s) it must be {channel_at + 1}"
                )
            if int(board_fd) != overflow_fd + count:
                raise RuntimeError(
                    f"FORKPOOL_BOARD_FD is {board_fd}, but with {count} "
                    f"listener(s) it must be {overflow_fd + count}"
                )
        channel_fd = int(required("FORKPOOL_CHANNEL_FD"))
        if channel_fd != channel_at:
            raise RuntimeError(
                f"FORKPOOL_CHANNEL_FD is {channel_fd}, but with {count} "
                f"listener(s) it must be {channel_at}"
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
        overflow = []
        board = None
        slot = int(required("FORKPOOL_SLOT"))
        if board_fd is not None:
            overflow = [socket.socket(fileno=channel_at + 1 + i) for i in range(count)]
            os.set_inheritable(int(board_fd), False)
            # A BoardError is a RuntimeError: the caller says why and exits 1.
            board = forkpool_board.Record(int(board_fd), slot)
        # Programs the handler starts must not inherit these.
        for sock in listeners + overflow + [channel]:
            sock.set_inheritable(False)
        worker = cls(
            channel,
            listeners,
            slot,
            int(required("FORKPOOL_GENERATION")),
            dispatch,
            int(version),
            overflow,
            board,
        )
        if board is not None:
            worker.max_requests = int(env.get("FORKPOOL_MAX_REQUESTS") or 0)
        if dispatch == "kernel":
            worker.limits = Limits.from_env(env)
        return worker

    def serve(self, handle):
        """Says Ready, then serves until told to quit or the supervisor is
        gone. Returns normally in both cases; raises ProtocolError on a
        message it does not understand."""
        _run_after_fork_hooks()
        # Read again: the program may have changed its limit since.
        self._fd_ceiling, self._fd_limit = _descriptor_ceiling()
        # A worker a template forked in kernel dispatch is given its own
        # sockets and the board on its channel (S), after it says K.
        seated = self.board is None and self.dispatch == "kernel" and self.version == 2
        # K: this worker keeps its record on the scoreboard (kernel dispatch).
        keeps_board = self.board is not None or seated
        # Its lifetime counts from here, its K.
        self._checks_limits = keeps_board and self.limits.start()
        self._send(b"K" if keeps_board else b"R", struct.pack(">I", self.pid))
        try:
            if seated and not self._take_seat():
                return
            self._serve_loop(handle)
        except _BecomeTemplate as order:
            _assume(self, _template_from_worker(self, order.fd))
            self.serve(handle)

    def _serve_loop(self, handle):
        if self.board is not None:
            self._wait_on_own_sockets(handle)
        elif self.dispatch in ("handoff", "order", "kernel"):
            # `kernel` without a board: served as in handoff.
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

    def check_headroom(self):
        """After a connection (and, in a server that keeps connections
        alive, every few requests): leave (`self.leaving`) when the
        descriptor at the start of the reserve below RLIMIT_NOFILE is
        open. Descriptors are taken lowest first, so the table has filled
        up to there: an app that leaks them would soon fail its own opens,
        or this worker an accept. One fcntl."""
        if self._fd_ceiling is None or self.leaving:
            return
        try:
            fcntl.fcntl(self._fd_ceiling, fcntl.F_GETFD)
        except OSError:
            return  # not open: room left
        print(
            f"forkpool worker: descriptor {self._fd_ceiling} is open, with RLIMIT_NOFILE at "
            f"{self._fd_limit}: this worker is running out of descriptors (does the app "
            "leak them? else raise ulimit -n / LimitNOFILE); it leaves after this "
            "connection and the supervisor starts a fresh one",
            file=sys.stderr,
        )
        self.leaving = True

    def _accept_failed(self, e):
        """Says why an accept failed (not for want of a connection); one
        that ran out of descriptors or memory makes the worker leave."""
        if e.errno in _EXHAUSTED:
            print(
                f"forkpool worker: accept failed: {e}: this worker is out of descriptors "
                "or memory (does the app leak them? else raise ulimit -n / LimitNOFILE); "
                "it leaves, the connection waits for a fresh one",
                file=sys.stderr,
            )
            self.leaving = True
        else:
            print(f"forkpool worker: accept failed: {e}", file=sys.stderr)

    def channel_waiting(self, timeout=0.0):
        """True when a message (or end of file) from the supervisor waits,
        within `timeout` seconds."""
        ready, _, _ = select.select([self.channel], [], [], timeout)
        return bool(ready)

    # -- the back-channel ------------------------------------------------

    def _send(self, kind, payload=b""):
        self.channel.send(bytes([self.version]) + kind + payload)

    def _receive(self, max_fds=1):
        """One message: (kind, payload, fd or None), or None at end of file.
        With `max_fds` above 1 (a seat), the third is the list of
        descriptors."""
        # Received close-on-exec: programs the handler starts must not
        # inherit a connection, and this saves an fcntl per connection.
        data, fds, flags, _addr = socket.recv_fds(
            self.channel, _RECV_SIZE, max_fds, socket.MSG_CMSG_CLOEXEC
        )
        fd = fds[0] if fds else None
        if not data and fd is None:
            return None
        try:
            if flags & socket.MSG_TRUNC:
                raise ProtocolError("message longer than any message of protocol 1")
            if flags & socket.MSG_CTRUNC:
                raise ProtocolError("more descriptors than the message may carry")
            if data[0] != self.version:
                raise ProtocolError(f"protocol version {data[0]} is not supported")
            kind, payload = data[1:2], data[2:]
            known = _PAYLOAD if self.version == 1 else _PAYLOAD_V2
            if known.get(kind) != len(payload):
                raise ProtocolError(f"malformed message {data!r}")
            if (kind in (b"C", b"T", b"S")) != (fd is not None) or (
                len(fds) > 1 and kind != b"S"
            ):
                raise ProtocolError(f"message {data!r} with a wrong descriptor")
        except ProtocolError:
            for each in fds:
                os.close(each)
            raise
        return kind, payload, (fds if max_fds > 1 else fd)

    def _take_message(self, handle):
        """Acts on one message; False when it is time to exit."""
        message = self._receive()
        if message is None:
            return False  # the supervisor is gone
        kind, payload, fd = message
        if kind == b"p":
            self._send(b"P", payload)
        elif kind == b"Q":
            if self.board is not None:
                self._serve_what_the_kernel_queued(handle)
            return False
        elif kind == b"T":
            if self.board is not None:
                self.board.go_busy()
            raise _BecomeTemplate(fd)
        elif kind == b"C" and self.board is not None:
            (listener,) = struct.unpack(">H", payload)
            conn = self._connection(fd, listener)
            # The supervisor claimed this worker (idle to busy) already;
            # the store only makes sure of it.
            self.board.go_busy()
            self._serve_then_idle(conn, listener, handle)
        elif kind == b"C" and self.dispatch in ("handoff", "kernel"):
            (listener,) = struct.unpack(">H", payload)
            self._serve(self._connection(fd, listener), listener, handle)
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
            conn, self.peer = _accept_from(self.listeners[listener])
        except BlockingIOError:
            self._send(b"M")  # another worker was faster
            return
        except OSError as e:
            self._accept_failed(e)
            self._send(b"M")
            if self.leaving:
                self._say_leaving()
            return
        self._send(b"B")
        self._serve(conn, listener, handle)

    def _connection(self, fd, listener):
        """The socket object for a connection passed as `fd`. Its family
        is the listener's when the worker holds it, which spares the three
        system calls Python would make to find out."""
        self.peer = None
        if listener < len(self.listeners):
            family = self.listeners[listener].family
            return socket.socket(family, socket.SOCK_STREAM, 0, fileno=fd)
        return socket.socket(fileno=fd)

    def _serve(self, conn, listener, handle):
        while conn is not None:
            with conn:
                handle(conn, listener)
                self.check_headroom()
                # A leaving worker does not report Idle: the supervisor could
                # hand it a connection before it sees the exit, and that
                # connection would die with the process. It says Leaving,
                # so the exit counts as a retirement, not a death.
                if self.leaving:
                    self._say_leaving()
                    return
                following = self._take_next(listener)
                if following is None and self.leaving:  # out of descriptors
                    self._say_leaving()
                    return
                # The report goes before the close, so the client sees the
                # connection end only once the supervisor knows this worker
                # is free: a client that reconnects at once then finds the
                # same (hot) worker rather than the next one.
                try:
                    self._send(b"I" if following is None else b"N")
                except BaseException:
                    if following is not None:
                        following.close()
                    raise
            conn = following

    def _say_leaving(self):
        try:
            self._send(b"X")
        except OSError:
            pass  # the supervisor is gone; the exit says enough

    def _take_next(self, listener):
        """`handoff`: the next connection already waiting on `listener`, or
        None. Taking it here saves the supervisor's accept and hand-over; it
        would come to this worker anyway (the lowest idle one that is
        running). A message from the supervisor goes first: Quit or Ping is
        read after reporting Idle."""
        if self.dispatch != "handoff" or listener >= len(self.listeners):
            return None
        if self.channel_waiting():
            return None
        try:
            conn, peer = _accept_from(self.listeners[listener])
        except OSError as e:  # nothing waiting (EAGAIN), or a failed accept
            if e.errno in _EXHAUSTED:
                self._accept_failed(e)
            return None
        self.peer = peer
        return conn  # accept() makes it close-on-exec

    def _wait_on_listeners(self, handle, exclusive):
        """`shared` (one worker woken per connection) and `herd`."""
        poller = select.epoll()
        poller.register(self.channel.fileno(), select.EPOLLIN)
        events = select.EPOLLIN | (select.EPOLLEXCLUSIVE if exclusive else 0)
        index_of = {}
        for i, listener in enumerate(self.listeners):
            poller.register(listener.fileno(), events)
            index_of[listener.fileno()] = i
        self._take_events(poller, index_of, self._accept, handle)

    def _take_events(self, poller, index_of, accept, handle):
        """Until told to quit (or leaving): reads the channel when it is
        readable, and calls `accept(i, handle)` for a readable listener,
        `index_of` its descriptor."""
        channel_fd = self.channel.fileno()
        while True:
            for fd, _event in poller.poll():
                if fd == channel_fd:
                    if not self._take_message(handle):
                        return
                else:
                    accept(index_of[fd], handle)
                if self.leaving:
                    return

    # -- kernel dispatch (docs/protocol.md, "`kernel` dispatch") ---------
    #
    # The kernel queues a connection on this worker's own socket only after
    # reserving its idle record on the scoreboard, so the worker reports
    # nothing per connection: it stores busy on accept and idle when done,
    # counts on its record, and speaks on the channel only to answer pings
    # and, while the supervisor asks for it (word 2), to say `I`.

    def _take_seat(self):
        """A worker a template forked, after its K: waits for its seat (S:
        its own sockets, then the scoreboard), answering pings; its
        inherited listeners become its overflow. False when told to quit
        (or the supervisor is gone) first."""
        while True:
            message = self._receive(max_fds=len(self.listeners) + 1)
            if message is None:
                return False
            kind, payload, fds = message
            if kind == b"p":
                self._send(b"P", payload)
            elif kind == b"Q":
                return False
            elif kind != b"S":
                for fd in fds:
                    os.close(fd)
                raise ProtocolError(f"{kind!r} before the seat (S) in kernel dispatch")
            else:
                count, max_requests = struct.unpack(">HQ", payload)
                if count != len(self.listeners) or len(fds) != count + 1:
                    for fd in fds:
                        os.close(fd)
                    raise ProtocolError(
                        f"a seat for {count} listener(s) with {len(fds)} descriptor(s); "
                        f"this worker has {len(self.listeners)} listener(s)"
                    )
                self._sit(fds[:-1], fds[-1], max_requests)
                return True

    def _sit(self, own_fds, board_fd, max_requests):
        """Takes the seat: the board mapped (the mapping keeps its own
        descriptor), the own sockets as listeners, the inherited ones as
        the overflow."""
        try:
            self.board = forkpool_board.Record(board_fd, self.slot)
        finally:
            os.close(board_fd)
        own = [
            socket.socket(listener.family, socket.SOCK_STREAM, 0, fileno=fd)
            for listener, fd in zip(self.listeners, own_fds)
        ]
        inherited, self.listeners = self.listeners, own
        self._watch_overflow(inherited)
        self.max_requests = max_requests

    def _wait_on_own_sockets(self, handle):
        """Waits on the own sockets and the channel until told to quit."""
        waiter = select.poll()
        waiter.register(self.channel.fileno(), select.POLLIN)
        index_of = {}
        for i, listener in enumerate(self.listeners):
            waiter.register(listener.fileno(), select.POLLIN)
            index_of[listener.fileno()] = i
        if self.board.go_idle():
            self._send(b"I")
        self._take_events(waiter, index_of, self._accept_own, handle)
        if self._past_limit:
            self._await_release()

    def _check_limits(self):
        """After a connection, before the worker goes idle: past its memory
        or lifetime limit, it leaves (busy, X) instead."""
        if not self._checks_limits or self.leaving:
            return
        self._past_limit = self.limits.past()
        if self._past_limit:
            self.leaving = True

    def _await_release(self):
        """After its X for a limit: reads the channel until Q or end of file
        (ignoring what the supervisor sent before it read the X), so that
        the supervisor, which reads the worker's memory itself, finds it
        still there; it shuts its end down once it has."""
        while True:
            try:
                select.select([self.channel], [], [])
                message = self._receive()
            except BlockingIOError:
                continue
            except (OSError, ProtocolError):
                return
            if message is None or message[0] == b"Q":
                return
            if message[2] is not None:
                os.close(message[2])
    def _accept_own(self, listener, handle):
        """Accepts what the kernel queued on own socket `listener`, and
        serves it. Nothing there (a reservation given back, its client
        gone): say nothing, wait again."""
        try:
            conn, self.peer = _accept_from(self.listeners[listener])
        except (BlockingIOError, ConnectionAbortedError):
            return
        except OSError as e:
            self._accept_failed(e)
            if self.leaving:  # busy, so the kernel queues nothing more here
                self.board.go_busy()
                self._say_leaving()
            return
        record = self.board
        record.state.value = forkpool_board.BUSY
        record.taken.value += 1
        self._serve_then_idle(conn, listener, handle)

    def ending_connection(self):
        """The connection being served ends with the response about to go
        out (a server calls this just before the write that completes
        it). In kernel dispatch the worker goes idle now, not after it has
        closed the connection, so that a client that reconnects the moment
        it has the answer (as one told `Connection: close` does) finds this
        worker idle and lands on it again, on the CPU it shares with it,
        rather than on a cold one. Not when something may wait on the
        overflow (the finish takes it), nor when the worker leaves after
        this connection (told to, its share served, or past its memory or
        lifetime limit); nothing outside kernel dispatch."""
        record = self.board
        if record is None or self._idle_early or self._headroom_checked:
            return
        self.check_headroom()
        self._check_limits()
        self._headroom_checked = True
        if self.leaving:
            return
        if self.max_requests and record.served.value + 1 >= self.max_requests:
            return
        if record.overflow_may_wait():
            return
        self._idle_early = True
        if record.go_idle():
            self._send(b"I")

    def _serve_then_idle(self, conn, listener, handle):
        """Serves `conn`, then finishes it: takes the next connection
        waiting on the overflow, if any, or goes idle on the scoreboard
        (and says `I` if the supervisor asks). The finished connection is
        closed only then, so a client that reconnects the moment it sees
        the close finds this same worker idle."""
        record = self.board
        while conn is not None:
            try:
                handle(conn, listener)
                record.served.value += 1
                if not self._headroom_checked:  # else checked in ending_connection
                    self.check_headroom()
                    self._check_limits()
                self._headroom_checked = False
                idle_early, self._idle_early = self._idle_early, False
                if self.max_requests and record.served.value >= self.max_requests:
                    self.leaving = True  # its share served
                if self.leaving:
                    record.go_busy()
                    self._say_leaving()
                    return
                if idle_early:  # idle already (ending_connection)
                    return
                following = self._take_from_overflow(listener)
                if following is None and self.leaving:  # out of descriptors
                    record.go_busy()
                    self._say_leaving()
                    return
                if following is not None:
                    record.taken.value += 1
                    record.next.value += 1
                elif record.go_idle():
                    self._send(b"I")
            finally:
                conn.close()
            conn = following

    def _take_from_overflow(self, listener):
        """The next connection waiting on overflow listener `listener`, or
        None. Nothing is asked when the board says no connection can wait
        on any overflow (at light load, nearly always), or that this slot
        is outside the dispatch width (word 5: the worker goes idle, and
        the kernel gives it nothing new either). Else one poll asks both
        whether a message waits (it goes first: the worker goes idle and
        reads it) and whether a connection does, so finding nothing costs
        one system call."""
        if listener >= len(self._finish_polls) or not self.board.overflow_may_wait():
            return None
        look, overflow_fd = self._finish_polls[listener]
        ready = look.poll(0)
        if len(ready) != 1 or ready[0][0] != overflow_fd:
            return None
        try:
            conn, peer = _accept_from(self.overflow[listener])
        except OSError as e:  # another worker or the supervisor was faster
            if e.errno in _EXHAUSTED:
                self._accept_failed(e)
            return None
        self.board.count_overflow_taken()
        self.peer = peer
        return conn  # accept() makes it close-on-exec

    def _serve_what_the_kernel_queued(self, handle):
        """Told to quit: busy on the scoreboard, so the kernel queues
        nothing more, then serves what it queued just before on the own
        sockets (until accept finds nothing)."""
        record = self.board
        record.go_busy()
        # Leaving: no early idle (ending_connection) while it drains, and
        # a server closes what it serves now.
        self.leaving = True
        for listener, sock in enumerate(self.listeners):
            while True:
                try:
                    conn, self.peer = _accept_from(sock)
                except OSError:
                    break
                record.taken.value += 1
                with conn:
                    handle(conn, listener)
                record.served.value += 1


# --- Stack dumps (docs/protocol.md, "Stack dumps") --------------------------
# On SIGURG the worker writes the stack of every thread to stderr (which the
# supervisor logs with the slot) and carries on: a slow request can then be
# seen where it is stuck without stopping it. SIGURG is ignored by default,
# so a program that never installs this is not killed by it either.
import faulthandler  # noqa: E402
import signal  # noqa: E402

STACK_DUMP_SIGNAL = signal.SIGURG


def install_stack_dump(file=None):
    """Dump every thread's stack to `file` (stderr by default) on
    STACK_DUMP_SIGNAL. Importing this module already does it for stderr;
    call it again to send the dumps elsewhere."""
    faulthandler.register(
        STACK_DUMP_SIGNAL,
        file=sys.stderr if file is None else file,
        all_threads=True,
        chain=False,
    )


install_stack_dump()

# -- templates (`forkpool run --preload`, protocol version 2) -------------
#
# Everything below is the template side: docs/protocol.md, "Templates".
# A program needs no change to run as a template: `Worker.from_env()`
# returns a Template when FORKPOOL_TEMPLATE_FD is set, and its `serve`
# forks workers that run the very same `handle`.

# A version 2 worker also understands T (become the template).
# A worker a template forked in kernel dispatch is given its seat (S:
# listeners u16, max_requests u64) once, after its K.
_PAYLOAD_V2 = {**_PAYLOAD, b"T": 0, b"S": 10}
# Supervisor-to-template messages: kind -> payload length.
_TEMPLATE_PAYLOAD = {b"F": 8, b"p": 4, b"Q": 0}
_PR_SET_PDEATHSIG = 1
# How long a forked worker waits for its intermediate parent to exit.
_REPARENT_DEADLINE = 5.0

_after_fork_hooks = []


def after_fork(fn):
    """Registers `fn()` to run in every worker just before it says Ready:
    right after the fork when the worker comes from a template, at start-up
    otherwise, so a program behaves the same with and without --preload.
    Reopen connections and files there. Usable as a decorator."""
    _after_fork_hooks.append(fn)
    return fn


Worker.after_fork = staticmethod(after_fork)


def _run_after_fork_hooks():
    random.seed()  # a forked worker must not repeat the template's sequence
    for hook in _after_fork_hooks:
        hook()


class _BecomeTemplate(Exception):
    """The supervisor sent T: this worker is the pool's template now."""

    def __init__(self, fd):
        super().__init__("become the template")
        self.fd = fd


def _prctl():
    """libc's prctl, looked up once: a template looks it up before it forks
    so that each worker does not build its own ctypes objects (memory it
    would not share)."""
    global _PRCTL
    if _PRCTL is None:
        _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
    return _PRCTL


_PRCTL = None


def _set_parent_death_signal(sig):
    if _prctl()(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")


class Template:
    """A loaded program that forks workers when the supervisor asks."""

    def __init__(self, channel, listeners, generation, dispatch, supervisor_pid):
        self.channel = channel
        self.listeners = listeners
        self.generation = generation
        self.dispatch = dispatch
        self.supervisor_pid = supervisor_pid
        self.pid = os.getpid()

    @classmethod
    def from_env(cls, environ=None):
        """The template channel and listeners `forkpool run --preload` passed."""
        env = os.environ if environ is None else environ

        def required(name):
            value = env.get(name)
            if value is None:
                raise RuntimeError(
                    f"{name} is not set, but FORKPOOL_TEMPLATE_FD is: run this "
                    "program under `forkpool run --preload ... -- python3 PROGRAM`"
                )
            return value

        version = required("FORKPOOL_PROTOCOL")
        if version != str(TEMPLATE_PROTOCOL_VERSION):
            raise RuntimeError(
                f"FORKPOOL_TEMPLATE_FD is set with protocol {version}; templates "
                f"speak protocol {TEMPLATE_PROTOCOL_VERSION}"
            )
        count = 0
        if "LISTEN_FDS" in env:
            if int(required("LISTEN_PID")) != os.getpid():
                raise RuntimeError("LISTEN_PID names another process")
            count = int(env["LISTEN_FDS"])
        fd = int(required("FORKPOOL_TEMPLATE_FD"))
        if fd != _LISTEN_FDS_START + count:
            raise RuntimeError(
                f"FORKPOOL_TEMPLATE_FD is {fd}, but with {count} listener(s) "
                f"it must be {_LISTEN_FDS_START + count}"
            )
        channel = socket.socket(fileno=fd)
        if channel.type != socket.SOCK_SEQPACKET:
            raise RuntimeError(f"descriptor {fd} is not the template channel")
        listeners = [
            socket.socket(fileno=_LISTEN_FDS_START + i) for i in range(count)
        ]
        for sock in listeners + [channel]:
            sock.set_inheritable(False)
        return cls(
            channel,
            listeners,
            int(required("FORKPOOL_GENERATION")),
            _dispatch_of(env, required),
            int(required("FORKPOOL_SUPERVISOR_PID")),
        )

    def serve(self, handle):
        """Says Ready, then forks a worker for each Fork order; each worker
        serves `handle` as an ordinary worker would. Returns when told to
        quit or when the supervisor is gone (in the template), or when the
        worker is done (in a worker)."""
        # The collector would write to every preloaded object it scans, and
        # so copy the pages workers share: freeze them out of its reach.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        _prctl()
        # The kernel reaps each intermediate child as it exits, so the
        # template takes the next order at once rather than waiting for
        # the intermediate to be scheduled, fork and exit.
        self._sigchld = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        worker = None
        try:
            worker = self._serve_orders()
        finally:
            if worker is None:
                signal.signal(signal.SIGCHLD, self._restored_sigchld())
        if worker is not None:
            if gc_was_enabled:
                gc.enable()
            _assume(self, worker)
            self.serve(handle)

    def _serve_orders(self):
        """Answers the supervisor until told to quit (None) or until this
        process is a newly forked worker (that Worker)."""
        self._send(b"R", struct.pack(">I", self.pid))
        while True:
            message = self._receive()
            if message is None:
                return None
            kind, payload, fds = message
            if kind == b"p":
                self._send(b"P", payload)
            elif kind == b"Q":
                return None
            else:  # F
                slot, generation = struct.unpack(">II", payload)
                worker = self._fork(slot, generation, fds)
                if worker is not None:
                    return worker

    def _restored_sigchld(self):
        # signal.signal returns None for a disposition set outside Python.
        return signal.SIG_DFL if self._sigchld is None else self._sigchld

    def _send(self, kind, payload=b""):
        self.channel.send(bytes([TEMPLATE_PROTOCOL_VERSION]) + kind + payload)

    def _receive(self):
        data, fds, flags, _addr = socket.recv_fds(self.channel, _RECV_SIZE, 4)
        if not data and not fds:
            return None
        try:
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                raise ProtocolError("message or descriptors cut short")
            if data[0] != TEMPLATE_PROTOCOL_VERSION:
                raise ProtocolError(f"protocol version {data[0]} is not supported")
            kind, payload = data[1:2], data[2:]
            if _TEMPLATE_PAYLOAD.get(kind) != len(payload):
                raise ProtocolError(f"malformed template message {data!r}")
            if len(fds) != (2 if kind == b"F" else 0):
                raise ProtocolError(f"{data!r} came with {len(fds)} descriptor(s)")
        except ProtocolError:
            for fd in fds:
                os.close(fd)
            raise
        return kind, payload, fds

    def _fork(self, slot, generation, fds):
        """The double fork. Returns a Worker in the worker, None elsewhere."""
        gc.freeze()
        try:
            intermediate = os.fork()
        except OSError as e:
            self._send(b"E", struct.pack(">II", slot, e.errno or 0))
            for fd in fds:
                os.close(fd)
            return None
        if intermediate == 0:
            me = os.getpid()
            if self._intermediate(slot) == 0:
                return self._become_worker(slot, generation, fds, me)
            os._exit(0)
        for fd in fds:
            os.close(fd)
        return None  # the intermediate is reaped by the kernel (SIGCHLD ignored)

    def _intermediate(self, slot):
        """In the intermediate child: fork the worker and report it. Returns
        0 in the worker; the intermediate itself never returns."""
        # The template's SIG_IGN would make the kernel reap a worker that
        # dies before this process exits: nobody would see it go, and its
        # slot would never be freed. With the default, it stays a zombie
        # for the supervisor to reap once it adopts it.
        try:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            worker = os.fork()
        except OSError as e:
            self._send(b"E", struct.pack(">II", slot, e.errno or 0))
            os._exit(0)
        except BaseException:
            os._exit(1)
        if worker == 0:
            return 0
        try:
            self._send(b"W", struct.pack(">II", slot, worker))
        finally:
            os._exit(0)

    def _become_worker(self, slot, generation, fds, intermediate):
        """In the forked worker: steps 1-4 of "What the forked worker does".
        `intermediate` is the pid of its parent at the fork (taken before
        the fork: by now that parent may be gone)."""
        # The worker's children are its own to wait for.
        signal.signal(signal.SIGCHLD, self._restored_sigchld())
        channel_fd, stderr_fd = fds
        place = _LISTEN_FDS_START + len(self.listeners)
        # 1. Close the template channel and whatever the program opened.
        self.channel.detach()
        keep = {0, 1, 2, channel_fd, stderr_fd}
        keep.update(s.fileno() for s in self.listeners)
        for listener in self.listeners:
            listener.detach()  # the Worker built below owns them now
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass  # the directory's own descriptor, already closed
        # 2. Channel to 3+n, stderr to 2.
        os.dup2(stderr_fd, 2)
        os.dup2(channel_fd, place)
        for fd in (channel_fd, stderr_fd):
            if fd not in (2, place):
                os.close(fd)
        # 3. The environment of an exec'd worker.
        os.environ.pop("FORKPOOL_TEMPLATE_FD", None)
        os.environ["FORKPOOL_CHANNEL_FD"] = str(place)
        os.environ["FORKPOOL_SLOT"] = str(slot)
        os.environ["FORKPOOL_GENERATION"] = str(generation)
        if self.listeners:
            os.environ["LISTEN_PID"] = str(os.getpid())
        # 4. The parent-death signal fires when the current parent dies, and
        # the intermediate dies at once: arm it only once reparented.
        deadline = time.monotonic() + _REPARENT_DEADLINE
        # The kernel sends the signal while it reparents, so wait until the
        # intermediate is reaped (its /proc entry gone), not just until
        # getppid() has changed.
        while os.getppid() == intermediate or os.path.exists(f"/proc/{intermediate}"):
            if time.monotonic() > deadline:
                sys.exit("forkpool worker: not reparented to the supervisor")
            time.sleep(0.0002)
        _set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != self.supervisor_pid:
            sys.exit(
                f"forkpool worker: parent is {os.getppid()}, not the supervisor "
                f"{self.supervisor_pid}: the supervisor is gone"
            )
        return Worker.from_env()


def _assume(obj, other):
    """Turns `obj` into `other`, in place. A program keeps the object
    `Worker.from_env()` gave it (`worker.slot`, `worker.pid` and
    `worker.leave()` in its handler): under `--preload` that object is the
    Template, and in each forked worker it must become that worker (and in
    a refork, the worker becomes the template), so the same program runs
    with and without `--preload`."""
    obj.__class__ = other.__class__
    obj.__dict__ = other.__dict__


def _template_from_worker(worker, fd):
    """Refork: the worker `worker` becomes the template, on channel `fd`.
    A seated kernel dispatch worker gives up its own sockets and the
    board first: a template holds the pool's listeners (its overflow)."""
    if worker.board is not None:
        for sock in worker.listeners:
            sock.close()
        worker.board.close()
        worker.board = None
        worker.listeners = worker.overflow
    place = _LISTEN_FDS_START + len(worker.listeners)
    worker.channel.close()
    if fd != place:
        os.dup2(fd, place, inheritable=False)
        os.close(fd)
    os.environ.pop("FORKPOOL_CHANNEL_FD", None)
    os.environ.pop("FORKPOOL_SLOT", None)
    os.environ["FORKPOOL_TEMPLATE_FD"] = str(place)
    supervisor_pid = int(os.environ.get("FORKPOOL_SUPERVISOR_PID", os.getppid()))
    return Template(
        socket.socket(fileno=place),
        worker.listeners,
        worker.generation,
        worker.dispatch,
        supervisor_pid,
    )
