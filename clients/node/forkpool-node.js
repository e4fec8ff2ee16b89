#!/usr/bin/env node
'use strict';
// Runs an existing Node request handler as a forkpool worker:
//
//   forkpool run -- node forkpool-node.js app.js
//
// app.js exports the handler, `(req, res)` as http.createServer takes it:
// `module.exports = (req, res) => ...`, or `exports.handler = ...`.

const path = require('path');
const forkpool = require('./forkpool');

function loadHandler(file) {
  const app = require(path.resolve(file));
  const handler = typeof app === 'function' ? app : app && (app.handler || app.default);
  if (typeof handler !== 'function') {
    throw new Error(`${file} exports no request handler: ` +
      'set module.exports = (req, res) => { ... }');
  }
  return handler;
}

const file = process.argv[2];
if (!file) {
  process.stderr.write('usage: forkpool run -- node forkpool-node.js APP.js\n');
  process.exit(2);
}
// Before loading the app: a pool in a mode Node cannot serve hears why at once.
forkpool.exitUnlessServable();
forkpool.serve(loadHandler(file));
