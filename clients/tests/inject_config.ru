# frozen_string_literal: true

# A Rack app that tries to split its response: a CRLF in a header value
# (/header) or a status that is not a number (/status). The server must
# send none of it and answer 500 (docs/http.md, "Responses from the app").
run lambda { |env|
  case env["PATH_INFO"]
  when "/header" then [200, { "X-Bad" => "a\r\nX-Injected: 1" }, ["split"]]
  when "/status" then ["200 OK\r\nX-Injected: 1", {}, ["split"]]
  else [200, { "Content-Length" => "2" }, ["ok"]]
  end
}
