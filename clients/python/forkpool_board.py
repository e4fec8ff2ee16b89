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
# A slot's state: busy (or no worker), idle; anything else is a
# reservation by the kernel, which only the kernel and the supervisor move.
BUSY = 0
IDLE = 1
_PAGE = 4096


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

    def go_busy(self):
        """Stores busy: the kernel picks this slot no more."""
        self.state.value = BUSY

    def close(self):
        """Unmaps the board (a worker becoming the template)."""
        # The views hold the mapping's buffer: drop them first.
        del self.state, self.taken, self.served, self.next, self._waiting
        self._map.close()
