#!/usr/bin/env python3
"""Medians of bench/apps.sh rounds: reads the rows of every round (stdin
or the files given) and prints, per server and cell, the median req/s
with the rounds' range, the median p99 and the median CPU per request;
then the median USS per worker of each server.

    bench/lib/medians.py ROUNDS_OUTPUT...
"""

import re
import statistics
import sys
from collections import defaultdict

CELL = re.compile(r"^(\S+)\s+c=(\d+)\s+(close|keepalive)\s+(\d+)\s+(\S+)\s+(\d+)\s")
USS = re.compile(r"^(\S+)\s+PSS per idle worker: (\d+) KiB, USS (\d+) KiB")


def ms(text):
    """wrk's p99 ("2.73ms", "1.2s", "950.00us") in milliseconds."""
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    if not match:
        return float("nan")
    value, unit = float(match.group(1)), match.group(2)
    return value * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def main(paths):
    cells = defaultdict(list)
    uss = defaultdict(list)
    order = []
    lines = []
    for path in paths or ["-"]:
        with (sys.stdin if path == "-" else open(path)) as f:
            lines += f.read().splitlines()
    for line in lines:
        cell = CELL.match(line)
        if cell:
            name, conc, mode, rps, p99, cpu = cell.groups()
            key = (name, int(conc), mode)
            if key not in cells:
                order.append(key)
            cells[key].append((int(rps), ms(p99), int(cpu)))
            continue
        mem = USS.match(line)
        if mem:
            uss[mem.group(1)].append(int(mem.group(3)))
    print("# medians of %d round(s)" % max((len(v) for v in cells.values()), default=0))
    print("# server                     conc  mode         req/s (range)            p99 ms  cpu_us/req")
    for key in order:
        runs = cells[key]
        rps = [r[0] for r in runs]
        print(
            "%-26s c=%-3d %-9s %8d (%d-%d) %8.2f %6d"
            % (key[0], key[1], key[2], statistics.median(rps), min(rps), max(rps),
               statistics.median(r[1] for r in runs), statistics.median(r[2] for r in runs))
        )
    for name, values in uss.items():
        print("%-26s USS per worker (median): %d KiB" % (name, statistics.median(values)))


if __name__ == "__main__":
    main(sys.argv[1:])
