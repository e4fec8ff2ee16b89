# frozen_string_literal: true

module Forkpool
  module HTTP
    # RFC 9110 token characters (methods, field names), as a pattern to
    # build the expressions below from.
    TOKEN_PATTERN = "[!#$%&'*+\\-.^_`|~0-9A-Za-z]+"
    # A field line without its CRLF: a token, a colon, optional
    # whitespace, a value of visible characters, spaces, tabs and obs-text
    # (captured without its leading and trailing whitespace).
    FIELD_PATTERN = "(#{TOKEN_PATTERN}):[ \\t]*((?:[\\t\\x20-\\x7e\\x80-\\xff]*[\\x21-\\x7e\\x80-\\xff])?)[ \\t]*"
    # A token, whole.
    TOKEN = Regexp.new("\\A#{TOKEN_PATTERN}\\z", Regexp::NOENCODING)
    # What may never be in a head: a LF not after a CR, a CR not before a
    # LF (checked once the next byte is there), NUL.
    BARE_LF = /(?<!\r)\n/n.freeze
    BARE_CR = /\r(?=[^\n])/n.freeze
    # Field values: visible characters, spaces, tabs and obs-text only.
    BAD_VALUE = /[\x00-\x08\x0a-\x1f\x7f]/n.freeze
    # A request target: visible ASCII only (no space, control or 8-bit byte).
    BAD_TARGET = /[^\x21-\x7e]/n.freeze
    VERSION = %r{\AHTTP/(\d)\.(\d)\z}n.freeze
    ABSOLUTE = %r{\Ahttps?://([^/?#]*)(.*)\z}ni.freeze
    # uri-host [":" port] (RFC 3986): a reg-name, or an IP literal in
    # brackets; no comma (what a proxy joining two Host lines would send).
    HOST = %r{\A(?:\[[0-9A-Za-z:.\-_~!$&'()*+;=]+\]|(?:[A-Za-z0-9\-._~!$&'()*+;=]|%\h\h)*)(?::\d*)?\z}n.freeze
    # A % in a path must start an escape of two hex digits.
    BAD_ESCAPE = /%(?!\h\h)/n.freeze
    # Empty lines before a request line that are ignored (RFC 9112 2.2).
    MAX_LEADING_EMPTY_LINES = 8
    # What no head may hold, in one pass: a bare LF, a bare CR, a NUL.
    BAD_HEAD_BYTE = /(?<!\r)\n|\r(?=[^\n])|\0/n.freeze
    # A request line that breaks no rule: METHOD SP TARGET SP HTTP/D.D. One
    # that does not match is taken apart again to say which rule it broke.
    REQUEST_LINE = Regexp.new("\\A(#{TOKEN_PATTERN}) ([\\x21-\\x7e]+) HTTP/(\\d)\\.(\\d)\\z", Regexp::NOENCODING)
    # A field line that breaks no rule (FIELD_PATTERN).
    FIELD_LINE = Regexp.new("\\A#{FIELD_PATTERN}\\z", Regexp::NOENCODING)
    # FIELD_LINE for a whole header section at once: each match starts
    # where the last one ended (\G), so the matches are every line only when
    # there are as many as lines.
    FIELD_LINES = Regexp.new("\\G#{FIELD_PATTERN}\\r\\n", Regexp::NOENCODING)
    # How many field lines COMMON_HEAD takes in its one match.
    COMMON_FIELDS = 8
    # Most request heads whole, in one match: an HTTP/1.x request line
    # that breaks no rule, then up to COMMON_FIELDS field lines as
    # FIELD_LINES takes them, then the rest: the blank line alone when
    # every line was taken. Each line is atomic (a failed match never
    # tries another split of an earlier line), and each is tried only
    # after the one before it matched (a line that fails is tried once,
    # not once a group). Captures: method, target, "0" for HTTP/1.0 (else
    # nil), then name and value for each field line taken, then the rest
    # (nil when it is the blank line alone): no string is made for what
    # most requests do not need.
    COMMON_HEAD = begin
      fields = Array.new(COMMON_FIELDS).inject("") { |inner| "(?:(?>#{FIELD_PATTERN}\\r\\n)#{inner})?" }
      Regexp.new("\\A(#{TOKEN_PATTERN}) ([\\x21-\\x7e]+) HTTP/1\\.(?:(0)|\\d)\\r\\n#{fields}(?:\\r\\n|(.+))\\z",
                 Regexp::NOENCODING | Regexp::MULTILINE)
    end
    # The lower-case form of the field names most requests carry, so that
    # most names are not lower-cased again on every request.
    KNOWN_FIELDS = %w[
      Host User-Agent Accept Accept-Encoding Accept-Language Connection Content-Length
      Content-Type Cookie Referer Cache-Control Upgrade-Insecure-Requests Origin
      Authorization If-None-Match If-Modified-Since Pragma Transfer-Encoding Expect
      X-Forwarded-For X-Forwarded-Proto X-Real-IP X-Request-Id Sec-Fetch-Site Sec-Fetch-Mode
      Sec-Fetch-Dest Sec-Fetch-User DNT TE Range Priority
    ].flat_map { |name| [[name, name.downcase.freeze], [name.downcase, name.downcase.freeze]] }
               .to_h.freeze

    # One parsed request head.
    class Request
      NO_TOKENS = [].freeze

      attr_reader :method, :target, :path, :query, :minor, :headers
      attr_accessor :host

      # `fields`: [lower-case name, value] pairs, in order (or none: #add
      # each).
      def initialize(method, target, minor, fields = nil)
        @method = method
        @target = target
        @minor = minor
        @headers = {}
        @keepalive = nil
        # The names of fields after their first line (nil: none repeats).
        @repeated = nil
        fields&.each { |name, value| add(name, value) }
      end

      # A field line, `name` in lower case: its value joins those of the
      # lines of that name before it, after ", ".
      def add(name, value)
        if (first = @headers[name])
          (@repeated ||= []) << name
          @headers[name] = "#{first}, #{value}"
        else
          @headers[name] = value
        end
      end

      def version
        @minor.zero? ? "HTTP/1.0" : "HTTP/1.1"
      end

      def request_line
        "#{@method} #{@target} #{version}"
      end

      def split_target(path, query)
        @path = path
        @query = query
      end

      # The lower-case tokens of a comma-separated header.
      def tokens(name)
        (@headers[name] || "").split(",").map { |t| t.strip.downcase }.reject(&:empty?)
      end

      def keepalive?
        return @keepalive unless @keepalive.nil?

        value = @headers["connection"]
        # One token, as most requests send it, needs no split (a value
        # comes without the whitespace around it), and an ASCII comparison
        # (casecmp? would fold both strings to new ones).
        unless value&.include?(",")
          return @keepalive = @minor >= 1 ? value&.casecmp("close") != 0 : value&.casecmp("keep-alive") == 0
        end

        connection = tokens("connection")
        @keepalive = @minor >= 1 ? !connection.include?("close") : connection.include?("keep-alive")
      end

      # How many field lines named `name` (lower-case) the head has.
      def count(name)
        return 0 unless @headers.key?(name)

        @repeated ? 1 + @repeated.count(name) : 1
      end
    end

    module_function

    # The next request head, from the first byte to the blank line, or nil
    # when the client closed (or was silent) before sending a byte.
    # Refuses (Error) a head still arriving as soon as the bytes already
    # there break a rule, and a complete one too long; the byte rules of a
    # complete head are parse_head's to check.
    def read_head(conn, limits, deadline)
      skipped = 0
      while true # rubocop:disable Style/InfiniteLoop (Kernel#loop's block costs a request)
        # RFC 9112 2.2: empty lines before a request line are ignored.
        while conn.buf.start_with?(CRLF)
          conn.take(2) # (a new buffer when these were the last bytes)
          skipped += 1
          raise Error.new(400, "more than #{MAX_LEADING_EMPTY_LINES} empty lines before the request") if skipped > MAX_LEADING_EMPTY_LINES
        end
        unless conn.buf.empty?
          finish = conn.buf.index("\r\n\r\n")
          # A refused head ends the connection: taking it first costs
          # nothing. Its bytes are checked by parse_head.
          return check_sizes(conn.take(finish + 4), limits) if finish

          check_bytes(conn.buf, limits)
        end

        begin
          more = conn.fill(deadline)
        rescue Timeout
          raise Error.new(408, "the request head did not arrive in time") unless conn.buf.empty?

          return nil
        end
        next if more
        raise ClientGone, "closed in the middle of a request head" unless conn.buf.empty?

        return nil
      end
    end

    # `head` (or the part of it there so far) when it breaks no byte rule.
    def check_bytes(head, limits)
      check_sizes(head, limits)
      return head unless head.match?(BAD_HEAD_BYTE)

      raise Error.new(400, "a bare LF in the request head (lines end with CRLF)") if head.match?(BARE_LF)
      raise Error.new(400, "a bare CR in the request head") if head.match?(BARE_CR)

      raise Error.new(400, "a NUL byte in the request head")
    end

    # `head` (or the part of it there so far) when its request line and
    # its size are within the limits.
    def check_sizes(head, limits)
      line_end = head.index(CRLF) || head.bytesize
      raise Error.new(414, "the request line is longer than #{limits.max_request_line} bytes") if line_end > limits.max_request_line
      raise Error.new(431, "the request head is larger than #{limits.max_head} bytes") if head.bytesize > limits.max_head

      head
    end

    # A Request from a complete head (ending with the blank line) that
    # read_head returned. A head COMMON_HEAD takes whole holds no bare CR
    # or LF and no NUL (its patterns admit none): only a head it does not
    # take is searched for those bytes (parse_any_head), whose rule goes
    # first.
    def parse_head(head, limits)
      request = parse_common_head(head, limits) || parse_any_head(head, limits)
      resolve_target(request)
      check_host(request)
      request
    end

    # The Request of a head COMMON_HEAD takes whole (its field lines past
    # COMMON_FIELDS scanned by parse_section), or nil: a head longer than
    # a field line may be (a line in it could be too long), a CONNECT
    # (refused in order by parse_any_head), or one a rule may refuse.
    def parse_common_head(head, limits)
      return nil if head.bytesize > limits.max_field_line

      match = COMMON_HEAD.match(head)
      return nil if match.nil?

      captures = match.captures
      return nil if captures[0] == "CONNECT"

      request = Request.new(captures[0], captures[1], captures[2] ? 0 : 1)
      at = 3
      while at < 3 + 2 * COMMON_FIELDS && (name = captures[at])
        request.add(KNOWN_FIELDS[name] || name.downcase, captures[at + 1])
        at += 2
      end
      taken = (at - 3) / 2
      if (rest = captures.last)
        more = parse_section(rest.byteslice(0, rest.bytesize - 2), limits, strict: false)
        return nil if more.nil?

        more.each { |field_name, value| request.add(field_name, value) }
        taken += more.size
      end
      return nil if taken > limits.max_fields

      request
    end

    # The Request of any head, or the Error of the first rule it breaks:
    # its bytes, its request line, then its field lines.
    def parse_any_head(head, limits)
      check_bytes(head, limits)
      line_end = head.index(CRLF)
      method, target, minor = parse_request_line(head.byteslice(0, line_end))
      # The field lines, each with its CRLF, without the blank line.
      section = head.byteslice(line_end + 2, head.bytesize - line_end - 4)
      Request.new(method, target, minor, parse_section(section, limits))
    end

    # [method, target, minor] of a request line.
    def parse_request_line(line)
      match = REQUEST_LINE.match(line)
      return request_line_error(line) unless match
      raise Error.new(505, "HTTP/#{match[3]}.#{match[4]} is not supported (HTTP/1.x is)") if match[3] != "1"

      method = match[1]
      raise Error.new(501, "CONNECT is for proxies; this server is an origin server") if method == "CONNECT"

      # HTTP/1.2 to 1.9 are served as HTTP/1.1 (RFC 9110 2.5).
      [method, match[2], match[4] == "0" ? 0 : 1]
    end

    # Raises the Error naming the rule a request line that REQUEST_LINE
    # does not match breaks.
    def request_line_error(line)
      parts = line.split(/ /, -1) # one space exactly (a String " " would split on any run of whitespace)
      raise Error.new(400, "the request line is not METHOD SP TARGET SP VERSION") if parts.size != 3

      method, target, version = parts
      raise Error.new(400, "the method is not a token") unless method.match?(TOKEN)
      raise Error.new(400, "the request target is empty or has bytes a URI cannot") if target.empty? || target.match?(BAD_TARGET)
      raise Error.new(400, "the HTTP version is malformed") unless VERSION.match?(version)

      raise Error.new(400, "the request line is malformed")
    end

    # [lower-case name, value] pairs from a header section (field lines,
    # each ending with CRLF) in one scan, when every line keeps the rules;
    # else nil, and, with `strict`, line by line, which raises the rule a
    # line broke.
    def parse_section(section, limits, strict: true)
      count = section.count("\n")
      raise Error.new(431, "more than #{limits.max_fields} header fields") if count > limits.max_fields

      # A section no longer than a field line may be has no line too long.
      fields = section.bytesize <= limits.max_field_line ? section.scan(FIELD_LINES) : []
      if fields.size != count
        return nil unless strict

        return parse_fields(section.split(CRLF), limits)
      end

      fields.each { |field| field[0] = KNOWN_FIELDS[field[0]] || field[0].downcase }
    end

    # [lower-case name, value] pairs from field lines (head or trailers).
    def parse_fields(lines, limits)
      raise Error.new(431, "more than #{limits.max_fields} header fields") if lines.size > limits.max_fields

      lines.map do |line|
        raise Error.new(431, "a header field is longer than #{limits.max_field_line} bytes") if line.bytesize > limits.max_field_line

        match = FIELD_LINE.match(line) || field_line_error(line)
        name = match[1]
        [KNOWN_FIELDS[name] || name.downcase, match[2]]
      end
    end

    # Raises the Error naming the rule a field line that FIELD_LINE does
    # not match breaks.
    def field_line_error(line)
      raise Error.new(400, "obsolete line folding in a header field") if line.start_with?(" ", "\t")

      name, colon, value = line.partition(":")
      raise Error.new(400, "a header line is not NAME: VALUE (no space before the colon)") if colon.empty? || !name.match?(TOKEN)
      raise Error.new(400, "a header value has control characters") if value.match?(BAD_VALUE)

      raise Error.new(400, "a malformed header line")
    end

    # Splits the target into path and query (the fragment dropped); takes
    # the path and Host from an absolute-form target.
    def resolve_target(request)
      target = request.target
      return resolve_path(request, target) if target.start_with?("/") && !target.include?("#")

      target = target.split("#", 2).first || ""
      if target.start_with?("/")
        path, query = target.split("?", 2)
      elsif target == "*"
        raise Error.new(400, "the target * is for OPTIONS only") if request.method != "OPTIONS"

        path = "*"
      elsif (absolute = ABSOLUTE.match(target))
        authority = absolute[1]
        if authority.empty? || authority.include?("@") || !authority.match?(HOST)
          raise Error.new(400, "the absolute URI has no host, userinfo or a bad host")
        end

        request.host = authority
        path, query = absolute[2].split("?", 2)
        path = "/#{path}" unless path&.start_with?("/")
      else
        raise Error.new(400, "the request target is not a path (/...), an absolute URI or *")
      end
      raise Error.new(400, "a % in the path that is not an escape (%XX)") if path.match?(BAD_ESCAPE)

      request.split_target(path, query || "")
    end

    # An origin-form target without a fragment (most of them): the path,
    # then the query after the first "?".
    def resolve_path(request, target)
      query = target.index("?")
      path = query ? target.byteslice(0, query) : target
      raise Error.new(400, "a % in the path that is not an escape (%XX)") if path.include?("%") && path.match?(BAD_ESCAPE)

      request.split_target(path, query ? target.byteslice(query + 1, target.bytesize) : "")
    end

    # Host values found valid, remembered: most requests repeat one.
    VALID_HOSTS = {} # rubocop:disable Style/MutableConstant (filled as hosts come)
    VALID_HOSTS_MAX = 64

    def valid_host?(value)
      return true if VALID_HOSTS.key?(value)
      return false unless value.match?(HOST)

      VALID_HOSTS[value.frozen? ? value : value.dup.freeze] = true if VALID_HOSTS.size < VALID_HOSTS_MAX
      true
    end

    def check_host(request)
      hosts = request.count("host")
      raise Error.new(400, "more than one Host header") if hosts > 1
      raise Error.new(400, "an HTTP/1.1 request without Host") if hosts.zero? && request.minor >= 1

      value = request.headers["host"]
      raise Error.new(400, "the Host header is not a host[:port]") if value && !valid_host?(value)

      request.host ||= value
    end
  end
end
