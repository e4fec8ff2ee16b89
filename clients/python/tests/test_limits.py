"""Unit tests of when a `kernel` dispatch worker reads smaps_rollup
(forkpool_worker.rollup_due and Limits.memory_past), without /proc: the
worker's memory is a model, private pages (USS) and pages shared with its
template (RSS counts both), and its reads of smaps_rollup are counted.

Run from clients/python: python3 -m unittest discover -s tests
"""

import itertools
import os
import random
import unittest

import forkpool_worker
from forkpool_worker import SMAPS_REREAD, Limits, rollup_due

LIMIT = 8  # the units are whatever the worker counts in; small, to enumerate


def could_pass(limit, rss, last, now):
    """The rule in other words: a read is due unless there was one, less
    than SMAPS_REREAD ago, and what USS was then plus what RSS has grown
    since stays below the limit."""
    if last is None:
        return True
    uss_then, rss_then, then = last
    grown = rss - rss_then if rss > rss_then else 0
    return uss_then + grown >= limit or not now - then < SMAPS_REREAD


class RuleTest(unittest.TestCase):
    def test_the_rule_over_every_small_case(self):
        times = [0.0, 0.05, SMAPS_REREAD - 1e-6, SMAPS_REREAD, 0.3]
        cases = 0
        for uss_then, rss_then, rss, when in itertools.product(
                range(LIMIT + 3), range(LIMIT, 2 * LIMIT + 2), range(LIMIT + 1, 3 * LIMIT), times):
            last = (uss_then, rss_then, 1000.0)
            self.assertEqual(
                rollup_due(LIMIT, rss, last, 1000.0 + when),
                could_pass(LIMIT, rss, last, 1000.0 + when),
                (uss_then, rss_then, rss, when))
            cases += 1
        for rss in range(LIMIT + 1, 3 * LIMIT):
            self.assertTrue(rollup_due(LIMIT, rss, None, 0.0), "no read yet")
        self.assertGreater(cases, 5000)

    def test_the_edges(self):
        mib = 1 << 20
        last = (40 * mib, 100 * mib, 0.0)
        self.assertFalse(rollup_due(64 * mib, 123 * mib, last, 0.099), "23 MiB more cannot pass 24")
        self.assertTrue(rollup_due(64 * mib, 124 * mib, last, 0.0), "24 MiB more could")
        self.assertFalse(rollup_due(64 * mib, 90 * mib, last, 0.05), "RSS fell")
        self.assertTrue(rollup_due(64 * mib, 100 * mib, last, SMAPS_REREAD), "100 ms on")
        full = (64 * mib, 100 * mib, 0.0)
        self.assertTrue(rollup_due(64 * mib, 90 * mib, full, 0.0), "no room left")


class Worker:
    """A worker's memory: `private` pages (its USS) and `shared` ones (RSS
    is both), its look at the end of each connection, and its reads."""

    def __init__(self, private, shared):
        self.private, self.shared = private, shared
        self.limits = Limits(max_memory=LIMIT)
        self.reads = 0
        self.now = 100.0

    def read_uss(self):
        self.reads += 1
        return self.private

    def connection(self, alloc, free, cow, took):
        self.private += alloc - min(free, self.private)
        cow = min(cow, self.shared)
        self.shared -= cow
        self.private += cow
        self.now += took
        return self.limits.memory_past(self.private + self.shared, self.now, self.read_uss)


class LookTest(unittest.TestCase):
    def run_connections(self, private, shared, steps):
        """Runs `steps` on a worker and checks each look: never past while
        USS is not; once USS is past, found at the first look with no
        copy-on-write break since the last read, or SMAPS_REREAD after it;
        no read while RSS is at or under the limit."""
        worker = Worker(private, shared)
        cow_since_read = False
        for alloc, free, cow, took in steps:
            reads, before = worker.reads, worker.limits.last_rollup
            cow_since_read |= cow > 0 and worker.shared > 0
            found = worker.connection(alloc, free, cow, took)
            rss = worker.private + worker.shared
            read = worker.reads > reads
            self.assertFalse(read and rss <= LIMIT, "a read with RSS under the limit")
            if read:
                cow_since_read = False
            stale = before is None or worker.now - before[2] >= SMAPS_REREAD
            if worker.private > LIMIT:
                if not cow_since_read or stale:
                    self.assertEqual(found, worker.private, (private, shared, steps))
            else:
                self.assertIsNone(found, (private, shared, steps))
            if found is not None:
                return

    def test_every_short_run(self):
        # Each connection: allocates 0, 1 or 4, frees 0 or 2, breaks 0 or
        # 3 copy-on-write, takes 0, 40 or 100 ms.
        steps = list(itertools.product((0, 1, 4), (0, 2), (0, 3), (0.0, 0.04, 0.1)))
        for private, shared in ((0, 0), (2, 10), (7, 4), (5, 20)):
            for run in itertools.product(steps, repeat=3):
                self.run_connections(private, shared, run)

    def test_long_runs(self):
        rng = random.Random(44)
        for _ in range(2000):
            run = [(rng.choice((0, 0, 1, 3)), rng.choice((0, 0, 2)),
                    rng.choice((0, 0, 0, 0, 2)), rng.choice((0.001, 0.01, 0.03)))
                   for _ in range(rng.randrange(1, 60))]
            self.run_connections(rng.randrange(0, 8), rng.randrange(0, 30), run)

    def test_a_preloaded_worker_reads_every_100_ms_at_most(self):
        # RSS 30 over a limit of 8, USS 2: a connection every millisecond
        # for a second.
        worker = Worker(private=2, shared=28)
        for _ in range(1000):
            self.assertIsNone(worker.connection(0, 0, 0, 0.001))
        self.assertGreaterEqual(worker.reads, 1)
        self.assertLessEqual(worker.reads, 10)

    def test_a_worker_growing_fast_is_read_after_every_connection(self):
        # RSS at the limit, then above it: the first read finds USS 3,
        # 5 below the limit; 6 more could pass it, and do.
        worker = Worker(private=2, shared=6)
        self.assertIsNone(worker.connection(0, 0, 0, 0.001))  # RSS 8: not above
        self.assertEqual(worker.reads, 0)
        self.assertIsNone(worker.connection(1, 0, 0, 0.001))
        self.assertEqual(worker.reads, 1)
        self.assertEqual(worker.connection(6, 0, 0, 0.001), 9)
        self.assertEqual(worker.reads, 2)

    def test_under_the_limit_nothing_is_read_nor_kept(self):
        worker = Worker(private=1, shared=7)
        for _ in range(10):
            self.assertIsNone(worker.connection(0, 0, 0, 0.2))
        self.assertEqual((worker.reads, worker.limits.last_rollup), (0, None))

    def test_the_process_reads_its_own_statm_and_rollup(self):
        # The real look: this test process holds more than 1 KiB of its
        # own, and less than a petabyte.
        limits = Limits(max_memory=1024)
        self.assertTrue(limits.start())
        self.addCleanup(os.close, limits._statm)
        self.assertEqual(limits.past(), "memory")
        self.assertGreater(limits.last_rollup[0], 1024)
        huge = Limits(max_memory=1 << 50)
        huge.start()
        self.addCleanup(os.close, huge._statm)
        self.assertIsNone(huge.past())
        self.assertIsNone(huge.last_rollup)
        self.assertEqual(forkpool_worker.SMAPS_REREAD, 0.1)


if __name__ == "__main__":
    unittest.main()
