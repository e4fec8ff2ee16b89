# frozen_string_literal: true

# The echo app of the HTTP corpus (tests/http-corpus, docs/http.md), Rack.
#
# Answers every request with 200 and a JSON object of what the app saw:
# the method, the path (PATH_INFO, which Rack leaves percent-encoded,
# decoded here), the query string, the headers (HTTP_* and
# CONTENT_TYPE/CONTENT_LENGTH, named back as lower-case header names) and
# the body read from rack.input. Each byte is shown as the character with
# the same code point (Latin-1).
#
# FORKPOOL_ECHO_LINT=1 puts Rack::Lint in front, which checks that the
# server keeps the Rack specification.
require "json"

latin1 = ->(bytes) { bytes.to_s.b.force_encoding(Encoding::ISO_8859_1).encode(Encoding::UTF_8) }

echo = lambda do |env|
  headers = {}
  env.each do |key, value|
    if key.start_with?("HTTP_")
      headers[key.delete_prefix("HTTP_").tr("_", "-").downcase] = latin1.call(value)
    elsif %w[CONTENT_TYPE CONTENT_LENGTH].include?(key) && !value.to_s.empty?
      headers[key.tr("_", "-").downcase] = latin1.call(value)
    end
  end
  path = env["PATH_INFO"].to_s.b.gsub(/%(\h\h)/n) { Regexp.last_match(1).hex.chr }
  seen = {
    "method" => env["REQUEST_METHOD"],
    "path" => latin1.call(path),
    "query" => latin1.call(env["QUERY_STRING"]),
    "headers" => headers,
    "body" => latin1.call(env["rack.input"].read)
  }
  out = JSON.generate(seen)
  headers = { "Content-Type" => "application/json", "Content-Length" => out.bytesize.to_s }
  # The length of what a GET would get; the body itself never goes with HEAD.
  [200, headers, env["REQUEST_METHOD"] == "HEAD" ? [] : [out]]
end

if ENV["FORKPOOL_ECHO_LINT"] == "1"
  require "uri" # Rack 2.2's Lint checks hosts with URI without loading it
  use Rack::Lint
end
run echo
