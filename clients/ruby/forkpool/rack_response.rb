# frozen_string_literal: true

module Forkpool
  # The response side of one Rack request: the status line and headers,
  # then the body as it comes, framed by the app's Content-Length, by a
  # length computed for an array body, by chunks (HTTP/1.1 kept alive), or
  # by the close.
  class RackResponse
    # Headers the server frames the response with; an app's own are dropped.
    HOP_BY_HOP = %w[connection keep-alive transfer-encoding upgrade].freeze
    # A header value may hold tabs, never another control (CR, LF, NUL).
    BAD_VALUE = /[\x00-\x08\x0a-\x1f\x7f]/n.freeze

    # The app's status or headers cannot be sent as they are (response
    # splitting, above all): nothing of them is sent, the client gets 500.
    class Invalid < StandardError; end

    attr_reader :sent

    def initialize(conn, request, timeout, keepalive:)
      @conn = conn
      @request = request
      @timeout = timeout
      @keepalive = keepalive
      @sent = 0
      @started = false
    end

    def keepalive?
      @keepalive
    end

    # True once the head has gone out: an error after that can only cut
    # the response short.
    def started?
      @started
    end

    # Sends the whole response; `must_close` says, when the head goes out,
    # whether the connection ends after it (the worker is leaving, or the
    # request's body was left unread).
    def send(status, headers, body, must_close)
      status = Integer(status, exception: false)
      raise Invalid, "the app's status #{status.inspect} is not 100-999" unless status&.between?(100, 999)

      bodyless = @request.method == "HEAD" || status < 200 || status == 204 || status == 304
      lines, length = header_lines(headers)
      if length.nil? && body.respond_to?(:to_ary)
        parts = body.to_ary
        length = parts.sum(&:bytesize)
        lines << "Content-Length: #{length}\r\n" unless bodyless
      end
      chunked = false
      if length.nil? && !bodyless
        if @keepalive && @request.minor >= 1
          chunked = true
          lines << "Transfer-Encoding: chunked\r\n"
        else
          @keepalive = false # the close ends the body
        end
      end
      @keepalive = false if must_close.call
      lines << (@keepalive ? (@request.minor.zero? ? "Connection: keep-alive\r\n" : "") : "Connection: close\r\n")
      out = +"#{@request.version} #{status} #{HTTP.reason(status)}\r\n".b
      lines.each { |line| out << line.b }
      out << "\r\n"
      @started = true
      send_body(out, body, bodyless, chunked, length)
    ensure
      body.close if body.respond_to?(:close)
    end

    private

    def header_lines(headers)
      lines = []
      length = nil
      headers.each do |name, values|
        lower = name.to_s.downcase
        raise Invalid, "the app's header name #{name.to_s.inspect} is not a token" unless name.to_s.b.match?(HTTP::TOKEN)
        if HOP_BY_HOP.include?(lower)
          @keepalive = false if lower == "connection" && values.to_s.downcase.include?("close")
          next
        end
        # Rack 2 puts several values of one header on lines of one string.
        Array(values).flat_map { |v| v.to_s.split("\n") }.each do |value|
          raise Invalid, "the app's header '#{name}' has a CR, LF or NUL" if value.b.match?(BAD_VALUE)

          length = Integer(value, 10) if lower == "content-length"
          lines << "#{name}: #{value}\r\n"
        end
      end
      [lines, length]
    end

    # The head goes out with the first piece of the body; each piece after
    # it as it comes (a streaming body is sent as it is produced).
    def send_body(out, body, bodyless, chunked, length)
      body.each do |piece|
        next if bodyless || piece.empty?

        piece = piece.byteslice(0, length - @sent) if length
        next if piece.nil? || piece.empty?

        @sent += piece.bytesize
        out << (chunked ? "#{piece.bytesize.to_s(16)}\r\n#{piece.b}\r\n" : piece.b)
        @conn.write(out, @timeout)
        out = +"".b
      end
      out << "0\r\n\r\n" if chunked
      @conn.write(out, @timeout) unless out.empty?
      @keepalive = false if length && @sent < length && !bodyless # less than it announced
    end
  end
end
