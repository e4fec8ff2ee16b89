# frozen_string_literal: true

require "fiddle"
require_relative "libc"

module Forkpool
  # One worker's record on the scoreboard of `kernel` dispatch
  # (docs/protocol.md, "`kernel` dispatch"): the board mapped with libc's
  # mmap through Fiddle, the slot's state and its three counts. Of the
  # header it reads words 0 and 1 (the magic, the slot count) once, and,
  # as it goes, word 2 (the supervisor waits for an `I`) and word 5 (the
  # dispatch bound). Words 3 and 4, the overflow's counts, it leaves
  # alone (Worker#take_overflow says why).
  #
  # Plain loads and stores go through an IO::Buffer mapping of the same
  # pages (Ruby 3.1 on), which reads and writes an Integer in place: a
  # quarter of what a Fiddle::Pointer's string copy and its pack cost,
  # and a worker makes several of them a connection. Without IO::Buffer
  # (Ruby 3.0) they go through the Fiddle::Pointer. The counts have one
  # writer (this worker), so they are kept in Ruby and stored whole.
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
    # Word 5, the supervisor's: the dispatch bound. 0, or the first slot
    # outside the pool's dispatch width: the kernel gives the slots from
    # it on no new connection, and their workers take none from the
    # overflow as they finish one.
    BOUND = 5 * WORD
    SEQ_CST = 5 # __ATOMIC_SEQ_CST

    # libatomic's exchange, or nil where the library is not installed.
    EXCHANGE = begin
      Fiddle::Function.new(Fiddle::Handle.new("libatomic.so.1")["__atomic_exchange_8"],
                           [Fiddle::TYPE_VOIDP, Fiddle::TYPE_LONG_LONG, Fiddle::TYPE_INT],
                           Fiddle::TYPE_LONG_LONG)
    rescue Fiddle::DLError
      nil
    end

    attr_reader :taken, :served, :taken_next

    # Maps the board of descriptor `fd` for `slot`. Raises ArgumentError,
    # saying why, when it is not the board or `slot` is not on it.
    # `atomics: false` uses the fallback even where libatomic loads;
    # `buffer: false` the Fiddle::Pointer's loads and stores even where
    # Ruby has IO::Buffer.
    def initialize(fd, slot, atomics: true, buffer: true)
      length = (WORD * (8 + 4 * (slot + 1)) + PAGE - 1) / PAGE * PAGE
      @ptr = Libc.map_shared(fd, length)
      @buffer = map_buffer(fd, length) if buffer && defined?(IO::Buffer)
      check(slot)
      @slot = slot
      @state = (8 + 4 * slot) * WORD
      # A pointer, not an address: Fiddle turns an Integer argument into
      # a new pointer object on every call.
      @state_ptr = @ptr + @state
      @exchange = atomics ? EXCHANGE : nil
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
      @buffer&.free
      Libc.unmap(@ptr)
      @ptr = @state_ptr = @buffer = nil
    end

    # state := busy (nothing else ever moves a busy state: a plain store).
    def busy!
      store(@state, 0)
    end

    # state := idle, a full fence, then true when the supervisor waits to
    # hear of an idle worker (word 2 is set: send `I`).
    def idle!
      if @exchange
        @exchange.call(@state_ptr, 1, SEQ_CST)
      else
        store(@state, 1)
        Libc.fence(@fence_lock)
      end
      load(WAITING) != 0
    end

    # The state word as stored: 0 busy, 1 idle, else a reservation.
    def state
      load(@state)
    end

    # This worker accepted a connection itself (its socket or the overflow).
    def took!
      @taken += 1
      store(@state + WORD, @taken)
    end

    # It took one from the overflow as it finished another.
    def took_next!
      took!
      @taken_next += 1
      store(@state + 3 * WORD, @taken_next)
    end

    # False when the slot is outside the dispatch width (word 5 is set and
    # not above the slot): a finishing worker then takes nothing from the
    # overflow. Under load that computes, the supervisor narrows the set
    # of workers that serve, so that each stays hot in its CPU's cache; a
    # worker outside it that took from the overflow would keep serving
    # and never leave the set, so it goes idle instead.
    def within_width?
      bound = load(BOUND)
      bound.zero? || @slot < bound
    end

    # It finished a connection (handed ones included).
    def served!
      @served += 1
      store(@state + 2 * WORD, @served)
    end

    private

    def load(offset)
      @buffer ? @buffer.get_value(:u64, offset) : @ptr[offset, WORD].unpack1("Q<")
    end

    def store(offset, value)
      if @buffer
        @buffer.set_value(:u64, offset, value)
      else
        @ptr[offset, WORD] = [value].pack("Q<")
      end
    end

    # A second mapping of the board's pages, as an IO::Buffer (its
    # experimental warning, once a process, kept off stderr).
    def map_buffer(fd, length)
      experimental = Warning[:experimental]
      Warning[:experimental] = false
      IO::Buffer.map(IO.for_fd(fd, autoclose: false), length, 0, 0)
    ensure
      Warning[:experimental] = experimental
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
