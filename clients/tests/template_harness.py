"""A small reference supervisor for templates, for the tests.

It speaks the supervisor's side of docs/protocol.md "Templates
(`--preload`)": it becomes a child subreaper, starts a program as a
template, orders forks, and checks each forked worker from the outside.
The real supervisor is forkpool's; this one exists so the worker helpers
(Python, Perl, Rust) can be tested on their own.

    template_harness.py --dispatch handoff|order [--workers N] [--die] -- CMD...

Without --die it runs every check (see `full_run`) and exits 0 when all
pass, 1 with the reason on stderr when one fails. With --die it forks the
workers, prints {"template": PID, "workers": [PID...]} on stdout and
SIGKILLs itself, so the caller can check that nothing it started survives.
Every wait is bounded; every process it starts is killed on the way out.
"""

import argparse
import ctypes
import fcntl
import json
import os
import select
import signal
import socket
import struct
import sys
import time

VERSION = 2
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
TIMEOUT = 15.0
LIBC = ctypes.CDLL(None, use_errno=True)


class Failure(Exception):
    """A check failed."""


def check(condition, what):
    if not condition:
        raise Failure(what)


def prctl(option, value):
    if LIBC.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl")


def send(chan, kind, payload=b"", fds=()):
    data = bytes([VERSION]) + kind + payload
    if fds:
        socket.send_fds(chan, [data], list(fds))
    else:
        chan.send(data)


def receive(chan, what):
    chan.settimeout(TIMEOUT)
    try:
        data, fds, _flags, _addr = socket.recv_fds(chan, 16, 4)
    except socket.timeout:
        raise Failure(f"no message within {TIMEOUT}s while waiting for {what}")
    for fd in fds:
        os.close(fd)
    check(not fds, f"{what}: descriptors sent to the supervisor")
    check(data, f"end of file while waiting for {what}")
    check(data[0] == VERSION, f"{what}: version byte {data[0]}, not {VERSION}")
    return data[1:2], data[2:]


def expect(chan, kind, length, what):
    got, payload = receive(chan, what)
    check(got == kind and len(payload) == length, f"{what}: got {got!r} {payload!r}")
    return payload


class Harness:
    def __init__(self, dispatch, cmd):
        self.dispatch = dispatch
        self.cmd = cmd
        self.started = []  # every pid, killed on the way out
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.listener.setblocking(self.dispatch == "handoff")
        self.passed = [] if dispatch == "handoff" else [self.listener]
        self.workers = {}  # slot -> (pid, channel)
        self.template = None
        self.template_chan = None

    # -- the template ----------------------------------------------------

    def start_template(self):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        n = len(self.passed)
        env = {k: v for k, v in os.environ.items() if not k.startswith("FORKPOOL_")}
        env.update(
            FORKPOOL_PROTOCOL="2",
            FORKPOOL_TEMPLATE_FD=str(3 + n),
            FORKPOOL_SUPERVISOR_PID=str(os.getpid()),
            FORKPOOL_GENERATION="1",
            FORKPOOL_DISPATCH=self.dispatch,
        )
        for k in ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"):
            env.pop(k, None)
        if n:
            env["LISTEN_FDS"] = str(n)
            env["LISTEN_FDNAMES"] = "listener0"
        sources = [s.fileno() for s in self.passed] + [theirs.fileno()]
        pid = os.fork()
        if pid == 0:
            try:
                high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in sources]
                null = os.open("/dev/null", os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(2, 1)
                for i, fd in enumerate(high):
                    os.dup2(fd, 3 + i, inheritable=True)
                os.closerange(3 + len(high), 65536)
                if n:
                    env["LISTEN_PID"] = str(os.getpid())
                prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
                os.execvpe(self.cmd[0], self.cmd, env)
            except BaseException as e:
                print(f"harness: cannot start the template: {e}", file=sys.stderr)
            os._exit(127)
        theirs.close()
        self.started.append(pid)
        self.template, self.template_chan = pid, mine
        ready = expect(mine, b"R", 4, "the template's Ready")
        check(struct.unpack(">I", ready)[0] == pid, "template Ready names another pid")
        self.ping(mine, "the template")

    def ping(self, chan, who, seq=[0]):
        seq[0] += 1
        send(chan, b"p", struct.pack(">I", seq[0]))
        pong = expect(chan, b"P", 4, f"the Pong of {who}")
        check(struct.unpack(">I", pong)[0] == seq[0], f"{who} echoed another seq")

    # -- forking a worker ------------------------------------------------

    def fork(self, slot, template_chan=None, template_pid=None):
        chan = template_chan or self.template_chan
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        err_r, err_w = os.pipe()
        chan_ino = os.fstat(theirs.fileno()).st_ino
        pipe_ino = os.fstat(err_r).st_ino
        send(chan, b"F", struct.pack(">II", slot, 1), [theirs.fileno(), err_w])
        theirs.close()
        os.close(err_w)
        got = expect(chan, b"W", 8, f"Forked for slot {slot}")
        got_slot, pid = struct.unpack(">II", got)
        check(got_slot == slot, f"Forked names slot {got_slot}, not {slot}")
        self.started.append(pid)
        try:
            ready = expect(mine, b"R", 4, f"the Ready of slot {slot}")
        except Failure as e:
            stderr = read_until(err_r, b"\0").decode(errors="replace")
            raise Failure(f"{e}; the worker {exit_status(pid)}; its stderr: {stderr}")
        check(struct.unpack(">I", ready)[0] == pid, f"slot {slot}: Ready pid != Forked pid")
        self.check_worker(slot, pid, chan_ino, pipe_ino, err_r, template_pid)
        self.workers[slot] = (pid, mine)
        return pid

    def check_worker(self, slot, pid, chan_ino, pipe_ino, err_r, template_pid):
        check(parent_of(pid) == os.getpid(), f"slot {slot}: not reparented to the harness")
        if template_pid is not None:
            check(template_pid != pid, "the worker is the template")
        n = len(self.passed)
        fds = {int(f): os.readlink(f"/proc/{pid}/fd/{f}") for f in os.listdir(f"/proc/{pid}/fd")}
        expected = {0, 1, 2, 3 + n} | set(range(3, 3 + n))
        check(set(fds) == expected, f"slot {slot}: descriptors {sorted(fds)}, expected {sorted(expected)}: {fds}")
        check(fds[2] == f"pipe:[{pipe_ino}]", f"slot {slot}: stderr is {fds[2]}, not the passed pipe")
        check(fds[3 + n] == f"socket:[{chan_ino}]", f"slot {slot}: fd {3 + n} is {fds[3 + n]}, not the passed channel")
        for i in range(n):
            ino = os.fstat(self.passed[i].fileno()).st_ino
            check(fds[3 + i] == f"socket:[{ino}]", f"slot {slot}: fd {3 + i} is not listener {i}")
        text = read_until(err_r, f"after_fork ran in {pid}".encode())
        check(f"after_fork ran in {pid}".encode() in text, f"slot {slot}: nothing of its after_fork on the stderr pipe: {text!r}")
        os.close(err_r)

    # -- serving -----------------------------------------------------------

    def serve(self, slot):
        """One connection through the worker of `slot`; returns its answer."""
        _pid, chan = self.workers[slot]
        client = socket.create_connection(self.listener.getsockname(), timeout=TIMEOUT)
        with client:
            if self.dispatch == "handoff":
                conn, _ = self.listener.accept()
                send(chan, b"C", struct.pack(">H", 0), [conn.fileno()])
                conn.close()
            else:
                wait_readable(self.listener)
                send(chan, b"A", struct.pack(">H", 0))
                expect(chan, b"B", 0, f"the Busy of slot {slot}")
            line = client.makefile("rb").readline()
        expect(chan, b"I", 0, f"the Idle of slot {slot}")
        check(line.endswith(b"\n"), f"slot {slot} answered {line!r}")
        return json.loads(line)

    def serve_checked(self, slot, preloaded, warm=None):
        pid, chan = self.workers[slot]
        reply = self.serve(slot)
        check(reply["pid"] == pid and reply["slot"] == slot, f"slot {slot}: served by {reply}")
        check(reply["preloaded"] == preloaded, f"slot {slot}: not forked from the template {preloaded}: {reply}")
        check(reply["after_fork"], f"slot {slot}: after_fork did not run in the worker")
        if warm is not None:
            check(reply["warm"] == warm, f"slot {slot}: does not share the warmed state of {warm}: {reply}")
        self.ping(chan, f"slot {slot}")
        return reply

    # -- the end -----------------------------------------------------------

    def reap_all(self):
        for pid in self.started:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                time.sleep(0.01)


def parent_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def wait_readable(sock):
    ready, _, _ = select.select([sock], [], [], TIMEOUT)
    check(ready, "the connection never reached the listener")


def read_until(fd, needle):
    text = b""
    deadline = time.monotonic() + TIMEOUT
    while needle not in text and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        text += chunk
    return text


def exit_status(pid):
    """How a child of the harness ended, in words (bounded wait)."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        try:
            got, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return "is not a child of the harness (never reparented to it)"
        if got == pid:
            if os.WIFSIGNALED(status):
                return f"was killed by signal {os.WTERMSIG(status)}"
            return f"exited with status {os.WEXITSTATUS(status)}"
        time.sleep(0.01)
    return "is still running"


def wait_exit(pid, what):
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        got, _status = os.waitpid(pid, os.WNOHANG)
        if got == pid:
            return
        time.sleep(0.01)
    raise Failure(f"{what} (pid {pid}) did not exit within {TIMEOUT}s")


def full_run(h, count):
    """Every check of the brief, in one run."""
    h.start_template()
    template = h.template
    for slot in range(count):
        h.fork(slot, template_pid=template)
    for slot in range(count):
        h.serve_checked(slot, preloaded=template)
    # The template dies: the workers keep serving.
    os.kill(template, signal.SIGKILL)
    wait_exit(template, "the SIGKILLed template")
    h.template_chan.close()
    for slot in range(count):
        h.serve_checked(slot, preloaded=template)
    # Refork: slot 0 (warmed by its connections) becomes the template.
    warm_pid, chan0 = h.workers.pop(0)
    new_chan, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    send(chan0, b"T", b"", [theirs.fileno()])
    theirs.close()
    ready = expect(new_chan, b"R", 4, "the Ready of the reforked template")
    check(struct.unpack(">I", ready)[0] == warm_pid, "the reforked template is not slot 0's process")
    chan0.close()
    h.ping(new_chan, "the reforked template")
    h.fork(count, template_chan=new_chan, template_pid=warm_pid)
    h.serve_checked(count, preloaded=template, warm=warm_pid)
    check(h.workers[count][0] != warm_pid, "the reforked worker is its template")
    # Quit: everyone exits 0.
    send(new_chan, b"Q")
    wait_exit(warm_pid, "the reforked template after Quit")
    for slot, (pid, chan) in sorted(h.workers.items()):
        send(chan, b"Q")
        wait_exit(pid, f"slot {slot} after Quit")


def die_run(h, count):
    h.start_template()
    pids = [h.fork(slot, template_pid=h.template) for slot in range(count)]
    print(json.dumps({"template": h.template, "workers": pids}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dispatch", choices=["handoff", "order"], default="handoff")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--die", action="store_true")
    parser.add_argument("cmd", nargs="+")
    args = parser.parse_args()
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    h = Harness(args.dispatch, args.cmd)
    try:
        (die_run if args.die else full_run)(h, args.workers)
    except Failure as e:
        print(f"template harness: FAILED: {e}", file=sys.stderr)
        return 1
    finally:
        if not args.die:
            h.reap_all()
    print("template harness: all checks passed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
