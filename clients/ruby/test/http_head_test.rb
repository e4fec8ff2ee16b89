# frozen_string_literal: true

# parse_head takes most heads in one match (HTTP.parse_common_head) and
# the rest the long way (HTTP.parse_any_head), which also names the rule a
# head breaks. Both must read every head alike: the same request, or the
# same refusal. Checked on chosen heads and on heads put together at
# random from good and bad pieces (seeded: a failure prints its seed).
# Run: ruby -I clients/ruby clients/ruby/test/http_head_test.rb
# (crates/forkpool-cli/tests/rack.rs runs it).

require "minitest/autorun"
require "forkpool/http"

class HttpHeadTest < Minitest::Test
  HTTP = Forkpool::HTTP
  LIMITS = HTTP::Limits.defaults

  GOOD_LINES = ["GET / HTTP/1.1", "GET /a?b=c HTTP/1.1", "POST /x HTTP/1.0", "OPTIONS * HTTP/1.1",
                "GET http://h:80/p?q HTTP/1.1", "GET / HTTP/1.9"].freeze
  BAD_LINES = ["HEAD * HTTP/1.1", "CONNECT h:443 HTTP/1.1", "GET / HTTP/2.0", "GET  / HTTP/1.1",
               "G\x80T / HTTP/1.1", "GET /\x7f HTTP/1.1", "GET / HTTP/1.1 ", "GET /%zz HTTP/1.1", "GET"].freeze
  GOOD_FIELDS = ["Host: example.com", "Host: a:8080", "host:b", "Connection: close",
                 "Connection: keep-alive, Upgrade", "X-A:  spaced value \t", "X-Obs: caf\xc3\xa9", "X-Empty:",
                 "X-Empty2: \t ", "Accept: */*", "Content-Length: 5", "Transfer-Encoding: chunked",
                 "X_Under: 1", "X-A: again", "X-Tab:\tv\t"].freeze
  BAD_FIELDS = ["Bad Name: x", " folded: x", "X-Ctl: a\x01b", "X-Nul: a\0b", "X-CR: a\rb", "NoColon",
                "X-LF: a\nb"].freeze

  def pick(random, good, bad, bad_odds)
    random.rand < bad_odds ? bad[random.rand(bad.size)] : good[random.rand(good.size)]
  end

  COUNTED = %w[host transfer-encoding x-a].freeze

  def read(head)
    request = HTTP.parse_head(head.b, LIMITS)
    [request.method, request.target, request.minor, request.headers, request.host, request.path,
     request.query, COUNTED.map { |name| request.count(name) }]
  rescue HTTP::Error => e
    [e.status, e.message]
  end

  def reference(head)
    request = HTTP.parse_any_head(head.b, LIMITS)
    HTTP.resolve_target(request)
    HTTP.check_host(request)
    [request.method, request.target, request.minor, request.headers, request.host, request.path,
     request.query, COUNTED.map { |name| request.count(name) }]
  rescue HTTP::Error => e
    [e.status, e.message]
  end

  def head(line, fields)
    "#{line}\r\n#{fields.map { |f| "#{f}\r\n" }.join}\r\n"
  end

  def test_chosen_heads_read_alike_both_ways
    heads = [head("GET / HTTP/1.1", ["Host: a"]), head("GET / HTTP/1.0", []),
             head("GET / HTTP/1.1", ["Host: a"] + (1..20).map { |i| "X-#{i}: #{i}" }),
             head("GET / HTTP/1.1", ["Host: a"] + ["X: y"] * 120),
             head("GET / HTTP/1.1", ["Host: a", "X: #{"v" * 9000}"]),
             head("GET / HTTP/1.1", ["Host: a", "X: #{" a" * 3000}\x01"])]
    heads.each { |h| assert_equal reference(h), read(h), h[0, 200].inspect }
    assert_equal "GET", read(heads[0])[0], "a good head is served"
    assert_equal 431, read(heads[3])[0], "too many fields past the first eight"
  end

  def test_random_heads_read_alike_both_ways
    seed = Integer(ENV.fetch("SEED", Random.new_seed % 1_000_000))
    random = Random.new(seed)
    served = 0
    2000.times do
      fields = Array.new(random.rand(0..14)) { pick(random, GOOD_FIELDS, BAD_FIELDS, 0.03) }
      h = head(pick(random, GOOD_LINES, BAD_LINES, 0.1), fields)
      got = read(h)
      assert_equal reference(h), got, "SEED=#{seed}: #{h.inspect}"
      served += 1 if got[0].is_a?(String)
    end
    assert_operator served, :>, 100, "SEED=#{seed}: the pieces make good heads too"
  end
end
