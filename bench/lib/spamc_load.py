#!/usr/bin/env python3
"""spamc as the load for bench/spamd.sh: C clients, one spamc process per
message, back to back, until N messages are answered.

    spamc_load.py PORT C N MESSAGE...    prints one line: msgs_per_s=...
                                         p99_ms=... digest=... failed=...

Each client takes the next message (the files given, in turn) and runs
`spamc -R` (REPORT: the score and the rules hit, nothing time-dependent).
`digest` is a hash of every (message, answer) pair in message order, so
two servers gave identical answers exactly when their digests are equal.
A burst is the same with C = N: the seconds until the last answer.
"""

import hashlib
import subprocess
import sys
import threading
import time


def main(port, clients, total, paths):
    bodies = [open(p, "rb").read() for p in paths]
    answers = [None] * total
    latencies = []
    failed = 0
    lock = threading.Lock()
    next_index = [0]

    def client():
        nonlocal failed
        while True:
            with lock:
                i = next_index[0]
                if i >= total:
                    return
                next_index[0] += 1
            body = bodies[i % len(bodies)]
            start = time.monotonic()
            run = subprocess.run(
                ["spamc", "-d", "127.0.0.1", "-p", str(port), "-x", "-R"],
                input=body, capture_output=True, timeout=120,
            )
            took = time.monotonic() - start
            with lock:
                latencies.append(took)
                answers[i] = (i % len(bodies), run.returncode, run.stdout)
                if run.returncode not in (0, 1):
                    failed += 1

    start = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    digest = hashlib.sha256()
    for which, code, out in sorted(set(answers)):
        digest.update(f"{which} {code} ".encode() + out)
    print(f"msgs_per_s={total / elapsed:.2f} p99_ms={p99 * 1000:.0f} "
          f"seconds={elapsed:.2f} digest={digest.hexdigest()[:16]} failed={failed}")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:])
