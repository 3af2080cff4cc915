/*
 * peerwire's browser library for Gotalk over WebSocket (protocol version 1).
 *
 * Written for peerwire from the protocol notes; it keeps the API that pages written for
 * gotalk.js use (gotalk.handle, gotalk.connection, sock.request, ...), so those pages can
 * talk to a peerwire server. Unlike gotalk.js it honours retry results ("e"): it waits the
 * given time and sends the request again.
 *
 * Plain ES2017, no build step. In a page it defines the global `gotalk`; under Node (20+,
 * with a global WebSocket) it is `module.exports`.
 *
 * Wire rules (what real browser peers need): "01" is sent first in a frame of its own; every
 * message header goes in its own binary frame and its payload in the next frame (text when
 * the payload is a JS string, binary otherwise). Received frames, text or binary, are read
 * as one byte stream, so merged or split frames work as well.
 *
 * The library is kept as parts, one job each, that make one script when joined in the order
 * gotalk.parts.json lists them (the peerwire server serves them joined; gotalk.js loads them
 * joined under Node): this head (the wrapper that opens the library's function, settings,
 * errors, addresses), gotalk-codec.js, gotalk-events.js, gotalk-stream.js,
 * gotalk-connection.js, gotalk-sock.js and gotalk-api.js (which closes the function). Parts
 * after this one are statements of that function: no part runs on its own.
 */
(function (root, factory) {
  'use strict';
  var script = typeof document !== 'undefined' ? document.currentScript : null;
  var gotalk = factory(script && script.src ? script.src : null);
  if (typeof module === 'object' && module && module.exports) {
    module.exports = gotalk;
  } else {
    root.gotalk = gotalk;
  }
})(typeof globalThis !== 'undefined' ? globalThis : this, function (scriptUrl) {
  'use strict';

  const HEARTBEAT_INTERVAL = 20000; // ms; Go peers drop a peer silent for 30 s
  // A server that has sent heartbeats and then nothing at all for this many of its (or our)
  // heartbeat intervals is taken for dead: the connection closes with a timeout error.
  const SILENT_BEATS = 3;
  const CONNECT_TIMEOUT = 10000; // ms for the WebSocket handshake and the server's "01"
  // Reconnect delays: a random time up to the bound (full jitter), the bound doubled per
  // failure from BACKOFF_FIRST to BACKOFF_MAX; after a protocol error, BACKOFF_MAX/2 to
  // BACKOFF_MAX. The bound drops back to BACKOFF_FIRST only after a connection that served
  // us (a message other than a heartbeat, or one heartbeat interval up): a server that
  // accepts and closes at once is not hit every 0.5 s.
  const BACKOFF_FIRST = 500;
  const BACKOFF_MAX = 5000;
  const MAX_RETRIES = 5; // retry results honoured per request before giving up
  // The message of the retry result a peerwire server closing gracefully answers a request
  // with that came during its drain (not run; rpc.errors.CLOSING): sent again on that
  // connection it would only be refused again, so it fails once the connection closes.
  const CLOSING = 'connection closing: not run';
  const MAX_TIMER = 0x7fffffff; // ms: setTimeout fires at once for longer delays
  /** A setting's delay as timers take it: over MAX_TIMER (24.8 days) is MAX_TIMER. */
  function timerDelay(ms) {
    return Math.min(ms, MAX_TIMER);
  }
  // Sent as a query parameter at connect so a peerwire server knows we understand retry
  // results ("e"); other servers (Go gotalk) ignore the query; real gotalk.js never sends it.
  const RETRY_FLAG = 'peerwire-retry';
  function withRetryFlag(address) {
    const url = new URL(address);
    url.searchParams.set(RETRY_FLAG, '1');
    return url.href;
  }
  const MAX_MESSAGE_SIZE = 16 * 1024 * 1024; // largest payload accepted from the server
  // Stream requests from the server the page refused, remembered so their late parts are
  // dropped (as the Python side's ENDED_STREAMS); past it the oldest is forgotten, and a
  // part of it is one of an unknown stream: a protocol error that closes the connection.
  const REFUSED_STREAMS = 256;
  const SEND_BUFFER_LIMIT = 100; // messages queued while the WebSocket is still connecting
  const SINGLE_IDS = 36 * 36 * 36 * 36; // "0000".."zzzz"
  const STREAM_IDS = 36 * 36 * 36; // "!000".."!zzz"
  const CONNECTING = 0;
  const OPEN = 1;

  // Protocol error codes (the "f" message).
  const ERR_ABNORMAL = 0;
  const ERR_UNSUPPORTED = 1;
  const ERR_INVALID = 2;
  const ERR_TIMEOUT = 3;

  const encoder = new TextEncoder();
  // ignoreBOM: a leading U+FEFF is text like any other (names, error texts, utf8.decode)
  const decoder = new TextDecoder('utf-8', { ignoreBOM: true });
  const EMPTY = new Uint8Array(0);

  // --- errors and addresses -----------------------------------------------------------------

  /**
   * The text of an error result: an Error's message, a string as it is, other values as
   * JSON, or String(value) for those without JSON form (a BigInt, a circular object, a
   * Symbol, undefined): building it never throws, so a request is always answered.
   */
  function errorText(err) {
    let value = err;
    try {
      if (err instanceof Error) value = err.message || String(err);
    } catch (e) {
      return 'error'; // a message getter or toString that throws
    }
    if (typeof value === 'string') return value;
    try {
      const json = JSON.stringify(value);
      if (json !== undefined) return json;
    } catch (e) {
      // no JSON form (BigInt, circular): its String below
    }
    try {
      return String(value);
    } catch (e) {
      return 'error'; // an object without toString (Object.create(null))
    }
  }

  function protocolError(code, message) {
    const err = new Error('gotalk protocol error: ' + message);
    err.isGotalkProtocolError = true;
    err.code = code;
    return err;
  }

  function remoteError(message, extra) {
    const err = new Error(message);
    Object.assign(err, extra || {});
    return err;
  }

  /** ws://host/mount/ for a script served at http://host/mount/gotalk.js. */
  function addressFromScript(src) {
    if (!src || typeof URL === 'undefined') return null;
    try {
      const url = new URL(src);
      if (url.protocol !== 'http:' && url.protocol !== 'https:') return null;
      url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
      url.pathname = url.pathname.replace(/[^/]*$/, '');
      url.search = '';
      url.hash = '';
      return url.href;
    } catch (e) {
      return null;
    }
  }

  /** Absolute ws(s):// address; relative ones resolve against the page's location. */
  function resolveAddress(addr) {
    if (/^wss?:\/\//i.test(addr) || typeof location === 'undefined') return addr;
    const url = new URL(addr, location.href);
    url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
    return url.href;
  }
