# frozen_string_literal: true

module Forkpool
  # The response side of one Rack request: the status line and headers,
  # then the body as it comes, framed by the app's Content-Length, by a
  # length computed for an array body, by chunks (HTTP/1.1 kept alive), or
  # by the close. A head and an array body go out in one write.
  class RackResponse
    # Headers the server frames the response with; an app's own are dropped.
    HOP_BY_HOP = %w[connection keep-alive transfer-encoding upgrade].freeze
    # A header value may hold tabs, never another control (CR, LF, NUL).
    BAD_VALUE = /[\x00-\x08\x0a-\x1f\x7f]/n.freeze
    # How many header names an app may have checked once and remembered.
    NAME_CACHE_SIZE = 256
    # name => its HeaderName: the names an app sends, each checked once
    # per process, with the last value each was sent with.
    NAMES = {} # rubocop:disable Style/MutableConstant (filled as names come)
    # "HTTP/1.x STATUS REASON\r\n" for the statuses sent so far, by
    # x * 1000 + STATUS (an Integer key: no array made per response).
    STATUS_LINES = {} # rubocop:disable Style/MutableConstant (filled as statuses come)

    # No rack.after_reply callbacks.
    NO_CALLBACKS = [].freeze
    # The largest last write a worker goes idle before (#ending): the
    # first of its response, it fits the socket's send buffer and does not
    # wait for the client to read.
    ENDING_WRITE_MAX = 16_384

    # The app's status or headers cannot be sent as they are (response
    # splitting, above all): nothing of them is sent, the client gets 500.
    class Invalid < StandardError; end

    attr_reader :sent

    # `keepalive`: whether the connection may stay open after it. `ending`
    # is called just before the write that completes a response ending
    # the connection, when `after_reply` (the request's `rack.after_reply`)
    # is empty by then: nothing is left to do for the connection once it
    # is out (Worker#ending_connection). Positional: keywords would cost a
    # Hash a request.
    def initialize(conn, request, timeout, keepalive, ending = nil, after_reply = NO_CALLBACKS)
      @conn = conn
      @request = request
      @timeout = timeout
      @keepalive = keepalive
      @ending = ending
      @after_reply = after_reply
      @sent = 0
      @started = false
      @written = false
    end

    def keepalive?
      @keepalive
    end

    # True once the head has gone out: an error after that can only cut
    # the response short.
    def started?
      @started
    end

    # Sends the whole response; `must_close` says whether the connection
    # ends after it (the worker is leaving, or the request's body was left
    # unread).
    def send(status, headers, body, must_close)
      status = Integer(status, exception: false) unless status.is_a?(Integer)
      raise Invalid, "the app's status #{status.inspect} is not 100-999" unless status&.between?(100, 999)

      bodyless = status < 200 || status == 204 || status == 304 || @request.method == "HEAD"
      out = (STATUS_LINES[@request.minor * 1000 + status] ||= status_line(status)).dup
      length = add_headers(out, headers)
      @keepalive = false if must_close
      # An Array (most bodies) goes out with the head in one write, without
      # a block a part.
      return send_parts(out, body, bodyless, length) if body.instance_of?(Array)

      if length.nil? && body.respond_to?(:to_ary)
        parts = body.to_ary
        length = parts.size == 1 ? parts[0].bytesize : parts.sum(&:bytesize)
        out << "Content-Length: " << length.to_s << "\r\n" unless bodyless
      end
      chunked = false
      if length.nil? && !bodyless
        if @keepalive && @request.minor >= 1
          chunked = true
          out << "Transfer-Encoding: chunked\r\n"
        else
          @keepalive = false # the close ends the body
        end
      end
      end_head(out)
      send_body(out, body, bodyless, chunked, length)
    ensure
      body.close if !body.instance_of?(Array) && body.respond_to?(:close)
    end

    private

    def status_line(status)
      "#{@request.version} #{status} #{HTTP.reason(status)}\r\n".b.freeze
    end

    # A header name an app sends, checked: its text and lower-case form,
    # and the last value it went out with (most repeat from response to
    # response) with the line that value made, so that a repeated value
    # is neither checked nor put together again.
    class HeaderName
      # The value of a name not sent yet: equal to no value an app gives.
      NOT_SENT = Object.new.freeze

      attr_reader :text, :lower, :value, :line, :number

      def initialize(text, lower)
        @text = text
        @lower = lower
        @hop = HOP_BY_HOP.include?(lower)
        @length = lower == "content-length"
        @value = NOT_SENT
        @line = @number = nil
      end

      # A hop-by-hop header: the server frames the response with its own.
      def hop?
        @hop
      end

      # The line of a value that passed the checks; a Content-Length value
      # is also read as a number (ArgumentError when it is not one).
      def line_of(value)
        line = "#{@text}: #{value}\r\n"
        number = @length ? Integer(value, 10) : nil
        @value = value.frozen? ? value : value.dup.freeze
        @line = line.freeze
        @number = number
        line
      end
    end

    # Appends the app's header lines to `out`; returns its Content-Length
    # (nil without one).
    def add_headers(out, headers)
      length = nil
      headers.each do |name, values|
        known = NAMES[name] || check_name(name)
        if known.value == values # the line it made last time, checked then
          out << known.line
          length = known.number || length
        elsif known.hop?
          @keepalive = false if known.lower == "connection" && values.to_s.downcase.include?("close")
        elsif values.is_a?(String) && values.ascii_only? && !values.match?(BAD_VALUE)
          # One line with nothing to check further, as most are.
          out << known.line_of(values)
          length = known.number || length
        else
          # Checked value by value (8-bit text, a value to refuse), and
          # Rack 2's several values of one header on lines of one string.
          Array(values).each { |v| v.to_s.split("\n").each { |value| length = add_header(out, known, value, length) } }
        end
      end
      length
    end

    def add_header(out, known, value, length)
      value = value.b unless value.ascii_only?
      raise Invalid, "the app's header '#{known.text}' has a CR, LF or NUL" if value.match?(BAD_VALUE)

      length = Integer(value, 10) if known.lower == "content-length"
      out << known.text << ": " << value << "\r\n"
      length
    end

    # The HeaderName of a name the app gives, remembered for the next
    # response; Invalid when it is not a token.
    def check_name(name)
      text = name.to_s
      raise Invalid, "the app's header name #{text.inspect} is not a token" unless text.b.match?(HTTP::TOKEN)

      text = text.dup.freeze unless text.frozen?
      known = HeaderName.new(text, text.downcase.freeze)
      NAMES[text] = known if name.is_a?(String) && NAMES.size < NAME_CACHE_SIZE
      known
    end

    # Once, just before `out`, the last write of a response that ends the
    # connection, goes out (see #initialize), or after the last write when
    # `out` is empty. Not before a write that could wait for the client:
    # one after others, or a large one.
    def ending(out)
      return if @keepalive || @ending.nil? || !@after_reply.empty?
      return if !out.empty? && (@written || out.bytesize > ENDING_WRITE_MAX)

      @ending.call
      @ending = nil
    end

    # The blank line that ends the head, after the Connection header when
    # there is one to say.
    def end_head(out)
      out << (@keepalive ? (@request.minor.zero? ? "Connection: keep-alive\r\n\r\n" : "\r\n") : "Connection: close\r\n\r\n")
      @started = true
    end

    # An Array body: its length (when the app gave none), the head, the
    # parts up to the length, in one write.
    def send_parts(out, parts, bodyless, length)
      if length.nil?
        length = parts.size == 1 ? parts[0].bytesize : parts.sum(&:bytesize)
        out << "Content-Length: " << length.to_s << "\r\n" unless bodyless
      end
      end_head(out)
      unless bodyless
        parts.each do |piece|
          piece = piece.byteslice(0, length - @sent) if piece.bytesize > length - @sent
          piece = piece.b unless piece.ascii_only?
          @sent += piece.bytesize
          out << piece
          break if @sent == length
        end
        @keepalive = false if @sent < length # less than it announced
      end
      ending(out)
      @conn.write(out, @timeout)
      @written = true
      ending(out.clear) if @ending # written whole: too large to go idle before
    end

    # The head goes out with the first piece of the body; each piece after
    # it as it comes (a streaming body is sent as it is produced).
    def send_body(out, body, bodyless, chunked, length)
      body.each do |piece|
        next if bodyless || piece.empty?

        piece = piece.byteslice(0, length - @sent) if length && piece.bytesize > length - @sent
        next if piece.empty?

        piece = piece.b unless piece.ascii_only?
        @sent += piece.bytesize
        if chunked
          out << piece.bytesize.to_s(16) << "\r\n" << piece << "\r\n"
        else
          out << piece
        end
        ending(out) if length && @sent == length # the piece completes the body
        @conn.write(out, @timeout)
        @written = true
        out.clear # written: the string is reused for the next piece
      end
      out << "0\r\n\r\n" if chunked
      ending(out)
      @conn.write(out, @timeout) unless out.empty?
      @keepalive = false if length && @sent < length && !bodyless # less than it announced
    end
  end
end
