#!/usr/bin/env python3
"""Runs a program with its memory marked for the kernel's same-page merging
(prctl PR_SET_MEMORY_MERGE, kept across exec since Linux 6.7), as systemd's
MemoryKSM=yes starts a service: bench/spamd.sh runs spamd under it.

    ksm_exec.py PROGRAM [ARGS...]
"""

import ctypes
import os
import sys

PR_SET_MEMORY_MERGE = 67


def main(argv):
    if not argv:
        sys.exit(__doc__)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_MEMORY_MERGE, 1, 0, 0, 0) != 0:
        sys.exit(f"ksm_exec.py: prctl(PR_SET_MEMORY_MERGE): {os.strerror(ctypes.get_errno())}")
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
