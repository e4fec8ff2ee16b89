# frozen_string_literal: true

require "etc"

module Forkpool
  # `kernel` dispatch: the memory and lifetime limits a worker checks itself
  # after each connection, before it goes idle on the scoreboard
  # (docs/protocol.md, "Recycling: the parent counts"). There the kernel
  # gives the worker its next connection without the supervisor, which
  # would learn of a limit passed only some connections later.
  #
  # `max_memory` is FORKPOOL_MAX_CHILD_MEMORY, bytes of unshared memory
  # (USS); `lifetime_ms` is FORKPOOL_MAX_CHILD_LIFETIME_MS, counted from
  # #start; 0: no limit. Without limits a worker never starts a check and
  # a connection costs nothing more; a lifetime costs a clock read (no
  # system call); memory one pread(2) of /proc/self/statm (the resident
  # size), and /proc/self/smaps_rollup only when that is above the limit
  # (USS is never above it).
  class WorkerLimits
    attr_reader :max_memory, :lifetime_ms

    # The limits the supervisor set in `env` (none when it set none).
    def self.from_env(env)
      new(Integer(env.fetch("FORKPOOL_MAX_CHILD_MEMORY", "0")),
          Integer(env.fetch("FORKPOOL_MAX_CHILD_LIFETIME_MS", "0")))
    end

    # This process's USS in bytes, as the supervisor counts it:
    # Private_Clean plus Private_Dirty in /proc/self/smaps_rollup.
    def self.unshared_memory
      File.foreach("/proc/self/smaps_rollup").sum do |line|
        line.start_with?("Private_Clean:", "Private_Dirty:") ? line.split[1].to_i * 1024 : 0
      end
    end

    def initialize(max_memory, lifetime_ms)
      @max_memory = max_memory
      @lifetime_ms = lifetime_ms
    end

    # Starts the checks in this process (a worker forked by a template
    # starts them after its fork: /proc/self is then its own, and its
    # lifetime counts from here); self, or nil when there is no limit.
    # A statm a template opened is left alone: the fork closed its number.
    def start
      @statm = nil
      return nil if @max_memory.zero? && @lifetime_ms.zero?

      if @max_memory.positive?
        begin
          @statm = File.open("/proc/self/statm")
          @page = Etc.sysconf(Etc::SC_PAGESIZE)
        rescue SystemCallError => e
          # The supervisor's own look (every second) still holds.
          warn "forkpool worker: cannot read /proc/self/statm (#{e.message}): " \
               "the worker does not check its memory"
          @statm = nil
        end
      end
      @leave_at = (now + (@lifetime_ms / 1000.0) if @lifetime_ms.positive?)
      self
    end

    # :memory or :lifetime when the worker is past that limit now, else nil.
    def past
      if @statm
        resident = @statm.pread(128, 0).split[1].to_i * @page
        return :memory if resident > @max_memory && WorkerLimits.unshared_memory > @max_memory
      end
      return :lifetime if @leave_at && now >= @leave_at

      nil
    end

    private

    def now
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
