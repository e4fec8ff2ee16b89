"""A template (`forkpool run --preload`) written as a hostile or careless
author would write it, for the supervisor's tests. It is the real Python
helper with one step changed, chosen by the first argument:

  lie-pid       `W` names the pid in $HOSTILE_PID instead of the worker's
  lie-template  `W` names the template itself
  forge         `W` names the pid in $HOSTILE_PID, and the worker sends its
                first message with that pid in forged SCM_CREDENTIALS (which
                the kernel allows a sender with CAP_SYS_ADMIN: run as root)
  lie-slot      the first worker is named honestly (its pid written to
                $HOSTILE_PID_FILE); every later `W` names that first worker,
                a second after the order
  silent        fork orders are closed and never answered
  reaped        SIGCHLD stays ignored in the intermediate and the worker
                dies before the intermediate exits, so the kernel reaps it
                and the supervisor never sees it go
  helper        the template starts a helper process that keeps the
                listeners, and writes its pid to $HOSTILE_PID_FILE
  flood         the template writes to stderr without pause once ready
  deaf          the template and its workers ignore SIGTERM and every Quit

Every worker that does come to life serves `ok` and closes.
"""

import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import forkpool_worker  # noqa: E402

MODE = sys.argv[1]
Template = forkpool_worker.Template


def say_forked(template, slot, pid):
    template._send(b"W", struct.pack(">II", slot, pid))


if MODE in ("lie-pid", "lie-template", "forge"):
    honest_intermediate = Template._intermediate

    def _intermediate(self, slot):
        worker = os.fork()
        if worker == 0:
            return 0
        liar = int(os.environ["HOSTILE_PID"]) if MODE != "lie-template" else self.pid
        try:
            say_forked(self, slot, liar)
        finally:
            os._exit(0)

    Template._intermediate = _intermediate

    if MODE == "forge":

        def _send(self, kind, payload=b""):
            liar = int(os.environ["HOSTILE_PID"])
            creds = struct.pack("iII", liar, os.getuid(), os.getgid())
            self.channel.sendmsg(
                [bytes([self.version]) + kind + payload],
                [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, creds)],
            )

        forkpool_worker.Worker._send = _send

elif MODE == "lie-slot":
    first_worker_file = os.environ["HOSTILE_PID_FILE"]

    def _intermediate(self, slot):
        worker = os.fork()
        if worker == 0:
            return 0
        try:
            # Exactly one intermediate creates the file: its worker is the
            # first, named honestly. Orders can come two at a time.
            fd = os.open(first_worker_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            named = 0
            while not named:
                try:
                    with open(first_worker_file) as f:
                        named = int(f.read() or 0)
                except ValueError:
                    pass
                if not named:
                    time.sleep(0.01)
            # Lie once the first worker has been verified (and moved to a
            # process group of its own), so it outlives this template.
            time.sleep(1)
        else:
            os.write(fd, str(worker).encode())
            os.close(fd)
            named = worker
        try:
            say_forked(self, slot, named)
        finally:
            os._exit(0)

    Template._intermediate = _intermediate

elif MODE == "silent":

    def _fork(self, slot, generation, fds):
        for fd in fds:
            os.close(fd)
        return None

    Template._fork = _fork

elif MODE == "reaped":

    def _intermediate(self, slot):
        # SIGCHLD ignored here, as in the intermediate of a template that
        # follows the letter of an older protocol.md.
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        worker = os.fork()
        if worker == 0:
            os._exit(3)
        time.sleep(0.2)  # the worker is gone, reaped by the kernel
        try:
            say_forked(self, slot, worker)
        finally:
            os._exit(0)

    Template._intermediate = _intermediate

elif MODE == "helper":
    listeners = [3 + i for i in range(int(os.environ.get("LISTEN_FDS", "0")))]
    helper = subprocess.Popen(["sleep", "1000"], pass_fds=listeners)
    with open(os.environ["HOSTILE_PID_FILE"], "w") as f:
        f.write(str(helper.pid))

elif MODE == "flood":
    honest_serve_orders = Template._serve_orders

    def _serve_orders(self):
        def flood():
            while True:
                print("x" * 40, file=sys.stderr, flush=True)

        threading.Thread(target=flood, daemon=True).start()
        return honest_serve_orders(self)

    Template._serve_orders = _serve_orders

elif MODE == "deaf":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def deaf(receive):
        def _receive(self):
            while True:
                message = receive(self)
                if message is None or message[0] != b"Q":
                    return message

        return _receive

    Template._receive = deaf(Template._receive)
    forkpool_worker.Worker._receive = deaf(forkpool_worker.Worker._receive)

else:
    sys.exit(f"unknown mode {MODE}")


def handle(conn, listener):
    head = b""
    while b"\r\n\r\n" not in head:
        head += conn.recv(65536) or b"\r\n\r\n"
    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")


forkpool_worker.Worker.from_env().serve(handle)
