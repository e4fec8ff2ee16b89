'use strict';
// forkpool worker helper for Node.js, standard library only.
//
// What a Node worker can do with Node's public API decides where it runs
// (docs/protocol.md, "The worker contract, by capability"): it cannot
// receive descriptors (handoff, and kernel dispatch's R), accept exactly
// one connection when told (order, shared: libuv accepts every waiting
// one), or map the scoreboard (kernel dispatch's K). So this helper runs
// in `--dispatch none`: the listeners come the systemd way (LISTEN_FDS
// from fd 3), Node accepts on them itself, and the pool is fixed at
// --min-children workers. In any other mode it refuses at start, saying
// which mode to use, rather than serve badly.

const http = require('http');

const FIRST_FD = 3;

/** Why this process cannot serve as a forkpool worker, or null. */
function refusal(env = process.env) {
  const dispatch = env.FORKPOOL_DISPATCH;
  if (env.FORKPOOL_TEMPLATE_FD !== undefined) {
    return 'Node cannot fork a running process, so it cannot be a --preload ' +
      'template: run it without --preload';
  }
  if (dispatch === undefined) {
    return 'not started by forkpool (FORKPOOL_DISPATCH is not set): ' +
      'run it as forkpool run --dispatch none -- node forkpool-node.js APP';
  }
  if (dispatch !== 'none') {
    const mode = env.FORKPOOL_KERNEL_DISPATCH === '1' ? 'kernel' : dispatch;
    return `Node's public API cannot serve ${mode} dispatch (it cannot receive ` +
      'descriptors, accept exactly one connection when told, or map the ' +
      'scoreboard): run the pool with --dispatch none';
  }
  return null;
}

/** Exits with the reason when this process cannot serve (see refusal). */
function exitUnlessServable() {
  const why = refusal();
  if (why) {
    process.stderr.write(`forkpool-node: ${why}\n`);
    process.exit(2);
  }
}

/** The descriptors of the listeners passed to this process, in order. */
function listenerFds(env = process.env) {
  const count = Number(env.LISTEN_FDS || 0);
  if (count === 0 || Number(env.LISTEN_PID) !== process.pid) {
    return [];
  }
  return Array.from({ length: count }, (_, i) => FIRST_FD + i);
}

/**
 * The pool's listen backlog: Node calls listen(2) again on the socket it
 * is given, so it must pass the pool's own number, or it silently
 * replaces it with 511.
 */
function backlog(env = process.env) {
  const n = Number(env.FORKPOOL_BACKLOG);
  return Number.isInteger(n) && n > 0 ? n : undefined;
}

/**
 * Serves `handler` ((req, res), as http.createServer takes it) on every
 * listener, until SIGTERM: then it stops accepting, lets the requests in
 * progress finish, closes idle kept-alive connections, and exits 0.
 * Returns the servers.
 */
function serve(handler, options = {}) {
  exitUnlessServable();
  const fds = listenerFds();
  if (fds.length === 0) {
    process.stderr.write('forkpool-node: no listeners passed (LISTEN_FDS)\n');
    process.exit(2);
  }
  const servers = fds.map((fd) => {
    const server = http.createServer(options.server || {}, handler);
    // Node takes the backlog of an `{ fd }` listen only as the second
    // argument (an options field is ignored for a descriptor).
    server.listen({ fd }, backlog());
    return server;
  });
  process.once('SIGTERM', () => quit(servers));
  return servers;
}

/** Graceful quit: no new connections, the current requests finish. */
function quit(servers) {
  let open = servers.length;
  for (const server of servers) {
    server.close(() => {
      open -= 1;
      if (open === 0) {
        process.exit(0);
      }
    });
    // A kept-alive connection between requests holds nothing: close it
    // now; one in a request is closed once its response is sent.
    server.closeIdleConnections();
  }
}

module.exports = { serve, quit, refusal, exitUnlessServable, listenerFds, backlog };
