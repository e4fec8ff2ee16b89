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

test('a busy period of k requests says B, k-1 N and I', () => {
  const requests = new messages.Requests();
  const said = [];
  const say = (message) => message && said.push(String.fromCharCode(message[1]));
  // Three overlapping requests, then one alone.
  say(requests.start());
  say(requests.start());
  say(requests.end());
  say(requests.start());
  say(requests.end());
  say(requests.end());
  say(requests.start());
  say(requests.end());
  assert.deepStrictEqual(said, ['B', 'N', 'N', 'I', 'B', 'I']);
  assert.strictEqual(requests.inProgress, 0);
});

test('an end without a start is a bug, not a message', () => {
  assert.throws(() => new messages.Requests().end(), /never started/);
});
