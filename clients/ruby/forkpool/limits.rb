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
  # size), and /proc/self/smaps_rollup (about 16 us per resident MiB) only
  # when that is above the limit (USS is never above it), and then only
  # when .rollup_due? says so: a --preload worker's resident size counts
  # what it shares with its template.
  class WorkerLimits
    # The longest, in seconds, a worker whose resident size is above its
    # memory limit goes between two reads of smaps_rollup while that size
    # does not grow enough to matter: memory that becomes its own without
    # the resident size growing (a copy-on-write break) is seen within this.
    SMAPS_REREAD = 0.1

    attr_reader :max_memory, :lifetime_ms
    # What the last read of smaps_rollup found: [uss, rss, when], or nil.
    attr_reader :last_rollup

    # Whether a worker whose resident size `rss` is above its memory
    # `limit` reads smaps_rollup now, given its `last` read ([uss, rss,
    # when] or nil): when there was none; when RSS grew since then by at
    # least what USS had left below the limit (USS grows by at most what
    # RSS grows, plus copy-on-write breaks, so a smaller growth cannot by
    # itself have taken it past); or when SMAPS_REREAD has passed
    # (copy-on-write breaks raise USS without RSS: they are seen within
    # that). Otherwise it counts as under the limit: a worker sitting above
    # the limit on what it shares with its template reads it every 100 ms
    # at most, not after every connection.
    def self.rollup_due?(limit, rss, last, now)
      return true if last.nil?

      uss_then, rss_then, at = last
      [rss - rss_then, 0].max >= limit - uss_then || now - at >= SMAPS_REREAD
    end

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
      @last_rollup = nil
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
        # Under the limit (the usual case): no clock read either.
        if resident > @max_memory && memory_past(resident, now) { WorkerLimits.unshared_memory }
          return :memory
        end
      end
      return :lifetime if @leave_at && now >= @leave_at

      nil
    end

    # The memory look given the resident size `rss` at `now` (monotonic
    # seconds): the USS when it is above the limit, read by the block (and
    # kept in #last_rollup) only when `rss` is above the limit and
    # .rollup_due? says so; else nil.
    def memory_past(rss, now)
      return nil if rss <= @max_memory || !WorkerLimits.rollup_due?(@max_memory, rss, @last_rollup, now)

      uss = yield
      @last_rollup = [uss, rss, now]
      uss if uss > @max_memory
    end

    private

    def now
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
