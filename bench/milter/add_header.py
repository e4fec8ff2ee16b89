"""add_header.py: bench/milter/add_header.c's filter on pymilter (Debian's
python3-milter, a binding of libmilter): the same rules, for the mail tests
and the milter benchmark.

At end of message it adds `X-Forkpool-Milter: <pid>`. It rejects
`RCPT TO:<reject@...>` with 550 5.7.1, tempfails `MAIL FROM:<tempfail@...>`
with 451 4.7.1 and quarantines a message with a recipient `hold@...`. For
benchmarks it spins WORK_US of CPU per message and with `-c N` aborts the
process on one message in N.

    /usr/bin/python3 add_header.py -p PORT [-w WORK_US] [-c CRASH_EVERY]
"""

import argparse
import os
import threading
import time

import Milter

WORK_US = 0
CRASH_EVERY = 0
_seen = 0
_seen_lock = threading.Lock()


def is_address(addr, local):
    """True when `addr` (with or without angle brackets) is local@..."""
    return addr.strip("<>").lower().startswith(local + "@")


def spin(us):
    """Spins on the CPU for `us` microseconds of this thread's CPU time."""
    end = time.thread_time() + us / 1e6
    while time.thread_time() < end:
        pass


class AddHeader(Milter.Base):
    """One conversation. Every stage has a callback, so the MTA sends every
    command and waits for every reply, as add_header.c has it."""

    def __init__(self):
        self.hold = False

    def connect(self, hostname, family, hostaddr):
        return Milter.CONTINUE

    def hello(self, hostname):
        return Milter.CONTINUE

    def envfrom(self, mailfrom, *params):
        self.hold = False
        if is_address(mailfrom, "tempfail"):
            self.setreply("451", "4.7.1", "sender tempfailed by add_header.py")
            return Milter.TEMPFAIL
        return Milter.CONTINUE

    def envrcpt(self, to, *params):
        if is_address(to, "reject"):
            self.setreply("550", "5.7.1", "recipient rejected by add_header.py")
            return Milter.REJECT
        if is_address(to, "hold"):
            self.hold = True
        return Milter.CONTINUE

    def data(self):
        return Milter.CONTINUE

    def header(self, name, value):
        return Milter.CONTINUE

    def eoh(self):
        return Milter.CONTINUE

    def body(self, chunk):
        return Milter.CONTINUE

    def eom(self):
        global _seen
        with _seen_lock:
            _seen += 1
            n = _seen
        if CRASH_EVERY and n % CRASH_EVERY == 0:
            os.abort()
        if WORK_US:
            spin(WORK_US)
        self.addheader("X-Forkpool-Milter", str(os.getpid()))
        if self.hold:
            self.hold = False
            self.quarantine("held by add_header.py")
        return Milter.CONTINUE

    def abort(self):
        self.hold = False
        return Milter.CONTINUE

    def close(self):
        return Milter.CONTINUE

    def unknown(self, command):
        return Milter.CONTINUE


def main():
    global WORK_US, CRASH_EVERY
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-p", type=int, required=True, help="port on 127.0.0.1")
    parser.add_argument("-w", type=int, default=0, help="CPU microseconds per message")
    parser.add_argument("-c", type=int, default=0, help="abort on one message in N")
    args = parser.parse_args()
    WORK_US, CRASH_EVERY = args.w, args.c
    Milter.factory = AddHeader
    Milter.set_flags(Milter.ADDHDRS | Milter.QUARANTINE)
    print("add_header.py: listening on %d" % args.p, flush=True)
    Milter.runmilter("add_header.py", "inet:%d@127.0.0.1" % args.p, timeout=600)


if __name__ == "__main__":
    main()
