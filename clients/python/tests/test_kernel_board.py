"""Unit tests of forkpool_worker in `kernel` dispatch, without a supervisor.

The test plays the supervisor: a memfd mapped shared stands for the
scoreboard map (it behaves the same for the worker), two loopback
listeners stand for the worker's own socket and the overflow, and a
SEQPACKET pair is the channel. The worker runs as a real process with
the descriptors where `forkpool run --dispatch kernel` puts them.

Run from clients/python: python3 -m unittest discover -s tests
"""

import fcntl
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
import unittest

import forkpool_board

TIMEOUT = 10.0
SLOTS = 2
SLOT = 1
HERE = os.path.dirname(os.path.abspath(__file__))
CLIENTS = os.path.dirname(HERE)

# The worker: answers one line per connection with its slot and listener.
# A line `leave` makes it leave after answering; a line `end` calls
# `ending_connection` first and answers the state it then sees on its
# record (1: idle already). A line `leak N` opens N descriptors and keeps
# them (a leaking app), as many as it can. A line `checks` answers how
# many times the worker has looked at its descriptor table. TEST_NOFILE sets its soft and
# hard RLIMIT_NOFILE; TEST_FILL fills its table before it serves. A line
# `grow N` keeps N MiB more of its own memory; `grow-end N` does, then
# calls `ending_connection` and answers the state it sees, as `end` does.
# TEST_SHARED_MIB: that many MiB are written, then the process forks and
# the child is the worker (it shares them with its parent, which waits).
WORKER = r"""
import os
import resource
if "TEST_SHARED_MIB" in os.environ:
    shared = b"\x01" * (int(os.environ["TEST_SHARED_MIB"]) << 20)
    child = os.fork()
    if child:
        os._exit(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))
os.environ["LISTEN_PID"] = str(os.getpid())
if "TEST_NOFILE" in os.environ:
    nofile = int(os.environ["TEST_NOFILE"])
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
import forkpool_worker

worker = forkpool_worker.Worker.from_env()
leaked = []
grown = []
checks = [0]
look_at_table = worker.check_headroom
def counted_check():
    checks[0] += 1
    look_at_table()
worker.check_headroom = counted_check
while "TEST_FILL" in os.environ:
    try:
        leaked.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        break

def handle(conn, listener):
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(100)
        if not chunk:
            return
        data += chunk
    if data == b"leave\n":
        worker.leave()
    if data == b"peer\n":
        data = b"%s:%d\n" % (worker.peer[0].encode(), worker.peer[1])
    if data.startswith(b"leak "):
        try:
            for _ in range(int(data.split()[1])):
                leaked.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
    if data.startswith((b"grow ", b"grow-end ")):
        grown.append(b"\x01" * (int(data.split()[1]) << 20))
    if data.startswith(b"grow-end "):
        worker.ending_connection()
        data = b"state=%d\n" % worker.board.state.value
    if data == b"checks\n":
        data = b"checks=%d\n" % checks[0]
    if data == b"end\n":
        worker.ending_connection()
        data = b"state=%d\n" % worker.board.state.value
    conn.sendall(b"slot=%d listener=%d %s" % (worker.slot, listener, data))

worker.serve(handle)
"""

# Word indexes of slot SLOT's record.
STATE, TAKEN, SERVED, NEXT = (forkpool_board.HEADER_WORDS + 4 * SLOT + i for i in range(4))
WAITING = 2
OVERFLOW_SENT, OVERFLOW_TAKEN = 3, 4
BOUND = 5


def listener():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)
    return sock


def wait_for(what, cond):
    deadline = time.monotonic() + TIMEOUT
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.001)


class FakeSupervisor:
    """The board, the sockets and the channel of one kernel-dispatch worker."""

    def __init__(self, magic=forkpool_board.MAGIC, slots=SLOTS):
        self.board = os.memfd_create("forkpool-test-board")
        os.ftruncate(self.board, forkpool_board.map_length(SLOTS))
        self.write(0, magic)
        self.write(1, slots)
        self.own = listener()
        self.overflow = listener()
        self.channel, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.channel.settimeout(TIMEOUT)
        # Out of the way of 3..6, where the worker finds them.
        self.passed = [
            fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 50)
            for fd in (self.own.fileno(), theirs.fileno(), self.overflow.fileno(), self.board)
        ]
        theirs.close()
        self.process = None

    def start_forked(self):
        """As a worker a template forked: version 2, the pool's listener
        (here the overflow) at 3, the channel at 4, no board until `S`."""
        self._spawn([self.passed[2], self.passed[1]], FORKPOOL_PROTOCOL="2")
        assert self.message() == b"\x02K" + struct.pack(">I", self.process.pid)
        return self

    def seat(self, listeners=1, max_requests=0, fds=None):
        fds = [self.own.fileno(), self.board] if fds is None else fds
        seat = b"\x02S" + struct.pack(">HQ", listeners, max_requests)
        socket.send_fds(self.channel, [seat], fds)

    def start(self, **extra):
        """As an exec'd worker: own socket 3, channel 4, overflow 5, board 6."""
        extra = dict(FORKPOOL_OVERFLOW_FD="5", FORKPOOL_BOARD_FD="6", **extra)
        return self._spawn(self.passed, **extra)

    def _spawn(self, passed, **extra):
        """The worker, with `passed` at 3, 4, ... and `extra` in its
        environment."""
        env = dict(
            os.environ,
            PYTHONPATH=CLIENTS,
            LISTEN_FDS="1",
            FORKPOOL_CHANNEL_FD="4",
            # As forkpool announces kernel dispatch (protocol.md).
            FORKPOOL_DISPATCH="handoff",
            FORKPOOL_KERNEL_DISPATCH="1",
            FORKPOOL_SLOT=str(SLOT),
            FORKPOOL_PROTOCOL="1",
            FORKPOOL_GENERATION="1",
        )
        env.update(extra)

        def place():
            for i, fd in enumerate(passed):
                os.dup2(fd, 3 + i)

        self.process = subprocess.Popen(
            [sys.executable, "-c", WORKER],
            env=env,
            preexec_fn=place,
            close_fds=False,
            stderr=subprocess.PIPE,
        )
        return self

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        if self.process is not None:
            self.process.wait()
            self.process.stderr.close()
        for fd in self.passed + [self.board]:
            os.close(fd)
        for sock in (self.own, self.overflow, self.channel):
            sock.close()

    def read(self, word):
        return int.from_bytes(os.pread(self.board, 8, 8 * word), "little")

    def write(self, word, value):
        os.pwrite(self.board, value.to_bytes(8, "little"), 8 * word)

    def message(self):
        return self.channel.recv(16)

    def nothing_said(self):
        return not select.select([self.channel], [], [], 0)[0]

    def ready_and_idle(self, **extra):
        self.start(**extra)
        assert self.message() == b"\x01K" + struct.pack(">I", self.process.pid)
        wait_for("the worker to go idle", lambda: self.read(STATE) == forkpool_board.IDLE)
        return self

    def stopped(self):
        with open(f"/proc/{self.process.pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "T"


def ask(addr, line=b"hi\n"):
    with socket.create_connection(addr, timeout=TIMEOUT) as conn:
        conn.sendall(line)
        return read_all(conn)


def read_all(conn):
    answer = b""
    while True:
        chunk = conn.recv(100)
        if not chunk:
            return answer
        answer += chunk


class RecordTest(unittest.TestCase):
    def test_map_length_covers_the_record_in_whole_pages(self):
        self.assertEqual(forkpool_board.map_length(0), 4096)
        # Slot 126 ends at byte 8 * (8 + 4 * 127) = 4128.
        self.assertEqual(forkpool_board.map_length(126), 8192)

    def test_a_board_without_the_magic_or_the_slot_is_refused(self):
        boards = [
            (dict(magic=int.from_bytes(b"notboard", "little")), "not a forkpool scoreboard"),
            (dict(slots=SLOT), "not on the scoreboard"),
        ]
        for board, why in boards:
            fake = FakeSupervisor(**board)
            try:
                with self.assertRaisesRegex(forkpool_board.BoardError, why):
                    forkpool_board.Record(fake.board, SLOT)
            finally:
                fake.stop()

    def test_go_idle_stores_idle_and_reads_the_waiting_word(self):
        fake = FakeSupervisor()
        try:
            record = forkpool_board.Record(fake.board, SLOT)
            self.assertFalse(record.go_idle())
            self.assertEqual(fake.read(STATE), forkpool_board.IDLE)
            fake.write(WAITING, 1)
            self.assertTrue(record.go_idle())
            record.go_busy()
            self.assertEqual(fake.read(STATE), forkpool_board.BUSY)
            record.taken.value += 1
            self.assertEqual(fake.read(TAKEN), 1)
            self.assertEqual(fake.read(STATE - 4), 0, "the slot before is untouched")
        finally:
            fake.stop()

    def test_a_slot_outside_the_dispatch_width_does_not_look_at_the_overflow(self):
        # Slot 2 of 4; the kernel sent one more to the overflow than was
        # taken, so only the bound (word 5) can keep the worker from it.
        fake = FakeSupervisor(slots=4)
        try:
            fake.write(OVERFLOW_SENT, 3)
            fake.write(OVERFLOW_TAKEN, 2)
            record = forkpool_board.Record(fake.board, 2)
            seen = []
            for bound in (0, 4, 3, 2, 1, 0):
                fake.write(BOUND, bound)
                seen.append((bound, record.overflow_may_wait()))
            self.assertEqual(
                seen,
                [(0, True), (4, True), (3, True), (2, False), (1, False), (0, True)],
                "0 is no bound; a bound above the slot lets it look",
            )
            fake.write(OVERFLOW_TAKEN, 3)
            fake.write(BOUND, 3)
            self.assertFalse(record.overflow_may_wait(), "within the width, nothing waits")
        finally:
            fake.stop()


class KernelWorkerTest(unittest.TestCase):
    def setUp(self):
        self.fake = FakeSupervisor()
        self.addCleanup(self.fake.stop)

    def test_a_worker_refuses_a_board_without_the_magic(self):
        self.fake.write(0, 12345)
        self.fake.start()
        _out, err = self.fake.process.communicate(timeout=TIMEOUT)
        self.assertEqual(self.fake.process.returncode, 1)
        self.assertIn(b"not a forkpool scoreboard", err)

    def test_own_socket_connections_are_counted_and_say_nothing(self):
        fake = self.fake.ready_and_idle()
        for n in range(1, 4):
            self.assertEqual(ask(fake.own.getsockname()), b"slot=1 listener=0 hi\n")
            # Idle again before the client saw the close.
            self.assertEqual(fake.read(STATE), forkpool_board.IDLE)
            self.assertEqual((fake.read(TAKEN), fake.read(SERVED)), (n, n))
        self.assertEqual(fake.read(NEXT), 0)
        self.assertTrue(fake.nothing_said(), "no report per connection")

    def test_a_worker_going_idle_says_I_only_while_the_supervisor_waits(self):
        fake = self.fake.ready_and_idle()
        fake.write(WAITING, 1)
        ask(fake.own.getsockname())
        self.assertEqual(fake.message(), b"\x01I")
        fake.write(WAITING, 0)
        ask(fake.own.getsockname())
        self.assertTrue(fake.nothing_said())

    def test_busy_while_serving(self):
        fake = self.fake.ready_and_idle()
        conn = socket.create_connection(fake.own.getsockname(), timeout=TIMEOUT)
        with conn:
            wait_for("the worker to accept", lambda: fake.read(TAKEN) == 1)
            self.assertEqual(fake.read(STATE), forkpool_board.BUSY)
            conn.sendall(b"x\n")
            self.assertEqual(read_all(conn), b"slot=1 listener=0 x\n")
        self.assertEqual(fake.read(STATE), forkpool_board.IDLE)

    def test_a_finishing_worker_takes_the_next_from_the_overflow(self):
        fake = self.fake.ready_and_idle()
        first = socket.create_connection(fake.own.getsockname(), timeout=TIMEOUT)
        wait_for("the worker to accept", lambda: fake.read(TAKEN) == 1)
        waiting = socket.create_connection(fake.overflow.getsockname(), timeout=TIMEOUT)
        fake.write(OVERFLOW_SENT, 1)  # as the kernel's program counts it
        waiting.sendall(b"next\n")
        first.sendall(b"first\n")
        self.assertEqual(read_all(first), b"slot=1 listener=0 first\n")
        self.assertEqual(read_all(waiting), b"slot=1 listener=0 next\n")
        first.close()
        waiting.close()
        wait_for("the worker to go idle", lambda: fake.read(STATE) == forkpool_board.IDLE)
        self.assertEqual(
            (fake.read(TAKEN), fake.read(SERVED), fake.read(NEXT)), (2, 2, 1)
        )
        taken = 1 if forkpool_board._FETCH_ADD is not None else 0
        self.assertEqual(fake.read(OVERFLOW_TAKEN), taken)

    def test_a_finishing_worker_does_not_look_when_the_words_say_nothing_waits(self):
        fake = self.fake.ready_and_idle()
        first = socket.create_connection(fake.own.getsockname(), timeout=TIMEOUT)
        wait_for("the worker to accept", lambda: fake.read(TAKEN) == 1)
        # Queued on the overflow, but words 3 and 4 say the kernel sent
        # nothing there that was not taken: the worker does not look.
        waiting = socket.create_connection(fake.overflow.getsockname(), timeout=TIMEOUT)
        fake.write(OVERFLOW_SENT, 5)
        fake.write(OVERFLOW_TAKEN, 5)
        first.sendall(b"first\n")
        self.assertEqual(read_all(first), b"slot=1 listener=0 first\n")
        wait_for("the worker to go idle", lambda: fake.read(STATE) == forkpool_board.IDLE)
        self.assertEqual(fake.read(NEXT), 0)
        self.assertTrue(select.select([fake.overflow], [], [], 0)[0], "left on the overflow")
        waiting.close()

    def test_a_finishing_worker_outside_the_dispatch_width_goes_idle(self):
        fake = self.fake.ready_and_idle()
        first = socket.create_connection(fake.own.getsockname(), timeout=TIMEOUT)
        wait_for("the worker to accept", lambda: fake.read(TAKEN) == 1)
        # Counted on the overflow, but the supervisor narrowed the width to
        # slot 0 alone: slot 1 leaves the connection to the others.
        waiting = socket.create_connection(fake.overflow.getsockname(), timeout=TIMEOUT)
        fake.write(OVERFLOW_SENT, 1)
        fake.write(BOUND, SLOT)
        first.sendall(b"first\n")
        self.assertEqual(read_all(first), b"slot=1 listener=0 first\n")
        wait_for("the worker to go idle", lambda: fake.read(STATE) == forkpool_board.IDLE)
        self.assertEqual((fake.read(TAKEN), fake.read(SERVED), fake.read(NEXT)), (1, 1, 0))
        self.assertTrue(select.select([fake.overflow], [], [], 0)[0], "left on the overflow")
        # The width takes it in again: it finishes the next one by taking it.
        fake.write(BOUND, SLOT + 1)
        again = socket.create_connection(fake.own.getsockname(), timeout=TIMEOUT)
        wait_for("the worker to accept", lambda: fake.read(TAKEN) == 2)
        waiting.sendall(b"next\n")
        again.sendall(b"again\n")
        self.assertEqual(read_all(again), b"slot=1 listener=0 again\n")
        self.assertEqual(read_all(waiting), b"slot=1 listener=0 next\n")
        again.close()
        waiting.close()
        self.assertEqual(fake.read(NEXT), 1)

    def test_a_message_goes_before_the_overflow(self):
        fake = self.fake.ready_and_idle()
        first = socket.create_connection(fake.own.getsockname(), timeout=TIMEOUT)
        wait_for("the worker to accept", lambda: fake.read(TAKEN) == 1)
        waiting = socket.create_connection(fake.overflow.getsockname(), timeout=TIMEOUT)
        fake.write(OVERFLOW_SENT, 1)  # counted: only the message keeps the worker from it
        fake.channel.send(b"\x01p\x00\x00\x00\x07")
        first.sendall(b"first\n")
        self.assertEqual(read_all(first), b"slot=1 listener=0 first\n")
        self.assertEqual(fake.message(), b"\x01P\x00\x00\x00\x07")
        self.assertEqual(fake.read(NEXT), 0)
        # Left for the supervisor.
        self.assertTrue(select.select([fake.overflow], [], [], 0)[0])
        waiting.close()

    def test_a_handed_connection_is_served_and_counted_as_served_only(self):
        fake = self.fake.ready_and_idle()
        # The supervisor claims the worker (idle to busy) and hands one over.
        fake.write(STATE, forkpool_board.BUSY)
        client = socket.create_connection(fake.overflow.getsockname(), timeout=TIMEOUT)
        wait_for("the handshake", lambda: select.select([fake.overflow], [], [], 0)[0])
        conn, _ = fake.overflow.accept()
        socket.send_fds(fake.channel, [b"\x01C\x00\x00"], [conn.fileno()])
        conn.close()
        client.sendall(b"handed\n")
        self.assertEqual(read_all(client), b"slot=1 listener=0 handed\n")
        client.close()
        self.assertEqual(fake.read(STATE), forkpool_board.IDLE)
        self.assertEqual((fake.read(TAKEN), fake.read(SERVED)), (0, 1))

    def quit_with_one_queued(self, line):
        """The worker stopped, a connection sending `line` queued on its own
        socket and `Q` sent, then let go: what that connection was
        answered, once the worker has exited 0."""
        fake = self.fake.ready_and_idle()
        os.kill(fake.process.pid, signal.SIGSTOP)
        wait_for("the worker to stop", fake.stopped)
        queued = socket.create_connection(fake.own.getsockname(), timeout=TIMEOUT)
        queued.sendall(line)
        fake.channel.send(b"\x01Q")
        os.kill(fake.process.pid, signal.SIGCONT)
        answer = read_all(queued)
        queued.close()
        self.assertEqual(fake.process.wait(timeout=TIMEOUT), 0)
        return fake, answer

    def test_quit_serves_what_was_queued_on_the_own_socket_then_exits(self):
        fake, answer = self.quit_with_one_queued(b"queued\n")
        self.assertEqual(answer, b"slot=1 listener=0 queued\n")
        self.assertEqual(fake.read(STATE), forkpool_board.BUSY)
        self.assertEqual((fake.read(TAKEN), fake.read(SERVED)), (1, 1))

    def test_a_connection_served_on_quit_never_goes_idle_early(self):
        # Quitting, the worker stays busy while it serves what was queued:
        # an early idle would let the kernel queue more on a worker about
        # to exit.
        fake, answer = self.quit_with_one_queued(b"end\n")
        self.assertEqual(answer, b"slot=1 listener=0 state=0\n")
        self.assertEqual(fake.read(STATE), forkpool_board.BUSY)

    def test_a_leaving_worker_is_busy_then_says_X(self):
        fake = self.fake.ready_and_idle()
        self.assertEqual(ask(fake.own.getsockname(), b"leave\n"), b"slot=1 listener=0 leave\n")
        self.assertEqual(fake.message(), b"\x01X")
        self.assertEqual(fake.process.wait(timeout=TIMEOUT), 0)
        self.assertEqual(fake.read(STATE), forkpool_board.BUSY)

    def test_a_worker_leaves_when_it_has_served_its_share(self):
        fake = self.fake.ready_and_idle(FORKPOOL_MAX_REQUESTS="2")
        ask(fake.own.getsockname())
        self.assertEqual(fake.read(STATE), forkpool_board.IDLE)
        ask(fake.own.getsockname())
        self.assertEqual(fake.message(), b"\x01X")
        self.assertEqual(fake.process.wait(timeout=TIMEOUT), 0)
        self.assertEqual(fake.read(STATE), forkpool_board.BUSY)
        self.assertEqual(fake.read(SERVED), 2)

    def test_a_worker_running_out_of_descriptors_leaves_after_the_connection(self):
        # 64 descriptors: it leaves once descriptor 48 is open.
        fake = self.fake.ready_and_idle(TEST_NOFILE="64")
        self.assertEqual(ask(fake.own.getsockname(), b"leak 20\n"), b"slot=1 listener=0 leak 20\n")
        wait_for("the finish", lambda: fake.read(SERVED) == 1)
        self.assertEqual(fake.read(STATE), forkpool_board.IDLE)
        # This one's leak reaches 48: served, then X.
        self.assertEqual(ask(fake.own.getsockname(), b"leak 30\n"), b"slot=1 listener=0 leak 30\n")
        self.assertEqual(fake.message(), b"\x01X")
        self.assertEqual(fake.process.wait(timeout=TIMEOUT), 0)
        self.assertEqual(fake.read(STATE), forkpool_board.BUSY)
        self.assertEqual(fake.read(SERVED), 2)
        self.assertIn(b"running out of descriptors", fake.process.stderr.read())

    def test_an_accept_out_of_descriptors_leaves_the_connection_queued(self):
        # Its table full before the first connection: the accept fails.
        fake = self.fake.ready_and_idle(TEST_NOFILE="64", TEST_FILL="1")
        with socket.create_connection(fake.own.getsockname(), timeout=TIMEOUT) as waiting:
            self.assertEqual(fake.message(), b"\x01X")
            self.assertEqual(fake.process.wait(timeout=TIMEOUT), 0)
            self.assertEqual(fake.read(STATE), forkpool_board.BUSY)
            # Not taken: it waits for the next worker on this socket.
            fake.own.setblocking(True)
            fake.own.settimeout(TIMEOUT)
            queued, _ = fake.own.accept()
            with queued:
                waiting.sendall(b"still there\n")
                self.assertEqual(queued.recv(100), b"still there\n")
        self.assertIn(b"out of descriptors", fake.process.stderr.read())

    def test_ending_a_connection_goes_idle_before_the_answer(self):
        fake = self.fake.ready_and_idle()
        fake.write(WAITING, 1)
        self.assertEqual(ask(fake.own.getsockname(), b"end\n"), b"slot=1 listener=0 state=1\n")
        # `I` once, at the early idle; the finish only counts.
        self.assertEqual(fake.message(), b"\x01I")
        wait_for("the finish", lambda: fake.read(SERVED) == 1)
        self.assertTrue(fake.nothing_said(), "one I, not two")
        self.assertEqual(fake.read(STATE), forkpool_board.IDLE)
        self.assertEqual((fake.read(TAKEN), fake.read(NEXT)), (1, 0))
        # The next connection is served as ever.
        self.assertEqual(ask(fake.own.getsockname()), b"slot=1 listener=0 hi\n")
        self.assertEqual(fake.read(SERVED), 2)

    def test_a_connection_ends_busy_while_the_overflow_may_hold_one(self):
        fake = self.fake.ready_and_idle()
        fake.write(OVERFLOW_SENT, 1)  # the kernel sent one there, none taken
        self.assertEqual(ask(fake.own.getsockname(), b"end\n"), b"slot=1 listener=0 state=0\n")

    def test_a_connection_looks_at_the_descriptor_table_once(self):
        fake = self.fake.ready_and_idle()
        fake.write(OVERFLOW_SENT, 1)  # no early idle: the finish follows the look
        self.assertEqual(ask(fake.own.getsockname(), b"end\n"), b"slot=1 listener=0 state=0\n")
        wait_for("the finish", lambda: fake.read(SERVED) == 1)
        fake.write(OVERFLOW_SENT, 0)
        self.assertEqual(ask(fake.own.getsockname(), b"checks\n"), b"slot=1 listener=0 checks=1\n")

    def test_a_worker_that_leaves_after_the_connection_ends_it_busy(self):
        fake = self.fake.ready_and_idle(FORKPOOL_MAX_REQUESTS="1")
        self.assertEqual(ask(fake.own.getsockname(), b"end\n"), b"slot=1 listener=0 state=0\n")
        self.assertEqual(fake.message(), b"\x01X")
        self.assertEqual(fake.process.wait(timeout=TIMEOUT), 0)
        self.assertEqual(fake.read(STATE), forkpool_board.BUSY)

    def test_the_peer_is_the_one_accept_gave(self):
        fake = self.fake.ready_and_idle()
        with socket.create_connection(fake.own.getsockname(), timeout=TIMEOUT) as conn:
            conn.sendall(b"peer\n")
            host, port = conn.getsockname()
            self.assertEqual(read_all(conn), b"slot=1 listener=0 %s:%d\n" % (host.encode(), port))

    def test_a_forked_worker_takes_its_seat_then_keeps_the_board(self):
        fake = self.fake.start_forked()
        fake.channel.send(b"\x02p\x00\x00\x00\x05")
        self.assertEqual(fake.message(), b"\x02P\x00\x00\x00\x05", "a ping before the seat")
        fake.seat(max_requests=2)
        wait_for("the worker to go idle", lambda: fake.read(STATE) == forkpool_board.IDLE)
        self.assertEqual(ask(fake.own.getsockname()), b"slot=1 listener=0 hi\n")
        self.assertEqual((fake.read(TAKEN), fake.read(SERVED)), (1, 1))
        # The inherited listener is the overflow: taken as the next one.
        first = socket.create_connection(fake.own.getsockname(), timeout=TIMEOUT)
        wait_for("the worker to accept", lambda: fake.read(TAKEN) == 2)
        waiting = socket.create_connection(fake.overflow.getsockname(), timeout=TIMEOUT)
        first.sendall(b"first\n")
        self.assertEqual(read_all(first), b"slot=1 listener=0 first\n")
        # Its share (2) served: it leaves rather than take the next.
        self.assertEqual(fake.message(), b"\x02X")
        self.assertEqual(fake.process.wait(timeout=TIMEOUT), 0)
        self.assertEqual(fake.read(NEXT), 0)
        first.close()
        waiting.close()

    def test_a_seat_with_the_wrong_descriptors_is_refused(self):
        fake = self.fake.start_forked()
        fake.seat(fds=[fake.board])
        fake.process.wait(timeout=TIMEOUT)
        self.assertNotEqual(fake.process.returncode, 0)
        self.assertIn(b"seat for 1 listener(s) with 1 descriptor(s)", fake.process.stderr.read())

    def left_for_a_limit_and_waits(self, fake):
        """The worker said X, busy; it is still there, waiting to be let
        go; with the channel shut down for sending (as the supervisor
        does after an X), it exits 0."""
        self.assertEqual(fake.message(), b"\x01X")
        self.assertEqual(fake.read(STATE), forkpool_board.BUSY)
        time.sleep(0.2)
        self.assertIsNone(fake.process.poll(), "it waits for the supervisor to let it go")
        fake.channel.shutdown(socket.SHUT_WR)
        self.assertEqual(fake.process.wait(timeout=TIMEOUT), 0)

    def test_a_worker_past_its_memory_limit_leaves_busy_after_the_connection(self):
        fake = self.fake.ready_and_idle(FORKPOOL_MAX_CHILD_MEMORY=str(64 << 20))
        self.assertEqual(ask(fake.own.getsockname(), b"grow 20\n"), b"slot=1 listener=0 grow 20\n")
        self.assertEqual(fake.read(STATE), forkpool_board.IDLE)
        self.assertEqual(ask(fake.own.getsockname(), b"grow 50\n"), b"slot=1 listener=0 grow 50\n")
        self.left_for_a_limit_and_waits(fake)
        self.assertEqual(fake.read(SERVED), 2)

    def test_a_worker_past_its_memory_limit_does_not_go_idle_early(self):
        fake = self.fake.ready_and_idle(FORKPOOL_MAX_CHILD_MEMORY=str(64 << 20))
        self.assertEqual(ask(fake.own.getsockname(), b"grow-end 80\n"), b"slot=1 listener=0 state=0\n")
        self.left_for_a_limit_and_waits(fake)

    def test_memory_shared_with_its_parent_does_not_count(self):
        # 100 MiB shared copy-on-write: its RSS is above the 64 MiB limit,
        # its USS (what the limit is on) far below.
        fake = self.fake.start(TEST_SHARED_MIB="100", FORKPOOL_MAX_CHILD_MEMORY=str(64 << 20))
        said = fake.message()
        self.assertEqual(said[:2], b"\x01K")
        worker = struct.unpack(">I", said[2:])[0]
        self.addCleanup(lambda: subprocess.run(["kill", "-9", str(worker)], stderr=subprocess.DEVNULL))
        wait_for("the worker to go idle", lambda: fake.read(STATE) == forkpool_board.IDLE)
        with open(f"/proc/{worker}/statm") as statm:
            self.assertGreater(int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"), 64 << 20)
        for n in range(1, 4):
            self.assertEqual(ask(fake.own.getsockname()), b"slot=1 listener=0 hi\n")
            self.assertEqual(fake.read(STATE), forkpool_board.IDLE)
            self.assertEqual(fake.read(SERVED), n)
        # Its own: over.
        ask(fake.own.getsockname(), b"grow 70\n")
        self.left_for_a_limit_and_waits(fake)

    def test_a_worker_past_its_lifetime_leaves_after_its_next_connection(self):
        fake = self.fake.ready_and_idle(FORKPOOL_MAX_CHILD_LIFETIME_MS="400")
        ask(fake.own.getsockname())
        self.assertEqual(fake.read(STATE), forkpool_board.IDLE)
        time.sleep(0.5)
        # Idle as its lifetime ended, it serves the connection that finds
        # it so, then leaves (the supervisor retires an idle one itself).
        self.assertEqual(ask(fake.own.getsockname()), b"slot=1 listener=0 hi\n")
        self.left_for_a_limit_and_waits(fake)
        self.assertEqual(fake.read(SERVED), 2)

    def test_a_quit_lets_a_worker_that_left_for_a_limit_go(self):
        fake = self.fake.ready_and_idle(FORKPOOL_MAX_CHILD_MEMORY=str(64 << 20))
        ask(fake.own.getsockname(), b"grow 80\n")
        self.assertEqual(fake.message(), b"\x01X")
        fake.channel.send(b"\x01p\x00\x00\x00\x01")  # sent before the X was read: ignored
        time.sleep(0.1)
        self.assertIsNone(fake.process.poll())
        fake.channel.send(b"\x01Q")
        self.assertEqual(fake.process.wait(timeout=TIMEOUT), 0)
        self.assertTrue(fake.nothing_said(), "no answer to the ping")

    def test_without_limits_nothing_is_looked_at(self):
        opened = lambda fake: [
            os.readlink(f"/proc/{fake.process.pid}/fd/{fd}")
            for fd in os.listdir(f"/proc/{fake.process.pid}/fd")
        ]
        fake = self.fake.ready_and_idle()
        ask(fake.own.getsockname())
        self.assertNotIn("/proc/%d/statm" % fake.process.pid, opened(fake))
        limited = FakeSupervisor()
        self.addCleanup(limited.stop)
        limited.ready_and_idle(FORKPOOL_MAX_CHILD_MEMORY=str(64 << 20))
        self.assertIn("/proc/%d/statm" % limited.process.pid, opened(limited))

    def test_a_ping_is_answered(self):
        fake = self.fake.ready_and_idle()
        fake.channel.send(b"\x01p\x00\x00\x01\x02")
        self.assertEqual(fake.message(), b"\x01P\x00\x00\x01\x02")


if __name__ == "__main__":
    unittest.main()
