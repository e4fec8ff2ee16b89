"""Unit tests of the templates' double fork, in forkpool_worker.Template
and in the Perl helper's Forkpool::Worker::Template.

Run from clients/python: python3 -m unittest discover -s tests
"""

import ctypes
import os
import select
import signal
import socket
import struct
import time
import unittest

import forkpool_worker

PERL_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "perl")
PR_SET_CHILD_SUBREAPER = 36
TIMEOUT = 10.0
DIED_WITH = 7


def wait_dead(pid):
    """Returns once process `pid` has exited (a zombie, or already reaped),
    or after TIMEOUT."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        select.select([fd], [], [], TIMEOUT)
    finally:
        os.close(fd)


class DyingWorkerTemplate(forkpool_worker.Template):
    """A template whose worker dies at once, and whose intermediate child
    exits only after that: the order in which a worker that crashes on
    start-up is lost when its parent ignores SIGCHLD."""

    def _become_worker(self, slot, generation, fds, intermediate):
        os._exit(DIED_WITH)

    def _send(self, kind, payload=b""):
        if kind == b"W":
            wait_dead(struct.unpack(">II", payload)[1])
        super()._send(kind, payload)


# The Perl twin of DyingWorkerTemplate, started as a template on
# descriptor 3.
PERL_DYING_WORKER_TEMPLATE = r"""
use strict;
use warnings;
use POSIX ();
use Forkpool::Worker;
no warnings 'redefine';
*Forkpool::Worker::Template::_become_worker = sub { POSIX::_exit(%d) };
my $send = \&Forkpool::Worker::Template::_send;
*Forkpool::Worker::Template::_send = sub {
    my ($self, $kind, $payload) = @_;
    if ($kind eq 'W') {
        my (undef, $pid) = unpack('N N', $payload);
        my $deadline = time + %d;
        while (time < $deadline) {
            open(my $stat, '<', "/proc/$pid/stat") or last;    # reaped
            last if (split ' ', scalar <$stat>)[2] eq 'Z';      # a zombie
            select(undef, undef, undef, 0.001);
        }
    }
    $send->(@_);
};
Forkpool::Worker->from_env->serve(sub { die "no connections here\n" });
""" % (DIED_WITH, TIMEOUT)


def python_template(channel, supervisor_pid):
    DyingWorkerTemplate(channel, [], 1, "handoff", supervisor_pid).serve(None)


def perl_template(channel, supervisor_pid):
    os.dup2(channel.fileno(), 3)  # inheritable
    env = dict(
        os.environ,
        FORKPOOL_PROTOCOL="2",
        FORKPOOL_TEMPLATE_FD="3",
        FORKPOOL_SUPERVISOR_PID=str(supervisor_pid),
        FORKPOOL_GENERATION="1",
        FORKPOOL_DISPATCH="handoff",
    )
    for name in ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"):
        env.pop(name, None)
    os.execvpe("perl", ["perl", "-I", PERL_DIR, "-e", PERL_DYING_WORKER_TEMPLATE], env)


def supervise_one_fork(run_template):
    """In a process of its own: plays the supervisor (a child subreaper) for
    a template whose worker dies at once (`run_template(channel,
    supervisor_pid)` runs it in a child), orders one fork and says how the
    worker ended as the supervisor sees it: "reaped STATUS", or why not."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        return "cannot become a child subreaper"
    sup, tmpl = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    template = os.fork()
    if template == 0:
        try:
            sup.close()
            run_template(tmpl, os.getppid())
        finally:
            os._exit(0)
    tmpl.close()
    sup.settimeout(TIMEOUT)
    try:
        if sup.recv(16)[:2] != b"\x02R":
            return "the template did not say Ready first"
        chan_sup, chan_worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        err_r, err_w = os.pipe()
        order = b"\x02F" + struct.pack(">II", 0, 1)
        socket.send_fds(sup, [order], [chan_worker.fileno(), err_w])
        chan_worker.close()
        os.close(err_w)
        chan_sup.close()  # the worker dies without reading it
        os.close(err_r)
        answer = sup.recv(16)
        if answer[:2] != b"\x02W":
            return f"the template answered {answer!r}, not W"
        worker = struct.unpack(">II", answer[2:])[1]
        # The worker is the intermediate's child until the intermediate
        # exits; then, if it is still there to be adopted, ours.
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            try:
                pid, status = os.waitpid(worker, os.WNOHANG)
            except ChildProcessError:
                if not os.path.exists(f"/proc/{worker}"):
                    return "gone: reaped by someone the supervisor cannot see"
            else:
                if pid == worker:
                    return f"reaped {os.waitstatus_to_exitcode(status)}"
            time.sleep(0.001)
        return "still not adopted by the supervisor"
    finally:
        sup.close()  # end of file: the template returns from serve
        os.waitpid(template, 0)


class DoubleForkTest(unittest.TestCase):
    """The template ignores SIGCHLD so that the kernel reaps its
    intermediate children. The intermediate must not pass that on while it
    forks the worker: a worker that dies before the intermediate exits
    would be reaped by the kernel too, and the supervisor would never see
    it go (its slot would never be freed)."""

    def check(self, run_template):
        r, w = os.pipe()
        supervisor = os.fork()
        if supervisor == 0:
            os.close(r)
            try:
                result = supervise_one_fork(run_template)
            except BaseException as e:
                result = f"error: {e!r}"
            os.write(w, result.encode())
            os._exit(0)
        os.close(w)
        try:
            ready, _, _ = select.select([r], [], [], 3 * TIMEOUT)
            result = os.read(r, 200).decode() if ready else "no answer"
        finally:
            os.close(r)
            if not ready:
                os.kill(supervisor, signal.SIGKILL)
            os.waitpid(supervisor, 0)
        self.assertEqual(result, f"reaped {DIED_WITH}")

    def test_python_a_worker_dead_before_the_intermediate_is_reaped_by_the_supervisor(self):
        self.check(python_template)

    def test_perl_a_worker_dead_before_the_intermediate_is_reaped_by_the_supervisor(self):
        self.check(perl_template)


if __name__ == "__main__":
    unittest.main()
