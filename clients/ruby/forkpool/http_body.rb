# frozen_string_literal: true

require "stringio"
require "tempfile"

module Forkpool
  module HTTP
    # chunk-size [ chunk-ext ]: hex digits only; extensions per RFC 9112
    # 7.1.1 (BWS ";" BWS name [BWS "=" BWS (token / quoted-string)]).
    CHUNK_TOKEN = TOKEN_PATTERN
    CHUNK_QUOTED = '"(?:[\t \x21\x23-\x5b\x5d-\x7e\x80-\xff]|\\\\[\t \x21-\x7e\x80-\xff])*"'
    CHUNK_LINE = Regexp.new(
      "\\A([0-9A-Fa-f]+)((?:[ \\t]*;[ \\t]*#{CHUNK_TOKEN}(?:[ \\t]*=[ \\t]*(?:#{CHUNK_TOKEN}|#{CHUNK_QUOTED}))?)*)\\z",
      Regexp::NOENCODING
    )
    # Bodies up to this size are kept in memory, larger ones in a file.
    MEMORY_BODY = 1 << 20

    # The framing of a request without a body (shared, frozen).
    NO_LENGTH = [:length, 0].freeze

    module_function

    # How the body is framed: [:chunked, nil] or [:length, N] (0: none).
    # Refuses what the rules refuse: both framings, a Transfer-Encoding on
    # HTTP/1.0, codings other than a final chunked, bad or differing
    # lengths, a body over the limit.
    def body_framing(request, limits)
      if request.count("transfer-encoding").positive?
        raise Error.new(400, "Transfer-Encoding in an HTTP/1.0 request") if request.minor.zero?
        raise Error.new(400, "both Transfer-Encoding and Content-Length") if request.headers.key?("content-length")

        codings = request.headers["transfer-encoding"].split(",", -1).map { |c| c.gsub(/\A[ \t]+|[ \t]+\z/n, "").downcase }
        if codings.last != "chunked" || codings.count("chunked") > 1 || !codings.all? { |c| c.match?(TOKEN) }
          raise Error.new(400, "Transfer-Encoding must end with chunked, once, in a list of tokens")
        end
        raise Error.new(501, "only Transfer-Encoding: chunked is supported") if codings.size > 1

        return [:chunked, nil]
      end
      return NO_LENGTH unless request.headers.key?("content-length")

      values = request.headers["content-length"].split(",", -1).map(&:strip).uniq
      raise Error.new(400, "Content-Length values differ or are not numbers") if values.size != 1 || !values[0].match?(/\A\d{1,18}\z/)

      length = values[0].to_i
      raise Error.new(413, "the body is larger than #{limits.max_body} bytes") if length > limits.max_body

      request.headers["content-length"] = length.to_s # the app sees one value, no leading zeros
      [:length, length]
    end

    # The whole body, read before the app is called (a Rack 2 input must
    # rewind), into memory up to MEMORY_BODY and into a temporary file past
    # that: [input, length]. Chunked framing is removed; trailers are
    # checked and dropped (docs/http.md, "Trailers").
    def read_body(conn, request, framing, length, limits, deadline)
      input = BodyBuffer.new
      if framing == :chunked
        read_chunked(conn, request, input, limits, deadline)
      else
        copy(conn, input, length, limits, deadline)
      end
      input.finish
    end

    def copy(conn, input, count, limits, deadline)
      while count.positive?
        fill(conn, deadline) if conn.buf.empty?
        data = conn.take(count)
        input.write(data)
        count -= data.bytesize
        raise Error.new(413, "the body is larger than #{limits.max_body} bytes") if input.size > limits.max_body
      end
    end

    def fill(conn, deadline)
      raise ClientGone, "closed in the middle of a request body" unless conn.fill(deadline)
    rescue Timeout
      raise Error.new(408, "the request body did not arrive in time")
    end

    # One CRLF-terminated line (without it), at most `limit` bytes.
    def line(conn, limit, deadline, status)
      loop do
        finish = conn.buf.index(CRLF)
        scan = finish ? conn.buf.byteslice(0, finish) : conn.buf
        # Without a CRLF yet, a final CR may be the start of one.
        settled = finish ? scan : scan.delete_suffix("\r")
        raise Error.new(400, "a bare CR or LF in a chunked body's framing") if settled.match?(/[\r\n]/n)
        raise Error.new(status, "a chunk-size or trailer line is too long") if scan.bytesize > limit
        return conn.take(finish + 2).byteslice(0, finish) if finish

        fill(conn, deadline)
      end
    end

    def read_chunked(conn, request, input, limits, deadline)
      loop do
        size_line = line(conn, 4096, deadline, 400)
        match = CHUNK_LINE.match(size_line)
        raise Error.new(400, "a malformed chunk-size line") unless match

        digits = match[1]
        raise Error.new(400, "a chunk size over 16 hex digits or 2^63") if digits.size > 16 || digits.to_i(16) >= 1 << 63

        size = digits.to_i(16)
        break if size.zero?

        raise Error.new(413, "the body is larger than #{limits.max_body} bytes") if input.size + size > limits.max_body

        copy(conn, input, size, limits, deadline)
        fill(conn, deadline) while conn.buf.bytesize < 2
        raise Error.new(400, "a chunk is longer than its size") unless conn.take(2) == CRLF
      end
      read_trailers(conn, limits, deadline)
    end

    def read_trailers(conn, limits, deadline)
      lines = []
      total = 0
      loop do
        trailer = line(conn, limits.max_field_line, deadline, 431)
        break if trailer.empty?

        total += trailer.bytesize + 2
        raise Error.new(431, "the trailers are larger than #{limits.max_head} bytes") if total > limits.max_head
        raise Error.new(400, "a NUL byte in a trailer") if trailer.include?("\0")

        lines << trailer
      end
      # Checked by the rules of field lines, then dropped: the app has been
      # given the header section, and no trailer may change it.
      parse_fields(lines, limits)
    end

    # Collects a body in memory, moving to a temporary file once it grows
    # past MEMORY_BODY; `finish` rewinds it for the app.
    class BodyBuffer
      attr_reader :size

      def initialize
        @io = StringIO.new(+"".b)
        @size = 0
      end

      def write(data)
        if @io.is_a?(StringIO) && @size + data.bytesize > MEMORY_BODY
          file = Tempfile.new("forkpool-body")
          file.unlink
          file.binmode
          file.write(@io.string)
          @io = file
        end
        @io.write(data)
        @size += data.bytesize
      end

      def finish
        @io.rewind
        [@io, @size]
      end
    end
  end
end
