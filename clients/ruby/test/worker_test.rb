# frozen_string_literal: true

# Unit tests of two looks Forkpool::Worker takes after each connection,
# on real descriptors: whether the descriptor table has room
# (Worker#ceiling_free?) and whether a connection waits for it with no
# message first (Worker#connection_waiting?).
# Run: ruby -I clients/ruby clients/ruby/test/worker_test.rb
# (crates/forkpool-cli/tests/kernel_ruby.rs runs it).

require "minitest/autorun"
require "forkpool/worker"

class WorkerTest < Minitest::Test
  def setup
    @channel, @supervisor = UNIXSocket.pair(:SEQPACKET)
    @listener = TCPServer.new("127.0.0.1", 0)
    @worker = Forkpool::Worker.allocate
    @worker.instance_variable_set(:@channel, @channel)
    @worker.instance_variable_set(:@leaving, false)
    @clients = []
  end

  def teardown
    [@channel, @supervisor, @listener, *@clients].each(&:close)
  end

  def open_descriptors
    Dir.children("/proc/self/fd").size
  end

  def ceiling(number)
    @worker.instance_variable_set(:@fd_ceiling, number)
    @worker.instance_variable_set(:@fd_limit, Process.getrlimit(Process::RLIMIT_NOFILE).first)
  end

  # Free while nothing holds the ceiling's number, not once something
  # does (even with numbers above it free), and never a descriptor more
  # or less open after the look.
  def test_the_ceiling_is_free_until_a_descriptor_takes_it
    number = [Process.getrlimit(Process::RLIMIT_NOFILE).first - 8, 200].min
    ceiling(number)
    before = open_descriptors
    assert @worker.send(:ceiling_free?)
    assert_equal before, open_descriptors
    held = IO.for_fd(@channel.fcntl(Forkpool::F_DUPFD_CLOEXEC, number))
    assert_equal number, held.fileno
    refute @worker.send(:ceiling_free?)
    assert_equal before + 1, open_descriptors
    held.close
    assert @worker.send(:ceiling_free?)
    assert_equal before, open_descriptors
  end

  # A ceiling at or past the limit (the app lowered it) has no room.
  def test_no_room_past_the_limit
    ceiling(Process.getrlimit(Process::RLIMIT_NOFILE).first)
    refute @worker.send(:ceiling_free?)
  end

  # check_headroom makes the worker leave once the ceiling is taken.
  def test_a_taken_ceiling_makes_the_worker_leave
    number = [Process.getrlimit(Process::RLIMIT_NOFILE).first - 8, 200].min
    ceiling(number)
    @worker.check_headroom
    refute @worker.leaving?
    held = IO.for_fd(@channel.fcntl(Forkpool::F_DUPFD_CLOEXEC, number))
    _, err = capture_io { @worker.check_headroom }
    held.close
    assert @worker.leaving?
    assert_match(/descriptor #{number} is open/, err)
  end

  # Nothing, then a connection, then a message as well: the message goes
  # first, and the connection is not said to wait.
  def test_a_message_goes_before_a_connection
    refute @worker.send(:connection_waiting?, @listener)
    @clients << TCPSocket.new("127.0.0.1", @listener.addr[1])
    assert wait_for_connection
    @supervisor.send("p", 0)
    refute @worker.send(:connection_waiting?, @listener)
  end

  # The look does not wait: a connection is in the accept queue a moment
  # after connect returns, so it is asked again (at most 2 s).
  def wait_for_connection
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 2
    loop do
      return true if @worker.send(:connection_waiting?, @listener)
      return false if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      IO.select([@listener], nil, nil, 0.1)
    end
  end
end
