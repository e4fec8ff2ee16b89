'use strict';
// Node's cluster module serving bench/apps/hello_node.js: a primary that
// forks WORKERS workers, which share PORT on 127.0.0.1 (the primary
// accepts and hands connections round-robin, Node's default on Linux).
//   node node_cluster.js WORKERS PORT
const cluster = require('cluster');
const http = require('http');
const handler = require('./hello_node');

const [workers, port] = process.argv.slice(2).map(Number);
if (cluster.isPrimary) {
  for (let i = 0; i < workers; i += 1) {
    cluster.fork();
  }
  process.on('SIGTERM', () => {
    for (const w of Object.values(cluster.workers)) {
      w.process.kill('SIGTERM');
    }
    process.exit(0);
  });
} else {
  http.createServer(handler).listen(port, '127.0.0.1');
}
