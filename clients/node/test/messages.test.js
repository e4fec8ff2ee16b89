'use strict';
// Unit tests of the messages path's bookkeeping (messages.js), without a
// supervisor: `node --test clients/node/test` (run by
// crates/forkpool-cli/tests/node.rs).

const test = require('node:test');
const assert = require('node:assert');
const messages = require('../messages');

const hex = (buffer) => (buffer ? buffer.toString('hex') : null);

test('G carries the pid, big-endian, in 6 bytes', () => {
  assert.strictEqual(hex(messages.ready(123456)), '014700' + '01e240');
});

test('a pong echoes the ping sequence number', () => {
  const ping = Buffer.from('0170deadbeef', 'hex');
  const parsed = messages.parse(ping);
  assert.deepStrictEqual(parsed, { kind: 'ping', seq: 0xdeadbeef });
  assert.strictEqual(hex(messages.pong(parsed.seq)), '0150deadbeef');
});

test('Q and end of file both mean quit; anything else is unknown', () => {
  assert.deepStrictEqual(messages.parse(Buffer.from('0151', 'hex')), { kind: 'quit' });
  assert.deepStrictEqual(messages.parse(Buffer.alloc(0)), { kind: 'quit' });
  for (const other of ['0143', '01410000', '0151ff', '0270deadbeef', '01700000']) {
    assert.deepStrictEqual(messages.parse(Buffer.from(other, 'hex')), { kind: 'unknown' }, other);
  }
});

/** Says what `open` answers to each step: `s`tart, `e`nd, `f`lush. */
function said(open, steps) {
  const letters = [];
  for (const step of steps) {
    const action = { s: 'start', e: 'end', f: 'flush' }[step];
    const message = open[action]();
    if (message) {
      letters.push(String.fromCharCode(message[1]));
    }
  }
  return letters.join('');
}

test('a busy period of k connections says B, k-1 N and I', () => {
  const open = new messages.Connections();
  // Three overlapping connections, the turn's end, then one alone.
  assert.strictEqual(said(open, 'ssesee' + 'f' + 'sef'), 'BNNI' + 'BI');
  assert.strictEqual(open.inProgress, 0);
});

test('a connection that opens before the turn ends turns I and B into N', () => {
  const open = new messages.Connections();
  assert.strictEqual(said(open, 'sesef'), 'BNI');
  // Flushing again says nothing: the I was said once.
  assert.strictEqual(said(open, 'ff'), '');
});

test('an end without a start is a bug, not a message', () => {
  assert.throws(() => new messages.Connections().end(), /never opened/);
});
