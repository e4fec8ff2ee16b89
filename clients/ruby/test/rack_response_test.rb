# frozen_string_literal: true

# Unit tests of Forkpool::RackResponse's header lines: a header name
# remembers the last value it went out with and the line that made, so
# these check that what goes out is always what the app gave this time.
# Run: ruby -I clients/ruby clients/ruby/test/rack_response_test.rb
# (crates/forkpool-cli/tests/http_corpus_rack.rs runs it).

require "minitest/autorun"
require "forkpool/rack_server"

class RackResponseTest < Minitest::Test
  # Collects what a response writes.
  class Sink
    attr_reader :data

    def initialize
      @data = +"".b
    end

    def write(data, _timeout)
      @data << data
    end
  end

  REQUEST = Forkpool::HTTP.parse_head("GET / HTTP/1.1\r\nHost: x\r\n\r\n".b, Forkpool::HTTP::Limits.defaults)

  # The bytes of one response to REQUEST, ending the connection.
  def respond(status, headers, body)
    sink = Sink.new
    Forkpool::RackResponse.new(sink, REQUEST, 5.0, false).send(status, headers, body, false)
    sink.data
  end

  def head_lines(response)
    response.split("\r\n\r\n", 2).first.split("\r\n").drop(1)
  end

  # A name's line is made again whenever its value differs, Content-Length
  # included (the body goes out cut to it): the same name with three
  # values, then the first again.
  def test_a_changed_value_goes_out_changed
    name = "X-Test-Changed"
    %w[one two three one].each do |value|
      assert_includes head_lines(respond(200, { name => value }, ["body"])), "#{name}: #{value}"
    end
    [["3", "abc"], ["5", "abcde"], ["3", "abc"]].each do |length, sent|
      response = respond(200, { "Content-Length" => length }, ["abcdefgh"])
      assert_includes head_lines(response), "Content-Length: #{length}"
      assert response.end_with?("\r\n\r\n#{sent}"), response.inspect
    end
  end

  # A value the app changes in place after it went out is not the value
  # remembered: the next response says what the string holds then.
  def test_a_value_changed_in_place_goes_out_as_it_now_reads
    value = +"first"
    assert_includes head_lines(respond(200, { "X-Test-Mutable" => value }, [])), "X-Test-Mutable: first"
    value.replace("second")
    assert_includes head_lines(respond(200, { "X-Test-Mutable" => value }, [])), "X-Test-Mutable: second"
  end

  # A remembered good value does not let a bad one through after it, nor
  # a bad Content-Length: each is refused, and the good value still goes
  # out after.
  def test_a_bad_value_after_a_good_one_is_refused
    name = "X-Test-Bad"
    assert_includes head_lines(respond(200, { name => "good" }, [])), "#{name}: good"
    assert_raises(Forkpool::RackResponse::Invalid) { respond(200, { name => "bad\r\nSet-Cookie: x=1" }, []) }
    assert_includes head_lines(respond(200, { name => "good" }, [])), "#{name}: good"
    assert_includes head_lines(respond(200, { "Content-Length" => "2" }, ["ok"])), "Content-Length: 2"
    assert_raises(ArgumentError) { respond(200, { "Content-Length" => "two" }, ["ok"]) }
  end

  # Hop-by-hop names never go out, whatever the value, and Connection:
  # close from the app still closes a kept-alive connection.
  def test_hop_by_hop_headers_are_the_servers
    sink = Sink.new
    response = Forkpool::RackResponse.new(sink, REQUEST, 5.0, true)
    response.send(200, { "Connection" => "close", "Transfer-Encoding" => "chunked" }, ["x"], false)
    lines = head_lines(sink.data)
    refute_includes lines, "Transfer-Encoding: chunked"
    assert_includes lines, "Connection: close"
    refute response.keepalive?
  end

  # A Symbol name (not remembered) and Rack 2's several values on lines of
  # one string go out as given, repeatedly.
  def test_unremembered_names_and_several_values
    2.times do
      lines = head_lines(respond(200, { "Set-Cookie" => "a=1\nb=2", "X-Test-Symbol": "s" }, []))
      assert_equal ["Set-Cookie: a=1", "Set-Cookie: b=2", "X-Test-Symbol: s"], lines.grep(/\A(Set-Cookie|X-Test-Symbol):/)
    end
  end
end
