#!/usr/bin/env python3
"""Resource use of a server's whole process tree, from /proc.

    treestat.py snapshot ROOT_PID      JSON: CPU ticks and context switches
                                       of ROOT and all its descendants
    treestat.py per-request BEFORE AFTER REQUESTS
                                       CPU microseconds and context switches
                                       per request between two snapshots:
                                       all, then voluntary (the process
                                       slept: a wake-up) and involuntary
                                       (the scheduler preempted it)
    treestat.py pss ROOT_PID           average PSS (KiB) of ROOT's children
    treestat.py uss ROOT_PID           median USS (KiB: Private_Clean +
                                       Private_Dirty) of ROOT's children;
                                       the median, so that a template or a
                                       master among them does not count
    treestat.py uss-pool ROOT_PID      the USS (KiB) of ROOT's children:
                                       median, mean, sum, and how many

CPU is utime+stime of every live process in the tree, plus the cutime+
cstime the root has collected from children that exited (workers recycled
during the window). Context switches are voluntary+involuntary, of every
thread of the live processes only.
"""

import json
import os
import sys


def children_map():
    kids = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        kids.setdefault(int(fields[1]), []).append(int(name))
    return kids


def tree(root):
    kids = children_map()
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def stat_fields(pid):
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    # Fields after "(comm)": index 0 is field 3 (state).
    return stat[stat.rindex(")") + 2 :].split()


def ctx_switches(pid):
    """(voluntary, involuntary) context switches of one process: the sum
    over its threads (/proc/PID/status counts the main thread's alone, and
    Puma's workers serve on other threads)."""
    voluntary = involuntary = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/status") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key == "voluntary_ctxt_switches":
                        voluntary += int(value)
                    elif key == "nonvoluntary_ctxt_switches":
                        involuntary += int(value)
        except OSError:
            continue  # the thread exited meanwhile
    return voluntary, involuntary


def snapshot(root):
    ticks = voluntary = involuntary = 0
    procs = 0
    for pid in tree(root):
        try:
            fields = stat_fields(pid)
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
            if pid == root:
                ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
            vol, invol = ctx_switches(pid)
            voluntary += vol
            involuntary += invol
            procs += 1
        except OSError:
            continue  # exited meanwhile
    return {
        "ticks": ticks,
        "hz": os.sysconf("SC_CLK_TCK"),
        "voluntary": voluntary,
        "involuntary": involuntary,
        "procs": procs,
    }


def per_request(before, after, requests):
    b, a = json.loads(before), json.loads(after)
    requests = max(int(requests), 1)
    cpu_us = (a["ticks"] - b["ticks"]) / a["hz"] * 1e6 / requests
    vol = (a["voluntary"] - b["voluntary"]) / requests
    invol = (a["involuntary"] - b["involuntary"]) / requests
    return f"{cpu_us:.0f} {vol + invol:.2f} {vol:.2f} {invol:.2f}"


def pss(root):
    values = []
    for pid in children_map().get(root, []):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        values.append(int(line.split()[1]))
        except OSError:
            continue
    if not values:
        return "- 0"
    return f"{sum(values) // len(values)} {len(values)}"


def uss(root):
    values = uss_values(root)
    if not values:
        return "- 0"
    return f"{values[len(values) // 2]} {len(values)}"


def uss_pool(root):
    values = uss_values(root)
    if not values:
        return "- - - 0"
    return f"{values[len(values) // 2]} {sum(values) // len(values)} {sum(values)} {len(values)}"


def uss_values(root):
    """The USS (KiB) of each of ROOT's children, sorted."""
    values = []
    for pid in children_map().get(root, []):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                private = sum(
                    int(line.split()[1])
                    for line in f
                    if line.startswith(("Private_Clean:", "Private_Dirty:"))
                )
            values.append(private)
        except OSError:
            continue
    values.sort()
    return values


def main(argv):
    if len(argv) == 2 and argv[0] == "snapshot":
        print(json.dumps(snapshot(int(argv[1]))))
    elif len(argv) == 4 and argv[0] == "per-request":
        print(per_request(argv[1], argv[2], argv[3]))
    elif len(argv) == 2 and argv[0] == "pss":
        print(pss(int(argv[1])))
    elif len(argv) == 2 and argv[0] == "uss":
        print(uss(int(argv[1])))
    elif len(argv) == 2 and argv[0] == "uss-pool":
        print(uss_pool(int(argv[1])))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
