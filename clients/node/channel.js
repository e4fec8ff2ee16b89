'use strict';
// The worker's end of the back-channel, with Node's public API only: the
// channel is a SOCK_SEQPACKET socket, which `net.Socket` refuses, but
// one read(2) of it returns one whole message and one write(2) sends
// one, so `fs.read` and `fs.writeSync` on its descriptor are enough
// (docs/protocol.md, "Transport").
//
// The channel is blocking: each `fs.read` waits in a thread of libuv's
// pool (one of its four, for the worker's whole life), and the event
// loop hears of the message when it returns. Node cannot exit while
// that thread is in read(2) (process.exit joins the pool), and nothing
// public interrupts it: so the worker reads nothing more once told to
// quit, and when it quits on its own (SIGTERM) it says `X`, which makes
// the supervisor shut the channel down and the read return.

const fs = require('fs');
const messages = require('./messages');

/** Errors of a write to a supervisor that has gone: end of file. */
const GONE = new Set(['EPIPE', 'ECONNRESET', 'EBADF']);

class Channel {
  /**
   * The channel at descriptor `fd`. `onQuit` is called once, on `Q`, end
   * of file, or a write the supervisor is no longer there to read.
   */
  constructor(fd, onQuit) {
    this.fd = fd;
    this.onQuit = onQuit;
    this.quitting = false;
    // The supervisor's end is closed: nothing more can be said.
    this.gone = false;
    this.reading = false;
    // Called when the last read returns, once quitting.
    this.afterRead = () => {};
  }

  /** Sends one message (a Buffer): one write(2), one datagram. */
  send(message) {
    if (this.gone) {
      return;
    }
    try {
      fs.writeSync(this.fd, message);
    } catch (err) {
      if (!GONE.has(err.code)) {
        throw err;
      }
      this.gone = true;
      this.quit();
    }
  }

  /**
   * Reads messages one at a time until `Q` or end of file, and none
   * after the worker began to quit.
   */
  listen() {
    const buffer = Buffer.alloc(64);
    const next = () => {
      this.reading = true;
      fs.read(this.fd, buffer, 0, buffer.length, null, (err, n) => {
        this.reading = false;
        const message = err ? { kind: 'quit' } : messages.parse(buffer.subarray(0, n));
        if (message.kind === 'ping') {
          this.send(messages.pong(message.seq));
        } else if (message.kind === 'quit') {
          this.quit();
        } else {
          // docs/protocol.md: a child that reads what it does not
          // understand does not guess; it says so and exits, and the
          // supervisor replaces it. (No read is pending here, so it can.)
          const hex = buffer.subarray(0, n).toString('hex');
          process.stderr.write(`forkpool-node: a message it is never sent: ${hex}; exiting\n`);
          process.exit(1);
        }
        if (this.quitting) {
          this.afterRead();
        } else {
          next();
        }
      });
    };
    next();
  }

  /**
   * Calls `then` once no read is in progress, so that the process can
   * exit: at once if none is, else after saying `X` (leaving), which the
   * supervisor answers by shutting the channel down.
   */
  close(then) {
    if (!this.reading) {
      then();
      return;
    }
    this.afterRead = then;
    this.send(messages.LEAVING);
  }

  /** Tells the worker to quit, once. */
  quit() {
    if (!this.quitting) {
      this.quitting = true;
      this.onQuit();
    }
  }
}

module.exports = { Channel };
