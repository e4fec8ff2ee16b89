"""A worker written from docs/protocol.md before kernel dispatch existed:
it says `R`, never touches the scoreboard, and serves whatever connection
the supervisor hands it (`C`) as in `handoff`, whatever FORKPOOL_DISPATCH
says. In `kernel` dispatch the supervisor must still serve through it.

Reads each request's head and answers `HTTP/1.0 200 OK` with
`X-Forkpool-Slot`, then closes the connection.
"""

import os
import socket
import struct
import sys

channel_fd = int(os.environ["FORKPOOL_CHANNEL_FD"])
listeners = int(os.environ.get("LISTEN_FDS", "0"))
if channel_fd != 3 + listeners:
    sys.exit(f"FORKPOOL_CHANNEL_FD is {channel_fd}, expected {3 + listeners}")
slot = os.environ["FORKPOOL_SLOT"]
channel = socket.socket(fileno=channel_fd)
channel.setblocking(True)
response = (
    "HTTP/1.0 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n"
    f"X-Forkpool-Slot: {slot}\r\nX-Forkpool-Pid: {os.getpid()}\r\n\r\nhello\n"
).encode()

channel.send(struct.pack(">BBI", 1, ord("R"), os.getpid()))
while True:
    msg, fds, _, _ = socket.recv_fds(channel, 16, 1)
    if not msg:
        sys.exit(0)
    kind = msg[1:2]
    if kind == b"C" and len(fds) == 1:
        conn = socket.socket(fileno=fds[0])
        try:
            conn.settimeout(5)
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                head += chunk
            conn.sendall(response)
        except OSError:
            pass
        channel.send(bytes([1, ord("I")]))
        conn.close()
    elif kind == b"p":
        channel.send(bytes([1, ord("P")]) + msg[2:6])
    elif kind == b"Q":
        sys.exit(0)
    else:
        sys.exit(f"unexpected message {msg!r} with {len(fds)} descriptor(s)")
