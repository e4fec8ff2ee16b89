# frozen_string_literal: true

require "fiddle"
require_relative "libc"

module Forkpool
  # One worker's record on the scoreboard of `kernel` dispatch
  # (docs/protocol.md, "`kernel` dispatch"): the board mapped with libc's
  # mmap through Fiddle, the slot's state and its three counts. Of the
  # header it reads words 0 and 1 (the magic, the slot count) once, and,
  # as it goes, word 2 (the supervisor waits for an `I`), words 3 and 4
  # (the overflow's counts, word 4 also added to) and word 5 (the dispatch
  # bound).
  #
  # Every store and load goes through Fiddle::Pointers made here, once:
  # the fast path allocates no Fiddle object (a count's store packs a
  # small string). The counts have one writer (this worker), so they are
  # kept in Ruby and stored whole.
  #
  # Going idle is the one store that races: the kernel may move idle to a
  # reservation at any moment. It is libatomic's __atomic_exchange_8 with
  # sequential consistency when libatomic.so.1 loads (an `xchg` on x86-64:
  # one locked 8-byte store, which is also the full fence the read of the
  # "waiting" word after it needs). Without libatomic: a Fiddle store (a
  # memcpy of 8 aligned bytes, which glibc may do as two stores of the same
  # word: a reservation made between them is overwritten, and the kernel
  # queues one more connection on this worker, delayed, never lost), then
  # glibc's pthread_spin_trylock on a lock this worker holds as the fence
  # (a locked cmpxchg on x86-64; no fence where glibc's trylock is a plain
  # load: a wake-up missed then waits for the supervisor's re-read of the
  # board, at most 100 ms).
  class Board
    # `fkpbrd01`: the board's layout and version, the first word.
    MAGIC = "fkpbrd01".b.freeze
    WORD = 8
    PAGE = 4096
    # Word 2: nonzero while the supervisor holds connections for the next
    # worker to go idle.
    WAITING = 2 * WORD
    # Words 3 and 4: connections the kernel sent to the overflow, and
    # those taken from it (by the supervisor or a finishing worker).
    OVERFLOW_SENT = 3 * WORD
    OVERFLOW_TAKEN = 4 * WORD
    # Word 5, the supervisor's: the dispatch bound. 0, or the first slot
    # outside the pool's dispatch width: the kernel gives the slots from
    # it on no new connection, and their workers take none from the
    # overflow as they finish one.
    BOUND = 5 * WORD
    IDLE = [1].pack("Q<").freeze
    ZERO = [0].pack("Q<").freeze
    BUSY = ZERO
    SEQ_CST = 5 # __ATOMIC_SEQ_CST

    # libatomic's exchange, or nil where the library is not installed.
    EXCHANGE = begin
      Fiddle::Function.new(Fiddle::Handle.new("libatomic.so.1")["__atomic_exchange_8"],
                           [Fiddle::TYPE_VOIDP, Fiddle::TYPE_LONG_LONG, Fiddle::TYPE_INT],
                           Fiddle::TYPE_LONG_LONG)
    rescue Fiddle::DLError
      nil
    end

    # libatomic's fetch-and-add, or nil where the library is not installed.
    FETCH_ADD = begin
      Fiddle::Function.new(Fiddle::Handle.new("libatomic.so.1")["__atomic_fetch_add_8"],
                           [Fiddle::TYPE_VOIDP, Fiddle::TYPE_LONG_LONG, Fiddle::TYPE_INT],
                           Fiddle::TYPE_LONG_LONG)
    rescue Fiddle::DLError
      nil
    end

    attr_reader :taken, :served, :taken_next

    # Maps the board of descriptor `fd` for `slot`. Raises ArgumentError,
    # saying why, when it is not the board or `slot` is not on it.
    # `atomics: false` uses the fallback even where libatomic loads.
    def initialize(fd, slot, atomics: true)
      length = (WORD * (8 + 4 * (slot + 1)) + PAGE - 1) / PAGE * PAGE
      @ptr = Libc.map_shared(fd, length)
      check(slot)
      @slot = slot
      @state = (8 + 4 * slot) * WORD
      # A pointer, not an address: Fiddle turns an Integer argument into
      # a new pointer object on every call.
      @state_ptr = @ptr + @state
      @exchange = atomics ? EXCHANGE : nil
      @fetch_add = atomics ? FETCH_ADD : nil
      @overflow_taken_ptr = @ptr + OVERFLOW_TAKEN
      @fence_lock = Libc.held_spin_lock unless @exchange
      @taken = load(@state + WORD)
      @served = load(@state + 2 * WORD)
      @taken_next = load(@state + 3 * WORD)
    end

    # Which way going idle is done: :exchange or :store_and_trylock.
    def idle_store
      @exchange ? :exchange : :store_and_trylock
    end

    # Unmaps the board (a worker turning into the template); nothing may
    # be called on it after.
    def release
      Libc.unmap(@ptr)
      @ptr = @state_ptr = nil
    end

    # state := busy (nothing else ever moves a busy state: a plain store).
    def busy!
      @ptr[@state, WORD] = BUSY
    end

    # state := idle, a full fence, then true when the supervisor waits to
    # hear of an idle worker (word 2 is set: send `I`).
    def idle!
      if @exchange
        @exchange.call(@state_ptr, 1, SEQ_CST)
      else
        @ptr[@state, WORD] = IDLE
        Libc.fence(@fence_lock)
      end
      @ptr[WAITING, WORD] != ZERO
    end

    # The state word as stored: 0 busy, 1 idle, else a reservation.
    def state
      load(@state)
    end

    # This worker accepted a connection itself (its socket or the overflow).
    def took!
      @taken += 1
      @ptr[@state + WORD, WORD] = [@taken].pack("Q<")
    end

    # It took one from the overflow as it finished another.
    def took_next!
      took!
      @taken_next += 1
      @ptr[@state + 3 * WORD, WORD] = [@taken_next].pack("Q<")
    end

    # False when a finishing worker is not to look on an overflow socket
    # (a system call): its slot is outside the dispatch width (word 5 is
    # set and not above the slot), or nothing can wait there (the kernel
    # sent no more there than were taken; word 4 read first). True when
    # something may. Under load that computes, the supervisor narrows the
    # set of workers that serve, so that each stays hot in its CPU's
    # cache; a worker outside it that took from the overflow would keep
    # serving and never leave the set, so it goes idle instead.
    def overflow_may_wait?
      bound = @ptr[BOUND, WORD]
      return false if bound != ZERO && @slot >= bound.unpack1("Q<")

      taken = @ptr[OVERFLOW_TAKEN, WORD]
      @ptr[OVERFLOW_SENT, WORD].unpack1("Q<") > taken.unpack1("Q<")
    end

    # It took a connection from an overflow socket: word 4 goes up by one,
    # atomically (the supervisor adds too). Without libatomic it is left
    # alone: a racy add could lose the supervisor's, or tear, and word 4
    # must never count more than were taken. The others then look every
    # time, as they would without the words.
    def overflow_taken!
      @fetch_add&.call(@overflow_taken_ptr, 1, SEQ_CST)
    end

    # It finished a connection (handed ones included).
    def served!
      @served += 1
      @ptr[@state + 2 * WORD, WORD] = [@served].pack("Q<")
    end

    private

    def load(offset)
      @ptr[offset, WORD].unpack1("Q<")
    end

    def check(slot)
      magic = @ptr[0, WORD]
      unless magic == MAGIC
        raise ArgumentError, "FORKPOOL_BOARD_FD is not a forkpool scoreboard (it starts with " \
                             "#{magic.inspect}, not \"fkpbrd01\"): a supervisor of another version?"
      end
      slots = load(WORD)
      return if slot < slots

      raise ArgumentError, "FORKPOOL_SLOT is #{slot}, but the scoreboard has #{slots} slot(s)"
    end
  end
end
