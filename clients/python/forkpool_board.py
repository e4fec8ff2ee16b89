"""The scoreboard of `kernel` dispatch, as one worker sees it (standard
library only).

In `forkpool run --dispatch kernel` the supervisor passes every worker a
shared memory map, the scoreboard (FORKPOOL_BOARD_FD). The kernel picks the
lowest slot whose record says idle for each new connection; the worker
says idle or busy there with a plain store, no system call. The layout is
in forkpool's docs/protocol.md ("`kernel` dispatch"): 64-bit words, native
(little-endian) order, aligned.

| word | meaning |
|---|---|
| 0 | the magic `fkpbrd01` |
| 1 | the number of slots |
| 2 | nonzero: the supervisor wants an `I` from a worker going idle |
| 3 | connections the kernel sent to the overflow |
| 4 | connections taken from the overflow (atomic adds) |
| 5 | the dispatch bound: 0 (none), or the first slot outside the pool's dispatch width |
| 8+4s .. 11+4s | slot s: state, taken, served, next |

`Record` maps the board once and makes a `ctypes.c_uint64` view of each
word it uses, once: an aligned 8-byte load or store through a view, with
no object made per connection.
"""

import ctypes
import mmap
import threading

# Word 0: the layout's name and version, "fkpbrd01" read as a
# little-endian 64-bit word.
MAGIC = int.from_bytes(b"fkpbrd01", "little")
HEADER_WORDS = 8
RECORD_WORDS = 4
_SLOTS_WORD = 1
_WAITING_WORD = 2
_OVERFLOW_SENT_WORD = 3
_OVERFLOW_TAKEN_WORD = 4
# Word 5, the supervisor's: 0, or the first slot outside the dispatch
# width. The kernel gives the slots from it on no new connection, and
# their workers take none from the overflow as they finish one.
_BOUND_WORD = 5
# A slot's state: busy (or no worker), idle; anything else is a
# reservation by the kernel, which only the kernel and the supervisor move.
BUSY = 0
IDLE = 1
_PAGE = 4096


def _fetch_add():
    """libatomic's 64-bit fetch-and-add (ctypes), or None where the
    library is not installed."""
    try:
        add = ctypes.CDLL("libatomic.so.1").__atomic_fetch_add_8
    except (OSError, AttributeError):
        return None
    add.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int]
    add.restype = ctypes.c_uint64
    return add


_FETCH_ADD = _fetch_add()
_SEQ_CST = 5  # __ATOMIC_SEQ_CST


class BoardError(RuntimeError):
    """The board cannot be used: not mapped, not a forkpool board, or too
    small for this slot."""


def map_length(slot):
    """Bytes to map so that slot `slot`'s record is inside: the header and
    records up to it, rounded up to the page size."""
    needed = 8 * (HEADER_WORDS + RECORD_WORDS * (slot + 1))
    return -(-needed // _PAGE) * _PAGE


class Record:
    """Slot `slot`'s record on the board mapped from descriptor `fd`.

    `state`, `taken`, `served` and `next` are views of its four words
    (`.value` loads and stores them); only this worker writes the last
    three, so `+= 1` needs no atomic."""

    def __init__(self, fd, slot):
        try:
            self._map = mmap.mmap(
                fd, map_length(slot), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE
            )
        except (OSError, ValueError) as e:
            raise BoardError(
                f"cannot map the scoreboard (descriptor {fd}): {e}; "
                "FORKPOOL_BOARD_FD must be the board map `forkpool run --dispatch kernel` passes"
            ) from None
        magic = self._word(0).value
        if magic != MAGIC:
            raise BoardError(
                f"descriptor {fd} is not a forkpool scoreboard (word 0 is {magic:#x}, "
                f"not {MAGIC:#x}): this helper speaks board layout fkpbrd01; "
                "upgrade the helper to match the supervisor"
            )
        slots = self._word(_SLOTS_WORD).value
        if slot >= slots:
            raise BoardError(
                f"slot {slot} is not on the scoreboard ({slots} slots): "
                "FORKPOOL_SLOT and FORKPOOL_BOARD_FD come from different pools"
            )
        self._waiting = self._word(_WAITING_WORD)
        self._overflow_sent = self._word(_OVERFLOW_SENT_WORD)
        self._overflow_taken = self._word(_OVERFLOW_TAKEN_WORD)
        self._overflow_taken_at = ctypes.addressof(self._overflow_taken)
        self._bound = self._word(_BOUND_WORD)
        self._slot = slot
        base = HEADER_WORDS + RECORD_WORDS * slot
        self.state = self._word(base)
        self.taken = self._word(base + 1)
        self.served = self._word(base + 2)
        self.next = self._word(base + 3)
        self._fence = threading.Lock()

    def _word(self, index):
        return ctypes.c_uint64.from_buffer(self._map, 8 * index)

    def go_idle(self):
        """Stores idle, then (after a full fence) reads word 2: True when
        the supervisor holds connections and wants to hear `I`.

        Python has no fence of its own. Taking and giving back a lock
        runs a locked instruction, a full fence on x86-64; elsewhere it may
        not order the store before the load, and the rare missed `I` costs
        at most the supervisor's next look at the board (100 ms)."""
        self.state.value = IDLE
        fence = self._fence
        fence.acquire()
        fence.release()
        return self._waiting.value != 0

    def overflow_may_wait(self):
        """False when a finishing worker is not to look on an overflow
        socket (a system call): its slot is outside the dispatch width
        (word 5 is set and not above the slot), or nothing can wait there
        (the kernel sent no more there than were taken; word 4 is read
        first).

        Under load that computes, the supervisor narrows the set of
        workers that serve, so that each stays hot in its CPU's cache; a
        worker outside it that took from the overflow would keep serving
        and never leave the set, so it goes idle instead."""
        bound = self._bound.value
        if bound and self._slot >= bound:
            return False
        taken = self._overflow_taken.value
        return self._overflow_sent.value > taken

    def count_overflow_taken(self):
        """One connection taken from an overflow socket: word 4 goes up by
        one, atomically (the supervisor adds too). Without libatomic it is
        left alone: a racy add could lose the supervisor's, and word 4 must
        never count more than were taken; the workers then look every
        time, as they would without the words."""
        if _FETCH_ADD is not None:
            _FETCH_ADD(self._overflow_taken_at, 1, _SEQ_CST)

    def go_busy(self):
        """Stores busy: the kernel picks this slot no more."""
        self.state.value = BUSY

    def close(self):
        """Unmaps the board (a worker becoming the template)."""
        # The views hold the mapping's buffer: drop them first.
        del self.state, self.taken, self.served, self.next, self._waiting
        del self._overflow_sent, self._overflow_taken, self._bound
        self._map.close()
