# frozen_string_literal: true

require "fiddle"

module Forkpool
  # The libc calls Ruby has no method for: prctl (the parent-death
  # signal), dup2 onto a descriptor no IO object owns yet, a close that
  # leaves IO objects alone, and, for the scoreboard of `kernel` dispatch,
  # mmap and a spin lock's trylock (as a fence). Looked up once, when the
  # helper loads, so a template does it before it forks and every worker
  # shares the result.
  module Libc
    PR_SET_PDEATHSIG = 1

    LIBC = Fiddle::Handle::DEFAULT
    PRCTL = Fiddle::Function.new(
      LIBC["prctl"],
      [Fiddle::TYPE_INT, Fiddle::TYPE_LONG, Fiddle::TYPE_LONG, Fiddle::TYPE_LONG, Fiddle::TYPE_LONG],
      Fiddle::TYPE_INT
    )
    DUP2 = Fiddle::Function.new(LIBC["dup2"], [Fiddle::TYPE_INT, Fiddle::TYPE_INT], Fiddle::TYPE_INT)
    CLOSE = Fiddle::Function.new(LIBC["close"], [Fiddle::TYPE_INT], Fiddle::TYPE_INT)
    MMAP = Fiddle::Function.new(
      LIBC["mmap"],
      [Fiddle::TYPE_VOIDP, Fiddle::TYPE_SIZE_T, Fiddle::TYPE_INT, Fiddle::TYPE_INT, Fiddle::TYPE_INT,
       Fiddle::TYPE_LONG],
      Fiddle::TYPE_VOIDP
    )
    MUNMAP = Fiddle::Function.new(LIBC["munmap"], [Fiddle::TYPE_VOIDP, Fiddle::TYPE_SIZE_T], Fiddle::TYPE_INT)
    PROT_READ_WRITE = 3
    MAP_SHARED = 1
    MAP_FAILED = (1 << 64) - 1
    SPIN_INIT = Fiddle::Function.new(LIBC["pthread_spin_init"], [Fiddle::TYPE_VOIDP, Fiddle::TYPE_INT],
                                     Fiddle::TYPE_INT)
    SPIN_LOCK = Fiddle::Function.new(LIBC["pthread_spin_lock"], [Fiddle::TYPE_VOIDP], Fiddle::TYPE_INT)
    SPIN_TRYLOCK = Fiddle::Function.new(LIBC["pthread_spin_trylock"], [Fiddle::TYPE_VOIDP], Fiddle::TYPE_INT)

    module_function

    # prctl(PR_SET_PDEATHSIG, signal): raises SystemCallError on failure.
    def parent_death_signal(signo)
      return if PRCTL.call(PR_SET_PDEATHSIG, signo, 0, 0, 0).zero?

      raise SystemCallError.new("prctl(PR_SET_PDEATHSIG)", Fiddle.last_error)
    end

    # dup2(from, to); the copy is without close-on-exec, as dup2 makes it.
    def dup2(from, to)
      return if DUP2.call(from, to) == to

      raise SystemCallError.new("dup2(#{from}, #{to})", Fiddle.last_error)
    end

    # close(fd), ignoring errors (the descriptor may be gone already).
    def close(fd)
      CLOSE.call(fd)
    end

    # mmap(NULL, length, PROT_READ|PROT_WRITE, MAP_SHARED, fd, 0), as a
    # Fiddle::Pointer of that size (never unmapped). Raises ArgumentError
    # saying why it failed.
    def map_shared(fd, length)
      ptr = MMAP.call(nil, length, PROT_READ_WRITE, MAP_SHARED, fd, 0)
      if (ptr.to_i & MAP_FAILED) == MAP_FAILED
        error = SystemCallError.new(nil, Fiddle.last_error)
        raise ArgumentError, "cannot map #{length} bytes of descriptor #{fd} shared: #{error.message}"
      end
      Fiddle::Pointer.new(ptr.to_i, length)
    end

    # munmap of what map_shared gave.
    def unmap(ptr)
      MUNMAP.call(ptr, ptr.size)
    end

    # A spin lock, locked, for `fence` (malloc'd, never freed: one per
    # process).
    def held_spin_lock
      lock = Fiddle::Pointer.malloc(16)
      SPIN_INIT.call(lock, 0)
      SPIN_LOCK.call(lock)
      lock
    end

    # A trylock on a held lock: it fails, and on x86-64 glibc it does so
    # with a locked cmpxchg, a full memory fence.
    def fence(lock)
      SPIN_TRYLOCK.call(lock)
    end
  end
end
