# frozen_string_literal: true

# Unit tests of the memory and lifetime limits a kernel dispatch worker
# checks itself after each connection (Forkpool::WorkerLimits, and the
# finish in forkpool/kernel_dispatch.rb), on real memory and a file mapped
# like the board.
# Run: ruby -I clients/ruby clients/ruby/test/limits_test.rb
# (crates/forkpool-cli/tests/kernel_ruby.rs runs it).

require "minitest/autorun"
require "tempfile"
require "forkpool/worker"

class LimitsTest < Minitest::Test
  MIB = 1 << 20

  def test_without_limits_nothing_starts
    assert_nil Forkpool::WorkerLimits.new(0, 0).start
  end

  def test_own_memory_past_the_limit_is_seen
    # Garbage from the tests before (100 MiB from the fork test) collected
    # first: freed during the growth below, it would take as much memory
    # away as the growth adds.
    GC.start
    limits = Forkpool::WorkerLimits.new(Forkpool::WorkerLimits.unshared_memory + (32 * MIB), 0).start
    assert_nil limits.past
    grown = "\x01" * (64 * MIB)
    assert_equal :memory, limits.past
    assert_equal 64 * MIB, grown.bytesize
  end

  # 100 MiB written, then a fork: the child's resident size is above the
  # 64 MiB limit, its own memory far below: not past it.
  def test_memory_shared_with_a_parent_does_not_count
    shared = "\x01" * (100 * MIB)
    reader, writer = IO.pipe
    child = fork do
      reader.close
      limits = Forkpool::WorkerLimits.new(64 * MIB, 0).start
      resident = File.read("/proc/self/statm").split[1].to_i * 4096
      writer.write("#{resident > 64 * MIB} #{limits.past.inspect}")
      exit!(0)
    end
    writer.close
    assert_equal "true nil", reader.read
    Process.wait(child)
    assert_equal 100 * MIB, shared.bytesize
  end

  # When smaps_rollup is read (WorkerLimits.rollup_due?, #memory_past),
  # in small units, to go through every case.
  LIMIT = 8
  REREAD = Forkpool::WorkerLimits::SMAPS_REREAD

  def due?(*args)
    Forkpool::WorkerLimits.rollup_due?(*args)
  end

  # The rule in other words: a read is due unless there was one, less than
  # SMAPS_REREAD ago, and what USS was then plus what RSS has grown since
  # stays below the limit.
  def could_pass?(limit, rss, last, now)
    return true if last.nil?

    uss_then, rss_then, at = last
    grown = rss > rss_then ? rss - rss_then : 0
    uss_then + grown >= limit || !(now - at < REREAD)
  end

  def test_the_rule_over_every_small_case
    wrong = []
    (0..(LIMIT + 2)).each do |uss_then|
      (LIMIT..((2 * LIMIT) + 1)).each do |rss_then|
        ((LIMIT + 1)..((3 * LIMIT) - 1)).each do |rss|
          [0, 0.05, REREAD - 1e-6, REREAD, 0.3].each do |at|
            last = [uss_then, rss_then, 0]
            wrong << [uss_then, rss_then, rss, at] if due?(LIMIT, rss, last, at) != could_pass?(LIMIT, rss, last, at)
          end
        end
      end
    end
    assert_empty wrong.first(5)
    assert(((LIMIT + 1)..(3 * LIMIT)).all? { |rss| due?(LIMIT, rss, nil, 0) }, "no read yet")
  end

  def test_the_rule_at_its_edges
    last = [40 * MIB, 100 * MIB, 0]
    assert_equal [false, true, false, true, true],
                 [due?(64 * MIB, 123 * MIB, last, 0.099), # 23 MiB more cannot pass 24
                  due?(64 * MIB, 124 * MIB, last, 0),     # 24 MiB more could
                  due?(64 * MIB, 90 * MIB, last, 0.05),   # RSS fell
                  due?(64 * MIB, 100 * MIB, last, REREAD), # 100 ms on
                  due?(64 * MIB, 90 * MIB, [64 * MIB, 100 * MIB, 0], 0)] # no room left
  end

  # A worker's memory, private pages (USS) and shared ones (RSS is both),
  # its look after each [alloc, free, cow, took] connection checked: never
  # past while USS is not; once USS is past, found at the first look with
  # no copy-on-write break since the last read, or SMAPS_REREAD after it;
  # no read with RSS at or under the limit. The steps that went wrong.
  def run_connections(private, shared, steps)
    limits = Forkpool::WorkerLimits.new(LIMIT, 0)
    reads = 0
    now = 100.0
    cow_since_read = false
    steps.each do |alloc, free, cow, took|
      before = limits.last_rollup
      reads_before = reads
      private += alloc - [free, private].min
      cow = [cow, shared].min
      shared -= cow
      private += cow
      cow_since_read ||= cow.positive?
      now += took
      rss = private + shared
      found = limits.memory_past(rss, now) do
        reads += 1
        private
      end
      read = reads > reads_before
      return [:read_under, steps] if read && rss <= LIMIT

      cow_since_read = false if read
      stale = before.nil? || now - before[2] >= REREAD
      if private > LIMIT
        return [:unseen, steps] if (!cow_since_read || stale) && found != private
      elsif found
        return [:false_past, steps]
      end
      break if found
    end
    nil
  end

  def test_every_short_run_of_connections
    kinds = [0, 1, 4].product([0, 2], [0, 3], [0, 0.04, 0.1])
    wrong = [[0, 0], [2, 10], [7, 4], [5, 20]].flat_map do |private, shared|
      kinds.product(kinds, kinds).filter_map { |run| run_connections(private, shared, run) }
    end
    assert_empty wrong.first(3)
  end

  def test_long_runs
    rng = Random.new(44)
    wrong = Array.new(1000) do
      steps = Array.new(1 + rng.rand(60)) do
        [[0, 0, 1, 3].sample(random: rng), [0, 0, 2].sample(random: rng),
         [0, 0, 0, 0, 2].sample(random: rng), [0.001, 0.01, 0.03].sample(random: rng)]
      end
      run_connections(rng.rand(8), rng.rand(30), steps)
    end
    assert_empty wrong.compact.first(3)
  end

  # RSS 30 over a limit of 8, USS 2: a connection every millisecond for a
  # second.
  def test_a_preloaded_worker_reads_every_100_ms_at_most
    limits = Forkpool::WorkerLimits.new(LIMIT, 0)
    reads = 0
    found = (1..1000).filter_map do |ms|
      limits.memory_past(30, ms / 1000.0) do
        reads += 1
        2
      end
    end
    assert_equal [[], true], [found, (1..10).cover?(reads)], "#{reads} reads"
  end

  def test_a_worker_growing_fast_is_read_after_each_connection_that_could_pass
    limits = Forkpool::WorkerLimits.new(LIMIT, 0)
    looks = [[8, 2], [9, 3], [15, 9]].each_with_index.map do |(rss, uss), i|
      [limits.memory_past(rss, 0.001 * i) { uss }, limits.last_rollup&.first]
    end
    # At the limit: nothing read; above it: USS 3; 6 more could pass the 5
    # left, and do.
    assert_equal [[nil, nil], [nil, 3], [9, 9]], looks
  end

  def test_the_real_look_keeps_its_read
    limits = Forkpool::WorkerLimits.new(1024, 0).start
    assert_equal :memory, limits.past
    assert_operator limits.last_rollup.first, :>, 1024
    limits = Forkpool::WorkerLimits.new(1 << 50, 0).start
    assert_equal [nil, nil], [limits.past, limits.last_rollup]
  end

  def test_a_lifetime_ends
    limits = Forkpool::WorkerLimits.new(0, 20).start
    assert_nil limits.past
    sleep 0.03
    assert_equal :lifetime, limits.past
  end

  def test_from_env
    limits = Forkpool::WorkerLimits.from_env("FORKPOOL_MAX_CHILD_MEMORY" => "1024",
                                             "FORKPOOL_MAX_CHILD_LIFETIME_MS" => "60000")
    assert_equal [1024, 60_000], [limits.max_memory, limits.lifetime_ms]
    limits = Forkpool::WorkerLimits.from_env({})
    assert_equal [0, 0], [limits.max_memory, limits.lifetime_ms]
  end

  # A worker past its lifetime as its connection ends: no early idle, busy
  # at the finish, `X`; then it waits for the supervisor to let it go, and
  # goes at end of file (what it was sent before is ignored).
  def test_a_worker_past_a_limit_leaves_busy_and_waits_to_be_let_go
    board_file = Tempfile.new("board")
    board_file.write("fkpbrd01".b + [2].pack("Q<") + ("\0" * (4096 - 16)))
    board_file.flush
    board = Forkpool::Board.new(board_file.fileno, 1)
    ours, theirs = UNIXSocket.pair(:SEQPACKET)
    overflow = TCPServer.new("127.0.0.1", 0)
    worker = Forkpool::Worker.allocate
    { board: board, channel: ours, version: 1, max_requests: 0, served_here: 0, leaving: false,
      overflow: [overflow], serving: 0, listeners: [],
      limit_check: Forkpool::WorkerLimits.new(0, 1).start }.each do |name, value|
      worker.instance_variable_set("@#{name}", value)
    end
    sleep 0.01
    board.busy!
    worker.ending_connection
    assert_equal 0, board.state, "no early idle"
    assert_nil worker.send(:finish_on_board, 0)
    assert_equal 0, board.state, "busy at the finish"
    assert_equal "\x01X".b, theirs.recv(16)
    assert worker.leaving?
    theirs.sendmsg("\x01p\x00\x00\x00\x01".b)
    waiting = Thread.new { worker.send(:await_release) }
    sleep 0.1
    assert waiting.alive?, "it waits for the supervisor"
    theirs.shutdown(Socket::SHUT_WR)
    assert waiting.join(10), "let go at end of file"
  ensure
    [ours, theirs, overflow].each { |io| io&.close }
    board_file&.close!
  end
end
