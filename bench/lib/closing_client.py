"""Sends N requests, each on its own connection (Connection: close), from
C threads at once, and prints how many were answered 200.

    python3 bench/lib/closing_client.py PORT N [C]

bench/instructions.sh drives a worker under valgrind with it: a load
generator that kept a fixed rate would only time out there.
"""

import socket
import sys
import threading


def main():
    port, total = int(sys.argv[1]), int(sys.argv[2])
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    request = b"GET / HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n\r\n" % port
    answered = [0]
    lock = threading.Lock()

    def run(count):
        for _ in range(count):
            with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
                conn.sendall(request)
                data = b""
                while chunk := conn.recv(4096):
                    data += chunk
            if data.startswith(b"HTTP/1.1 200"):
                with lock:
                    answered[0] += 1

    workers = [threading.Thread(target=run, args=(total // threads,)) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    print(answered[0])


if __name__ == "__main__":
    main()
