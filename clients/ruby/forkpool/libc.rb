# frozen_string_literal: true

require "fiddle"

module Forkpool
  # The three libc calls Ruby has no method for: prctl (the parent-death
  # signal), dup2 onto a descriptor no IO object owns yet, and a close that
  # leaves IO objects alone. Looked up once, when the helper loads, so a
  # template does it before it forks and every worker shares the result.
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
  end
end
