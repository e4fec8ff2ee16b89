# frozen_string_literal: true

require "rack"
require_relative "worker"
require_relative "http"
require_relative "rack_response"
require_relative "lazy_input"
require_relative "null_input"

module Forkpool
  # Serves one Rack app on the connections a forkpool worker gets, one
  # connection at a time: HTTP/1.1 with keep-alive (bounded, and giving
  # way to waiting clients), the request body read whole before the app is
  # called (Rack 2's input must rewind), the response streamed.
  class RackServer
    # The most of an unread body read and dropped to keep the connection.
    DRAIN_LIMIT = 65_536
    # `rack.input` of every request without a body.
    NULL_INPUT = NullInput.new
    # How many header field names' environment keys are remembered.
    ENV_KEY_CACHE_SIZE = 256

    attr_reader :app, :worker, :limits

    def initialize(app, worker, limits = HTTP::Limits.defaults, access_log: true)
      @app = app
      @worker = worker
      @limits = limits
      @access_log = access_log
      # Where clients wait for a worker: a kept-alive connection gives way
      # when one of these is readable (in kernel dispatch, the overflow).
      @listeners = worker.pool_listeners
      @recycle = -> { worker.leave }
      # Just before a connection's last response goes out (RackResponse).
      @ending = -> { worker.ending_connection }
      # [rack.input, must_close] of every request without a body (only a
      # leaving worker closes: asked when the response begins).
      @no_body = [NULL_INPUT, nil].freeze
      @env_base = environment_base.freeze
      # field name => its environment key (nil: dropped), per process.
      @env_keys = {}
      # The last Host and the [SERVER_NAME, SERVER_PORT] it gave.
      @last_host = nil
      @last_address = nil
    end

    # Serves until the supervisor says quit.
    def serve
      @worker.serve { |sock, listener| handle(sock, listener) }
    end

    # One connection: requests until a close, a limit or the idle timeout.
    def handle(sock, _listener)
      conn = HTTP::Connection.new(sock)
      peer = peer_of(sock)
      opened = nil
      @listeners_seen = nil
      @limits.max_requests.times do |number|
        return if number.positive? && !next_request?(conn, opened)

        started = HTTP.now
        request = read_request(conn, peer, started)
        return if request.nil?

        opened ||= started
        # Every 8th request of a kept-alive connection, a look at the
        # descriptor table: a leak must not fill it before the connection
        # ends (the worker then leaves, and this answer closes).
        @worker.check_headroom if (number & 7) == 7
        last = number + 1 == @limits.max_requests || (request.keepalive? && give_way?(opened, started))
        return unless serve_request(conn, request, peer, last, started)
        return if @worker.leaving?
      end
    end

    private

    def read_request(conn, peer, started)
      head = HTTP.read_head(conn, @limits, started + @limits.head_timeout)
      head && HTTP.parse_head(head, @limits)
    rescue HTTP::Error => e
      refuse(conn, e, peer, started)
      nil
    rescue HTTP::ClientGone, SystemCallError, IOError
      nil
    end

    # Between two requests on a kept-alive connection: true when the client
    # sends more within the keep-alive timeout. False when it does not, when
    # the supervisor has a message (a Quit) for this worker, or, once the
    # connection has had its turn, when another client has waited on a
    # listener this worker holds for a moment (no worker took it): the idle
    # connection then gives way.
    #
    # When its wait watched the listeners too, it leaves what it saw in
    # @listeners_seen (true: a connection waits), for give_way? to use
    # instead of asking again.
    def next_request?(conn, opened)
      @listeners_seen = nil
      return !@worker.channel_waiting? unless conn.buf.empty?

      deadline = HTTP.now + @limits.keepalive_timeout
      loop do
        left = deadline - HTTP.now
        return false if left <= 0

        turn_left = opened + @limits.keepalive_turn - HTTP.now
        turn_over = turn_left <= 0
        watched = turn_over ? [conn.sock, @worker.channel, *@listeners] : [conn.sock, @worker.channel]
        ready, = IO.select(watched, nil, nil, turn_over ? left : [left, turn_left].min)
        next if ready.nil?
        return false if ready.include?(@worker.channel)

        if ready.include?(conn.sock)
          @listeners_seen = ready.size > 1 if turn_over # the socket and a listener
          return true
        end

        # Only a listener: in handoff the supervisor may be about to take
        # it for an idle worker. Still waiting 50 ms later, it is this one's.
        ready, = IO.select([conn.sock, @worker.channel], nil, nil, 0.05)
        return ready.include?(conn.sock) && !ready.include?(@worker.channel) if ready
        return false if listener_waiting?
      end
    end

    # True when the connection has had its turn (`keepalive_turn` since its
    # first request) and a listener this worker holds has a connection
    # waiting: the response then says Connection: close.
    def give_way?(opened, now)
      return false if now - opened < @limits.keepalive_turn
      return @listeners_seen unless @listeners_seen.nil?

      listener_waiting?
    end

    def listener_waiting?
      !@listeners.empty? && !IO.select(@listeners, nil, nil, 0).nil?
    end

    # Answers `error` and ends the connection; `linger` when the client may
    # still be sending what was not read (see HTTP::Connection#linger).
    def refuse(conn, error, peer, started, request_line = "-", linger: true)
      conn.write(HTTP.error_response(error.status, error.message), @limits.io_timeout)
      conn.linger if linger
    rescue HTTP::ClientGone
      nil
    ensure
      log(peer, request_line, error.status, 0, started)
    end

    # Runs the app for one request; true when the connection stays open.
    def serve_request(conn, request, peer, last, started)
      framing, length = HTTP.body_framing(request, @limits)
      expect = request.headers["expect"]
      if expect && expect.casecmp("100-continue") != 0
        raise HTTP::Error.new(417, "cannot meet the expectation #{expect.inspect}")
      end

      has_body = framing == :chunked || length.positive?
      input, must_close = has_body ? body_input(conn, request, framing, length, expect) : @no_body
      env = environment(request, input, peer, conn.sock)
      response = RackResponse.new(conn, request, @limits.io_timeout,
                                  request.keepalive? && !last && !@worker.leaving?,
                                  @ending, env["rack.after_reply"])
      keep = run_app(env, response, request, peer, started, must_close)
      keep &&= body_consumed(input, has_body)
      input.close
      run_after_reply(env)
      keep && !@worker.leaving?
    rescue HTTP::Error => e
      refuse(conn, e, peer, started, request.request_line, linger: e.status != 500)
      false
    rescue HTTP::ClientGone, SystemCallError, IOError
      false
    end

    # A request body's input, read when the app first reads it, and what
    # says, when the head goes out, that the connection must close: the
    # worker is leaving, or the body is unread and will not be dropped
    # cheaply (the answer then says so).
    def body_input(conn, request, framing, length, expect)
      waits_for_continue = expect && request.minor >= 1
      input = LazyInput.new do
        conn.write("HTTP/1.1 100 Continue\r\n\r\n", @limits.io_timeout) if waits_for_continue
        HTTP.read_body(conn, request, framing, length, @limits, HTTP.now + @limits.body_timeout).first
      end
      must_close = lambda do
        @worker.leaving? || (!input.loaded? && (waits_for_continue || framing == :chunked || length > DRAIN_LIMIT))
      end
      [input, must_close]
    end

    # After the app, on a connection kept alive: true when the body it did
    # not read is out of the way (a small Content-Length body, read and
    # dropped now; the rest closed the connection already).
    def body_consumed(input, has_body)
      return false if input.failed?
      return true if input.loaded? || !has_body

      input.read
      true
    rescue HTTP::Error, HTTP::ClientGone, SystemCallError, IOError
      false
    end

    def run_app(env, response, request, peer, started, must_close)
      status, headers, body = @app.call(env)
      response.send(status, headers, body, must_close ? must_close.call : @worker.leaving?)
      log(peer, request, status, response.sent, started, env)
      response.keepalive?
    rescue HTTP::ClientGone
      raise
    rescue HTTP::Error => e
      # Reading the body failed: refused with its status, unless the
      # response had begun (then the connection is cut short).
      raise HTTP::ClientGone, e.message if response.started?

      raise
    rescue RackResponse::Invalid => e
      warn "forkpool-rack: #{e.message} on #{request.method} #{request.target}: answered 500"
      raise HTTP::Error.new(500, "the application gave a response that cannot be sent")
    rescue StandardError, ScriptError => e
      warn "forkpool-rack: the app failed on #{request.method} #{request.target}: " \
           "#{e.class}: #{e.message}\n\t#{(e.backtrace || []).join("\n\t")}"
      raise HTTP::ClientGone, "the response had begun" if response.started?

      raise HTTP::Error.new(500, "the application raised an exception")
    end

    def run_after_reply(env)
      callbacks = env["rack.after_reply"]
      callbacks.each(&:call) unless callbacks.empty?
    rescue StandardError => e
      warn "forkpool-rack: an after_reply callback failed: #{e.class}: #{e.message}"
    end

    # The part of every request's environment that never changes, and the
    # keys every request sets (nil here): a copy of it has room for them
    # all, and setting them grows nothing (a Hash grown past its size is
    # built again).
    def environment_base
      {
        "REQUEST_METHOD" => nil, "PATH_INFO" => nil, "QUERY_STRING" => nil, "REQUEST_URI" => nil,
        "SERVER_NAME" => nil, "SERVER_PORT" => nil, "SERVER_PROTOCOL" => nil, "REMOTE_ADDR" => nil,
        "REMOTE_PORT" => nil, "rack.input" => nil, "rack.after_reply" => nil,
        "SCRIPT_NAME" => "",
        "rack.version" => ::Rack::VERSION,
        "rack.url_scheme" => "http",
        "rack.errors" => $stderr,
        "rack.multithread" => false,
        "rack.multiprocess" => true,
        "rack.run_once" => false,
        "rack.hijack?" => false,
        "forkpool.recycle" => @recycle,
        "forkpool.slot" => @worker.slot
      }
    end

    # The Rack environment for one request: a copy of the constant part,
    # then the request's own.
    def environment(request, input, peer, sock)
      env = @env_base.dup
      env["REQUEST_METHOD"] = request.method
      env["PATH_INFO"] = request.path
      env["QUERY_STRING"] = request.query
      env["REQUEST_URI"] = request.target
      env["SERVER_NAME"], env["SERVER_PORT"] = server_address(request.host, sock)
      env["SERVER_PROTOCOL"] = request.version
      env["REMOTE_ADDR"] = peer[0]
      env["REMOTE_PORT"] = peer[1]
      env["rack.input"] = input
      env["rack.after_reply"] = []
      request.headers.each do |field, value|
        key = @env_keys[field]
        key = env_key(field) if key.nil?
        env[key] = value if key
      end
      host = request.host
      # An absolute-form target's host wins over the header's.
      env["HTTP_HOST"] = host if host && !host.equal?(request.headers["host"])
      env
    end

    # The environment key of a header field (lower-case), remembered; false
    # for a name with "_", which would be taken for the dash form (nginx
    # drops them too).
    def env_key(field)
      key = if field.include?("_")
              false
            else
              upper = field.upcase.tr("-", "_")
              %w[CONTENT_TYPE CONTENT_LENGTH].include?(upper) ? upper : "HTTP_#{upper}"
            end
      @env_keys[field.dup.freeze] = key.freeze if @env_keys.size < ENV_KEY_CACHE_SIZE
      key
    end

    # SERVER_NAME and SERVER_PORT from the Host (port 80 when it names
    # none); without one (HTTP/1.0), the address the client connected to.
    def server_address(host, sock)
      return @last_address if host && host == @last_host

      if host && !host.empty?
        match = /\A(\[[^\]]*\]|[^:]*)(?::(\d*))?\z/n.match(host)
        if match
          # Remembered (frozen: every request shares them) for the next
          # request with the same Host, most of them.
          @last_host = host
          return @last_address = [match[1].freeze, (match[2].to_s.empty? ? "80" : match[2]).freeze].freeze
        end
      end
      addr = sock.local_address
      [addr.ip_address, addr.ip_port.to_s]
    rescue SystemCallError, SocketError
      ["localhost", "0"]
    end

    # [REMOTE_ADDR, REMOTE_PORT], from one getpeername (Socket#remote_address
    # asks for the socket type too); empty on a Unix socket.
    def peer_of(sock)
      port, address = Socket.unpack_sockaddr_in(sock.getpeername)
      [address, port.to_s]
    rescue SystemCallError, SocketError, ArgumentError
      ["", ""]
    end

    # `request`: the Request, or the request line as text (what a refusal
    # has); the line is made only when there is a log to write.
    def log(peer, request, status, sent, started, env = nil)
      return unless @access_log

      request_line = request.is_a?(String) ? request : request.request_line
      stamp = Time.now.utc.strftime("%d/%b/%Y:%H:%M:%S +0000")
      referer = env&.fetch("HTTP_REFERER", nil) || "-"
      agent = env&.fetch("HTTP_USER_AGENT", nil) || "-"
      line = format(%(%s - - [%s] "%s" %s %s "%s" "%s" %.6f slot=%s\n),
                    peer[0].empty? ? "-" : peer[0], stamp, request_line.gsub('"', "%22"), status,
                    sent.positive? ? sent : "-", referer.gsub('"', "%22"), agent.gsub('"', "%22"),
                    HTTP.now - started, @worker.slot)
      $stderr.syswrite(line.b)
    rescue SystemCallError, IOError
      nil
    end
  end
end
