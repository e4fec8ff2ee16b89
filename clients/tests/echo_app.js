'use strict';
// The echo app of the HTTP corpus (tests/http-corpus, docs/http.md), as a
// Node request handler for clients/node/forkpool-node.js.
//
// Answers every request with 200 and a JSON object of what the app saw:
// the method, the path (percent-decoded, each byte one character), the
// raw query, the headers (Node's `req.headers`: lower-case names, and
// repeated fields joined as Node joins them) and the body, each byte one
// character (Latin-1), as the other echo apps show them. The JSON itself
// is sent as UTF-8.

/** `%XX` decoded to the byte it names, each byte one character. */
function percentDecoded(text) {
  return text.replace(/%([0-9A-Fa-f]{2})/g, (_, hex) => String.fromCharCode(parseInt(hex, 16)));
}

/** The path and query of a request target: origin, absolute or `*` form. */
function target(url) {
  let rest = url;
  const absolute = /^[A-Za-z][A-Za-z0-9+.-]*:\/\/[^/?]*/.exec(rest);
  if (absolute) {
    rest = rest.slice(absolute[0].length);
    rest = rest.startsWith('/') ? rest : `/${rest}`;
  }
  const mark = rest.indexOf('?');
  return mark < 0
    ? { path: percentDecoded(rest), query: '' }
    : { path: percentDecoded(rest.slice(0, mark)), query: rest.slice(mark + 1) };
}

module.exports = (req, res) => {
  const chunks = [];
  req.on('data', (chunk) => chunks.push(chunk));
  req.on('end', () => {
    const headers = {};
    for (const [name, value] of Object.entries(req.headers)) {
      headers[name] = Array.isArray(value) ? value.join(', ') : value;
    }
    const seen = {
      method: req.method,
      ...target(req.url),
      headers,
      body: Buffer.concat(chunks).toString('latin1'),
    };
    const out = Buffer.from(JSON.stringify(seen), 'utf8');
    res.writeHead(200, { 'Content-Type': 'application/json', 'Content-Length': out.length });
    res.end(out);
  });
};
