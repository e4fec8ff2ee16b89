# frozen_string_literal: true

# An HTTP worker for `forkpool run`, answering like `forkpool demo`, on the
# Ruby helper alone (no Rack):
#
#   forkpool run --listen 127.0.0.1:8080 -- ruby -Iclients/ruby clients/ruby/example_http_worker.rb
#   curl -i 'http://127.0.0.1:8080/?work_ms=100'
#
# Any request answers `hello`; `?work_ms=N` sleeps N ms first (a slow
# handler). Every response names the worker in `X-Forkpool-Slot` and
# `X-Forkpool-Pid` and closes the connection. The head must arrive whole
# within 5 s (else 408); a body is not read.
#
# With --chaos (fault-injection tests only), `?leak_fds=N` (at most 1000)
# makes it open N descriptors of /dev/null and keep them for the life of
# the process, as a leaking app does (500 if one cannot be opened), and
# `?grow_mib=N` (at most 1024) makes it keep N MiB more of memory it has
# written to (its own, unshared) for the life of the process, as an app
# that leaks memory does.

require "forkpool/worker"
require "forkpool/http"

MAX_WORK_MS = 60_000
MAX_LEAK = 1000
MAX_GROW_MIB = 1024
CHAOS = ARGV.include?("--chaos")
# What `?leak_fds=N` opened (with --chaos), never closed.
LEAKED = []
# What `?grow_mib=N` kept (with --chaos), never freed.
GROWN = []
LIMITS = Forkpool::HTTP::Limits.defaults.tap do |limits|
  limits.head_timeout = 5.0
  limits.io_timeout = 5.0
end

worker = Forkpool::Worker.from_env

worker.serve do |sock, _listener|
  conn = Forkpool::HTTP::Connection.new(sock)
  begin
    head = Forkpool::HTTP.read_head(conn, LIMITS, Forkpool::HTTP.now + LIMITS.head_timeout)
    next if head.nil?

    request = Forkpool::HTTP.parse_head(head, LIMITS)
    work_ms = request.query[/(?:\A|&)work_ms=(\d+)/, 1].to_i
    sleep([work_ms, MAX_WORK_MS].min / 1000.0) if work_ms.positive?
    status = "200 OK"
    body = "hello\n"
    begin
      leak = CHAOS ? [request.query[/(?:\A|&)leak_fds=(\d+)/, 1].to_i, MAX_LEAK].min : 0
      leak.times { LEAKED << IO.sysopen("/dev/null") }
      grow = CHAOS ? [request.query[/(?:\A|&)grow_mib=(\d+)/, 1].to_i, MAX_GROW_MIB].min : 0
      # Written to, so the pages are resident and this process's own.
      GROWN << ("\x01" * (grow << 20)) if grow.positive?
    rescue SystemCallError => e
      status = "500 Internal Server Error"
      body = "#{e.message}\n"
    end
    conn.write("HTTP/1.1 #{status}\r\nContent-Type: text/plain\r\nContent-Length: #{body.bytesize}\r\n" \
               "X-Forkpool-Slot: #{worker.slot}\r\nX-Forkpool-Pid: #{worker.pid}\r\n" \
               "Connection: close\r\n\r\n#{body}", LIMITS.io_timeout)
  rescue Forkpool::HTTP::Error => e
    conn.write(Forkpool::HTTP.error_response(e.status, e.message), LIMITS.io_timeout)
  end
rescue Forkpool::HTTP::ClientGone, SystemCallError, IOError
  nil
end
