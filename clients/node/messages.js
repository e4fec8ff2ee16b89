'use strict';
// The back-channel's messages (docs/protocol.md, "Message format") and the
// busy/idle bookkeeping of the messages path of kernel dispatch, without
// any I/O: channel.js reads and writes, this file decides what to say.

const VERSION = 0x01;

/** A 6-byte message: the kind letter and the u32 `n`, big-endian. */
function withNumber(kind, n) {
  const message = Buffer.alloc(6);
  message[0] = VERSION;
  message[1] = kind.charCodeAt(0);
  message.writeUInt32BE(n, 2);
  return message;
}

/** `G` (ready, by messages), carrying the worker's `pid`. */
function ready(pid) {
  return withNumber('G', pid);
}

/** `P` (pong), answering a ping of sequence number `seq`. */
function pong(seq) {
  return withNumber('P', seq);
}

/** A 2-byte message of one kind letter: `B`, `N` or `I`. */
function bare(kind) {
  return Buffer.from([VERSION, kind.charCodeAt(0)]);
}

const BUSY = bare('B');
const NEXT = bare('N');
const IDLE = bare('I');
const LEAVING = bare('X');

/**
 * What one datagram from the supervisor says: `{ kind: 'ping', seq }`,
 * `{ kind: 'quit' }` (a `Q`, or end of file: a read of 0 bytes), or
 * `{ kind: 'unknown' }` for anything this worker is never sent.
 */
function parse(bytes) {
  if (bytes.length === 0) {
    return { kind: 'quit' };
  }
  if (bytes[0] === VERSION && bytes[1] === 0x70 && bytes.length === 6) {
    return { kind: 'ping', seq: bytes.readUInt32BE(2) };
  }
  if (bytes[0] === VERSION && bytes[1] === 0x51 && bytes.length === 2) {
    return { kind: 'quit' };
  }
  return { kind: 'unknown' };
}

/**
 * Connections open, and the message each change calls for: over a busy
 * period of k connections the supervisor hears `B`, k-1 `N` and `I`, so
 * it counts k accepted and k served. A kept-alive connection holds its
 * worker as it would any forkpool worker, so new clients go to idle
 * workers, and with none idle the kernel spreads them over the busy
 * ones' sockets, where Node serves them beside the others.
 *
 * The `I` of the last connection waits for `flush()`, which the worker
 * calls at the end of the event loop's turn: a connection accepted before
 * then (the same turn's) turns the `I` and its `B` into one `N`, since
 * the worker never waited in between.
 */
class Connections {
  constructor() {
    this.inProgress = 0;
    this.idlePending = false;
  }

  /** A connection opens: `B` if none was open, `N` if an `I` waits. */
  start() {
    this.inProgress += 1;
    if (this.inProgress > 1) {
      return null;
    }
    if (this.idlePending) {
      this.idlePending = false;
      return NEXT;
    }
    return BUSY;
  }

  /**
   * A connection closes: `N` if others are still open; if it was the
   * last, nothing yet: the `I` waits for `flush()`.
   */
  end() {
    if (this.inProgress === 0) {
      throw new Error('a connection closed that never opened');
    }
    this.inProgress -= 1;
    if (this.inProgress > 0) {
      return NEXT;
    }
    this.idlePending = true;
    return null;
  }

  /** The `I` that waits, if one does (then no longer). */
  flush() {
    if (!this.idlePending) {
      return null;
    }
    this.idlePending = false;
    return IDLE;
  }
}

module.exports = { ready, pong, parse, Connections, BUSY, NEXT, IDLE, LEAVING };
