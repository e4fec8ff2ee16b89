"""forkpool_worker's accept for its listeners gives what socket.accept
gives: a blocking, close-on-exec socket of the listener's family, and the
peer's address.

Run from clients/python: python3 -m unittest discover -s tests
"""

import errno
import os
import socket
import tempfile
import unittest
from unittest import mock

import forkpool_worker


class AcceptFrom(unittest.TestCase):
    def check(self, listener, client):
        conn, peer = forkpool_worker._accept_from(listener)
        with conn:
            self.assertEqual(conn.family, listener.family)
            self.assertEqual(conn.type, socket.SOCK_STREAM)
            self.assertIsNone(conn.gettimeout())
            self.assertTrue(conn.getblocking())
            self.assertFalse(os.get_inheritable(conn.fileno()))
            client.sendall(b"ping")
            self.assertEqual(conn.recv(4), b"ping")
            conn.sendall(b"pong")
            self.assertEqual(client.recv(4), b"pong")
        return peer

    def test_tcp(self):
        with socket.create_server(("127.0.0.1", 0)) as listener:
            listener.setblocking(False)  # as a pool's listeners are
            with socket.create_connection(listener.getsockname(), timeout=5) as client:
                peer = self.check(listener, client)
                self.assertEqual(peer, client.getsockname())

    def test_unix(self):
        with tempfile.TemporaryDirectory() as scratch:
            path = os.path.join(scratch, "s")
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
                listener.bind(path)
                listener.listen(1)
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                    client.settimeout(5)
                    client.connect(path)
                    self.check(listener, client)

    def test_nothing_waiting_is_blocking_io_error(self):
        with socket.create_server(("127.0.0.1", 0)) as listener:
            listener.setblocking(False)
            with self.assertRaises(BlockingIOError):
                forkpool_worker._accept_from(listener)


class AcceptFailures(unittest.TestCase):
    """An ordered accept (`order`, `shared`) that fails: `M`, and when the
    worker is out of descriptors or memory, `X` after it, the worker
    leaving rather than trying again (docs/protocol.md, "Running out of
    descriptors")."""

    def said_after_failing_with(self, code):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with ours, theirs, socket.create_server(("127.0.0.1", 0)) as listener:
            worker = forkpool_worker.Worker(ours, [listener], 0, 1, "order")
            failing = mock.patch.object(
                forkpool_worker, "_accept_from", side_effect=OSError(code, os.strerror(code))
            )
            with failing:
                worker._accept(0, lambda conn, listener: self.fail("nothing to serve"))
            theirs.setblocking(False)
            said = []
            try:
                while True:
                    said.append(theirs.recv(16))
            except BlockingIOError:
                pass
            return said, worker.leaving

    def test_out_of_descriptors_says_missed_then_leaves(self):
        for code in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
            with self.subTest(errno=errno.errorcode[code]):
                self.assertEqual(self.said_after_failing_with(code), ([b"\x01M", b"\x01X"], True))

    def test_another_failure_says_missed_and_stays(self):
        self.assertEqual(self.said_after_failing_with(errno.EPERM), ([b"\x01M"], False))


if __name__ == "__main__":
    unittest.main()
