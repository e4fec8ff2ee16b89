# frozen_string_literal: true

# HTTP/1.1 for forkpool's Ruby server: the connection (a socket with a read
# buffer, every read and write bounded in time), the limits, and the
# errors. The request head is parsed in http_request.rb, the body read in
# http_body.rb; both follow the one rule set of docs/http.md.

module Forkpool
  module HTTP
    CRLF = "\r\n"

    REASONS = {
      100 => "Continue", 200 => "OK", 204 => "No Content", 304 => "Not Modified",
      400 => "Bad Request", 405 => "Method Not Allowed", 408 => "Request Timeout",
      413 => "Content Too Large", 414 => "URI Too Long", 417 => "Expectation Failed",
      431 => "Request Header Fields Too Large", 500 => "Internal Server Error",
      501 => "Not Implemented", 505 => "HTTP Version Not Supported"
    }.freeze

    # A request this server will not serve; `status` is the answer, and the
    # connection is closed after it.
    class Error < StandardError
      attr_reader :status

      def initialize(status, why)
        super(why)
        @status = status
      end
    end

    # The client closed the connection, or stopped reading or sending.
    class ClientGone < StandardError; end

    # Every bound the server enforces: times in seconds, sizes in bytes.
    Limits = Struct.new(
      :head_timeout, :body_timeout, :keepalive_timeout, :keepalive_turn, :io_timeout,
      :max_requests, :max_request_line, :max_field_line, :max_head, :max_fields, :max_body,
      keyword_init: true
    ) do
      def self.defaults
        new(head_timeout: 10.0, body_timeout: 30.0, keepalive_timeout: 5.0, keepalive_turn: 0.02,
            io_timeout: 30.0, max_requests: 1000, max_request_line: 8190, max_field_line: 8190,
            max_head: 65_536, max_fields: 100, max_body: 1 << 30)
      end
    end

    def self.now
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end

    def self.reason(status)
      REASONS[status] || (defined?(::Rack::Utils::HTTP_STATUS_CODES) && ::Rack::Utils::HTTP_STATUS_CODES[status]) || ""
    end

    # A socket with a read buffer. Reads never block: each waits with
    # IO.select up to a deadline, so no read waits for ever.
    class Connection
      # The most one read takes.
      READ_SIZE = 65_536

      attr_reader :sock, :buf

      # The string every read lands in before it joins a buffer: one per
      # process (a worker serves one connection at a time), so that a read
      # does not allocate READ_SIZE bytes for the few it gets.
      def self.read_buffer
        @read_buffer ||= String.new(capacity: READ_SIZE, encoding: Encoding::ASCII_8BIT)
      end

      def initialize(sock)
        @sock = sock
        @buf = +"".b
        @eof = false
      end

      # Reads what is there (or waits for it until `deadline`) into the
      # buffer; false at end of file. Raises Error(408)-free TimeoutError
      # (Timeout) when the deadline passes first.
      def fill(deadline)
        return false if @eof

        while true # rubocop:disable Style/InfiniteLoop (Kernel#loop's block costs a request)
          data = @sock.read_nonblock(READ_SIZE, Connection.read_buffer, exception: false)
          case data
          when :wait_readable
            left = deadline - HTTP.now
            raise Timeout if left <= 0 || IO.select([@sock], nil, nil, left).nil?
          when nil
            @eof = true
            return false
          else
            @buf << data
            return true
          end
        end
      rescue Errno::ECONNRESET, Errno::EPIPE, Errno::ETIMEDOUT => e
        raise ClientGone, e.message
      end

      def eof?
        @eof
      end

      # Removes and returns the first `n` bytes of the buffer.
      def take(count)
        return @buf.slice!(0, count) if count < @buf.bytesize

        taken = @buf
        @buf = +"".b
        taken
      end

      # True when a byte (or end of file) is there within `timeout`.
      def readable?(timeout)
        return true unless @buf.empty? && !@eof

        !IO.select([@sock], nil, nil, timeout).nil?
      end

      # Sends all of `data`, waiting for room at most `timeout` in all.
      def write(data, timeout)
        deadline = nil
        until data.empty?
          written = @sock.write_nonblock(data, exception: false)
          if written == :wait_writable
            deadline ||= HTTP.now + timeout
            left = deadline - HTTP.now
            if left <= 0 || IO.select(nil, [@sock], nil, left).nil?
              raise ClientGone, "the client did not read for #{timeout} s"
            end
          else
            break if written == data.bytesize

            data = data.byteslice(written..)
          end
        end
      rescue Errno::EPIPE, Errno::ECONNRESET, Errno::ETIMEDOUT, IOError => e
        raise ClientGone, e.message
      end

      # After an error answer: stop sending (the client sees the answer
      # end), then read and drop what the client still sends, for at most
      # `seconds` or `most` bytes. Closing on unread bytes would reset the
      # connection, and a reset can destroy the answer before the client
      # reads it (RFC 9112, 9.6).
      def linger(seconds = 2.0, most = 1 << 20)
        @sock.shutdown(Socket::SHUT_WR)
        deadline = HTTP.now + seconds
        dropped = 0
        while dropped < most
          data = @sock.read_nonblock(65_536, exception: false)
          if data == :wait_readable
            left = deadline - HTTP.now
            return if left <= 0 || IO.select([@sock], nil, nil, left).nil?
          else
            return if data.nil?

            dropped += data.bytesize
          end
        end
      rescue SystemCallError, IOError
        nil
      end
    end

    # A deadline passed while reading.
    class Timeout < StandardError; end

    # A complete plain-text error answer that closes the connection.
    def self.error_response(status, why)
      body = "#{status} #{reason(status)}: #{why}\n".b
      "HTTP/1.1 #{status} #{reason(status)}\r\nContent-Type: text/plain; charset=utf-8\r\n" \
        "Content-Length: #{body.bytesize}\r\nConnection: close\r\n\r\n".b + body
    end
  end
end

require_relative "http_request"
require_relative "http_body"
