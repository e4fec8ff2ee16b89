"""A raw WSGI app that tries response splitting, for forkpool_wsgi's test:
`/header` returns a header value with CRLF and a header of its own in it,
`/status` a status line with one. forkpool_wsgi must answer 500 instead
and never send either (docs/http.md, "Responses from the app")."""


def app(environ, start_response):
    if environ["PATH_INFO"] == "/status":
        start_response("200 OK\r\nX-Injected: status", [("Content-Length", "2")])
    elif environ["PATH_INFO"] == "/header":
        start_response("200 OK", [("X-Bad", "a\r\nX-Injected: header"), ("Content-Length", "2")])
    else:
        start_response("200 OK", [("Content-Length", "2")])
    return [b"ok"]
