"""The echo app of the HTTP corpus (tests/http-corpus, docs/http.md), WSGI.

Answers every request with 200 and a JSON object of what the app saw:
the method, the path (PATH_INFO, already percent-decoded by the server),
the query string, the headers (HTTP_* and CONTENT_TYPE/CONTENT_LENGTH,
named back as lower-case header names) and the body read from
`wsgi.input`. Strings are the environ's (each byte one character, as
PEP 3333 has them), the body decoded the same way (Latin-1).

`validated` is the same app behind `wsgiref.validate`, which checks that
the server keeps PEP 3333.
"""

import json
from wsgiref.validate import validator


def app(environ, start_response):
    body = []
    while True:
        block = environ["wsgi.input"].read(65536)
        if not block:
            break
        body.append(block)
    headers = {}
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            headers[key[5:].replace("_", "-").lower()] = value
        elif key in ("CONTENT_TYPE", "CONTENT_LENGTH") and value:
            headers[key.replace("_", "-").lower()] = value
    seen = {
        "method": environ["REQUEST_METHOD"],
        "path": environ.get("PATH_INFO", ""),
        "query": environ.get("QUERY_STRING", ""),
        "headers": headers,
        "body": b"".join(body).decode("latin-1"),
    }
    out = json.dumps(seen).encode("ascii")
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(out)))])
    return [out]


validated = validator(app)
