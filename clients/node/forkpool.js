'use strict';
// forkpool worker helper for Node.js, standard library only.
//
// What a Node worker can do with Node's public API decides where it runs
// (docs/protocol.md, "The worker contract, by capability"): it can read
// and write one message at a time on the back-channel (fs.read,
// fs.writeSync) and accept on the sockets it is given, but it cannot
// receive descriptors (handoff, and kernel dispatch's R), accept exactly
// one connection when told (order, shared: libuv accepts every waiting
// one), or map the scoreboard (kernel dispatch's K). So it serves:
//
// - kernel dispatch (the default) by the messages path: it says `G`,
//   accepts on its own slot sockets and the pool's listeners, and says
//   `B`, `N` and `I` as connections open and close;
// - --dispatch none: Node accepts on the pool's listeners, no channel.
//
// In any other mode it refuses at start, saying which mode to use.

const http = require('http');
const messages = require('./messages');
const { Channel } = require('./channel');

const FIRST_FD = 3;

/**
 * How long a kept-alive connection may wait for its next request
 * (docs/protocol.md, "giving way"). No cap on its requests: a Node worker
 * serves its connections concurrently, and with every worker busy the
 * kernel spreads new ones over them, so a kept-alive client keeps nobody
 * waiting; a cap of 1000 only forced reconnections, each of which could
 * land on a busy worker while another stood idle (31,000-35,000 against
 * 55,000 requests a second kept alive, c=16, 16 workers).
 */
const KEEP_ALIVE_MS = 5000;

/**
 * How this process serves the pool: 'messages' (kernel dispatch, and
 * `order` and `shared`: it says `G`, accepts by itself and reports by
 * messages), 'none', or `{ refused: why }`.
 */
function servingPath(env = process.env) {
  const dispatch = env.FORKPOOL_DISPATCH;
  const use = 'run the pool in kernel dispatch (the default: no --dispatch), ' +
    'order, shared, or none';
  if (env.FORKPOOL_TEMPLATE_FD !== undefined) {
    return {
      refused: 'Node cannot fork a running process, so it cannot be a ' +
        '--preload template: run it without --preload',
    };
  }
  if (dispatch === undefined) {
    return {
      refused: 'not started by forkpool (FORKPOOL_DISPATCH is not set): ' +
        'run it as forkpool run -- node forkpool-node.js APP',
    };
  }
  if (dispatch === 'handoff' && env.FORKPOOL_KERNEL_DISPATCH === '1') {
    return 'messages';
  }
  // libuv accepts every waiting connection, not exactly one when told: it
  // says so (`G`), and the supervisor orders it nothing.
  if (dispatch === 'order' || dispatch === 'shared') {
    return 'messages';
  }
  if (dispatch === 'none') {
    return 'none';
  }
  const cannot = {
    handoff: 'it cannot receive descriptors',
  }[dispatch] || 'it does not know this mode';
  return { refused: `Node's public API cannot serve ${dispatch} dispatch (${cannot}): ${use}` };
}

/** Why this process cannot serve as a forkpool worker, or null. */
function refusal(env = process.env) {
  const path = servingPath(env);
  return typeof path === 'string' ? null : path.refused;
}

/** Exits with the reason when this process cannot serve (see refusal). */
function exitUnlessServable() {
  const why = refusal();
  if (why) {
    process.stderr.write(`forkpool-node: ${why}\n`);
    process.exit(2);
  }
}

/** `count` descriptors from `first`, or none when `first` is not a number. */
function fdsFrom(first, count) {
  const fd = Number(first);
  if (!Number.isInteger(fd) || fd < 0) {
    return [];
  }
  return Array.from({ length: count }, (_, i) => fd + i);
}

/** How many listeners the pool passed, if they are this process's. */
function listenerCount(env = process.env) {
  const count = Number(env.LISTEN_FDS || 0);
  return Number(env.LISTEN_PID) === process.pid && Number.isInteger(count) ? count : 0;
}

/**
 * The descriptors of the listeners passed to this process, in order: in
 * kernel dispatch the worker's own slot sockets.
 */
function listenerFds(env = process.env) {
  return fdsFrom(FIRST_FD, listenerCount(env));
}

/** In kernel dispatch, the pool's own listeners (the overflow), in order. */
function overflowFds(env = process.env) {
  return fdsFrom(env.FORKPOOL_OVERFLOW_FD, listenerCount(env));
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
 * socket the pool passes, until SIGTERM, or in kernel dispatch a `Q` or
 * end of file on the channel: then it stops accepting, lets the requests
 * in progress finish, closes idle kept-alive connections, and exits 0.
 * `options.server` goes to http.createServer. Returns the servers.
 */
function serve(handler, options = {}) {
  exitUnlessServable();
  const path = servingPath();
  const fds = listenerFds();
  if (fds.length === 0) {
    process.stderr.write('forkpool-node: no listeners passed (LISTEN_FDS)\n');
    process.exit(2);
  }
  const all = path === 'messages' ? fds.concat(overflowFds()) : fds;
  const servers = all.map((fd) => listen(fd, options.server || {}));
  const channel = path === 'messages'
    ? new Channel(Number(process.env.FORKPOOL_CHANNEL_FD), () => quitting.start())
    : null;
  const open = new messages.Connections();
  const quitting = gracefulQuit(servers, (exit) => {
    if (!channel) {
      exit();
      return;
    }
    // The last connection's I, if it still waits, so that it is counted.
    const idle = open.flush();
    if (idle) {
      channel.send(idle);
    }
    channel.close(exit);
  });
  if (channel) {
    servers.forEach((server) => reportConnections(server, channel, open));
    whenListening(servers, () => {
      channel.send(messages.ready(process.pid));
      channel.listen();
    });
  }
  // Last, so a request is counted before the handler can answer it.
  servers.forEach((server) => server.on('request', handler));
  process.once('SIGTERM', quitting.start);
  return servers;
}

/** An HTTP server listening on descriptor `fd`, idle keep-alive bounded. */
function listen(fd, serverOptions) {
  const server = http.createServer(serverOptions);
  server.keepAliveTimeout = KEEP_ALIVE_MS;
  // Node takes the backlog of an `{ fd }` listen only as the second
  // argument (an options field is ignored for a descriptor).
  server.listen({ fd }, backlog());
  return server;
}

/** Calls `then` once every server listens. */
function whenListening(servers, then) {
  let waiting = servers.length;
  for (const server of servers) {
    server.once('listening', () => {
      waiting -= 1;
      if (waiting === 0) {
        then();
      }
    });
  }
}

/**
 * Says `B`, `N` and `I` on `channel` as connections on `server` open and
 * close (messages.Connections). The last one's `I` goes at the end of the
 * event loop's turn, unless a connection opened meanwhile.
 */
function reportConnections(server, channel, open) {
  const flush = () => {
    const idle = open.flush();
    if (idle) {
      channel.send(idle);
    }
  };
  const closing = new WeakSet();
  // `now`: the connection is about to close (its last response is
  // written): say so at once, before its client can see the close and
  // connect again, so that its next connection finds this worker idle, as
  // a `K` worker's idle store before the close does.
  const ended = (socket, now) => {
    if (closing.has(socket)) {
      return;
    }
    closing.add(socket);
    const said = open.end();
    if (said) {
      channel.send(said);
    } else if (now) {
      flush();
    } else {
      setImmediate(flush);
    }
  };
  server.on('connection', (socket) => {
    const opened = open.start();
    if (opened) {
      channel.send(opened);
    }
    socket.once('close', () => ended(socket, false));
  });
  server.on('request', (req, res) => {
    res.once('finish', () => {
      if (!res.shouldKeepAlive) {
        ended(req.socket, true);
      }
    });
  });
}

/**
 * The graceful quit of `servers`: `start()` (idempotent) lets one more
 * turn of the event loop accept what is already queued, closes the
 * servers, lets the requests in progress finish (their responses say
 * `Connection: close`), closes idle kept-alive connections, then calls
 * `beforeExit` with the function that exits 0.
 */
function gracefulQuit(servers, beforeExit) {
  let started = false;
  const inProgress = new Set();
  for (const server of servers) {
    server.on('request', (req, res) => {
      inProgress.add(res);
      res.once('close', () => inProgress.delete(res));
      if (started) {
        res.setHeader('Connection', 'close');
      }
    });
  }
  const close = () => {
    let open = servers.length;
    const closed = () => {
      open -= 1;
      if (open === 0) {
        beforeExit(() => process.exit(0));
      }
    };
    for (const res of inProgress) {
      if (!res.headersSent) {
        res.setHeader('Connection', 'close');
      }
      // Once sent, its connection is idle: close it too.
      res.once('finish', () => setImmediate(() => {
        servers.forEach((server) => server.closeIdleConnections());
      }));
    }
    for (const server of servers) {
      server.close(closed);
      server.closeIdleConnections();
    }
  };
  return {
    start() {
      if (!started) {
        started = true;
        // The poll phase of the next turn accepts what is queued on the
        // sockets; the check phase after it closes them.
        setImmediate(() => setImmediate(close));
      }
    },
  };
}

module.exports = {
  serve,
  refusal,
  servingPath,
  exitUnlessServable,
  listenerFds,
  overflowFds,
  backlog,
};
