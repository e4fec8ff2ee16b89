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
