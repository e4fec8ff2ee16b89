# frozen_string_literal: true

# forkpool-rack's own Ruby cost per request, without the kernel: one
# RackServer serves N kept-alive requests (wrk's request head) on a fake
# socket that always has the next request and takes every write, with a
# worker stub that is never told anything. Prints CPU microseconds and
# objects allocated per request.
#
#   ruby bench/lib/rack_hot_loop.rb [N]            (default 200000)
#   PROFILE=1 ruby bench/lib/rack_hot_loop.rb      (stackprof, if installed:
#                                                   Debian's ruby-stackprof)
#
# On a 2-core VM this read 19-27 µs and 30 objects a request on the
# morning of 2026-11-27, 14-17 µs and 18 objects that afternoon; under
# load the same work costs two to three times that, the workers taking
# turns on the CPUs' caches. Its instructions (`valgrind --tool=callgrind`,
# the difference between two counts) do not move with the machine: 127.5k
# a request that morning, 99.0k that afternoon.

$LOAD_PATH.unshift(File.expand_path("../../clients/ruby", __dir__))
require "socket"
require "forkpool/rack_server"

# The worker side RackServer uses: a slot, never leaving, no channel news.
class HotLoopWorker
  attr_reader :channel, :slot

  def initialize
    @channel, @peer = UNIXSocket.pair
    @slot = 0
  end

  def pool_listeners = []
  def leave = nil
  def leaving? = false
  def channel_waiting?(_timeout = 0) = false
  def ending_connection = nil
  def check_headroom = nil
end

# A socket with the next request always there.
class HotLoopSocket
  REQUEST = "GET / HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n".b

  def read_nonblock(_size, buffer, exception: true) = buffer.replace(REQUEST)
  def write_nonblock(data, exception: true) = data.bytesize
  def getpeername = Socket.sockaddr_in(40_000, "127.0.0.1")
  def closed? = false
end

# Between two requests the server does not wait: the next is there.
module HotLoopNoWait
  def next_request?(_conn, _opened) = true
end
Forkpool::RackServer.prepend(HotLoopNoWait)

app = ->(_env) { [200, { "Content-Type" => "text/plain", "Content-Length" => "6" }, ["hello\n"]] }
server = Forkpool::RackServer.new(app, HotLoopWorker.new, access_log: false)
count = Integer(ARGV[0] || 200_000)
limits = server.limits.dup
limits.keepalive_turn = Float::INFINITY
server.instance_variable_set(:@limits, limits)
limits.max_requests = 5_000
server.handle(HotLoopSocket.new, nil) # warm
limits.max_requests = count
GC.start
objects = GC.stat(:total_allocated_objects)
started = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
if ENV["PROFILE"]
  require "stackprof"
  require "tmpdir"
  # Written outside the work tree, so that it never lands in a commit.
  out = File.join(Dir.tmpdir, "rack_hot_loop.dump")
  StackProf.run(mode: :cpu, interval: 50, out: out) { server.handle(HotLoopSocket.new, nil) }
  warn "profile in #{out}: stackprof #{out} --text"
else
  server.handle(HotLoopSocket.new, nil)
end
spent = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - started
printf("%.2f µs of CPU and %.1f objects a request (%d requests)\n",
       spent * 1e6 / count, (GC.stat(:total_allocated_objects) - objects).to_f / count, count)
