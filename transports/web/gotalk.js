/*
 * peerwire's browser library for Gotalk over WebSocket, for Node (20.10+, whose global
 * WebSocket needs --experimental-websocket before 22): `require()` this file; it exports the
 * object pages get as the global `gotalk`.
 *
 * The library itself is the parts gotalk.parts.json lists (gotalk-head.js first), joined in
 * that order into one script: what the peerwire server serves at <mount>gotalk.js and
 * <mount>peerwire.js (pages load it with <script src>). This file runs that same joined
 * text as Node runs a CommonJS file, in a function given `module`; line numbers in its stack
 * traces are those of the joined text.
 */
'use strict';
const fs = require('fs');
const path = require('path');
const vm = require('vm');

const parts = JSON.parse(fs.readFileSync(path.join(__dirname, 'gotalk.parts.json'), 'utf8'));
const text = parts.map((name) => fs.readFileSync(path.join(__dirname, name), 'utf8')).join('');
const filename = path.join(__dirname, 'gotalk.js (joined parts)');
vm.runInThisContext('(function (module) {' + text + '\n})', { filename: filename })(module);
