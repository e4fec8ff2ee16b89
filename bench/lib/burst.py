"""Loopback HTTP clients for bench/cpu_hold.sh, connection per request.

  burst.py PORT burst N PATH       N requests at once; the last answer's time
  burst.py PORT load C PATH SECS   C clients back to back for SECS seconds

Prints one line of key=value pairs (seconds, req/s, milliseconds).
"""

import socket
import sys
import threading
import time


def get(port, path):
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    if not answer.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(answer[:40])


def burst(port, n, path):
    start = threading.Barrier(n + 1)
    done, errors = [], []

    def one():
        start.wait()
        try:
            get(port, path)
            done.append(time.monotonic())
        except Exception as e:  # counted, not raised: the line says how many
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.monotonic()
    for t in threads:
        t.join(120)
    took = sorted(d - t0 for d in done)
    print(f"last={took[-1]:.3f} p50={took[len(took) // 2]:.3f} errors={len(errors)}")


def load(port, clients, path, secs):
    start = threading.Barrier(clients + 1)
    latencies, errors = [], []
    stop_at = [0.0]

    def client():
        start.wait()
        mine = []
        while time.monotonic() < stop_at[0]:
            t = time.monotonic()
            try:
                get(port, path)
                mine.append(time.monotonic() - t)
            except Exception as e:
                errors.append(e)
        latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    stop_at[0] = time.monotonic() + secs
    start.wait()
    for t in threads:
        t.join()
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99)] * 1000
    print(f"rps={len(latencies) / secs:.0f} p99={p99:.1f} errors={len(errors)}")


if __name__ == "__main__":
    port, what = int(sys.argv[1]), sys.argv[2]
    if what == "burst":
        burst(port, int(sys.argv[3]), sys.argv[4])
    else:
        load(port, int(sys.argv[3]), sys.argv[4], float(sys.argv[5]))
