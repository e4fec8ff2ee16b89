'use strict';
// The Node "hello" handler bench/node.sh serves with Node's cluster module
// and with forkpool-node alike.
module.exports = (req, res) => {
  res.writeHead(200, { 'Content-Type': 'text/plain', 'Content-Length': '6' });
  res.end('hello\n');
};
