'use strict';
// A Node request handler for crates/forkpool-cli/tests/node.rs: answers
// "hello" with the worker's pid, after ?sleep_ms=N if asked.
module.exports = (req, res) => {
  const url = new URL(req.url, 'http://localhost');
  const sleep = Number(url.searchParams.get('sleep_ms') || 0);
  if (sleep > 0) {
    // The test waits for this before it stops the pool.
    process.stderr.write(`request ${req.url}\n`);
  }
  setTimeout(() => {
    res.setHeader('X-Forkpool-Pid', String(process.pid));
    res.setHeader('Content-Type', 'text/plain');
    res.end('hello\n');
  }, sleep);
};
