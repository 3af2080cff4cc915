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
  // Sent as a query parameter at connect so a peerwire server knows we understand retry
  // results ("e"); other servers (Go gotalk) ignore the query; real gotalk.js never sends it.
  const RETRY_FLAG = 'peerwire-retry';
  function withRetryFlag(address) {
    const url = new URL(address);
    url.searchParams.set(RETRY_FLAG, '1');
    return url.href;
  }
  const MAX_MESSAGE_SIZE = 16 * 1024 * 1024; // largest payload accepted from the server
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
  const decoder = new TextDecoder('utf-8');
  const EMPTY = new Uint8Array(0);

  // --- small helpers ------------------------------------------------------------------------

  /** UTF-8 byte length of a JS string, counted without encoding it (lone surrogates = 3). */
  function utf8Length(s) {
    let n = 0;
    for (let i = 0; i < s.length; i++) {
      const c = s.charCodeAt(i);
      if (c < 0x80) n += 1;
      else if (c < 0x800) n += 2;
      else if (c >= 0xd800 && c < 0xdc00 && i + 1 < s.length &&
               (s.charCodeAt(i + 1) & 0xfc00) === 0xdc00) {
        n += 4;
        i++;
      } else n += 3;
    }
    return n;
  }

  function pad(s, digits) {
    return s.length >= digits ? s : '0'.repeat(digits - s.length) + s;
  }

  /** Write `n` as `digits` lowercase hex digits into `out` at `pos`; returns the new pos. */
  function putHex(out, pos, n, digits) {
    for (let i = digits - 1; i >= 0; i--) {
      const d = n % 16;
      out[pos + i] = d < 10 ? 0x30 + d : 0x57 + d;
      n = Math.floor(n / 16);
    }
    return pos + digits;
  }

  /** Parse `len` hex digits (either case) at `pos`; -1 when one is not a hex digit. */
  function readHex(bytes, pos, len) {
    let n = 0;
    for (let i = pos; i < pos + len; i++) {
      const b = bytes[i];
      let d;
      if (b >= 0x30 && b <= 0x39) d = b - 0x30;
      else if (b >= 0x61 && b <= 0x66) d = b - 0x57;
      else if (b >= 0x41 && b <= 0x46) d = b - 0x37;
      else return -1;
      n = n * 16 + d;
    }
    return n;
  }

  function latin1(bytes) {
    return String.fromCharCode.apply(null, bytes);
  }

  function ascii(s) {
    const out = new Uint8Array(s.length);
    for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i) & 0xff;
    return out;
  }

  /** A raw payload: a string (sent as text), a Uint8Array, or null for an empty payload. */
  function rawPayload(value) {
    if (value === null || value === undefined) return null;
    if (typeof value === 'string' || value instanceof Uint8Array) return value;
    if (value instanceof ArrayBuffer) return new Uint8Array(value);
    if (ArrayBuffer.isView(value)) {
      return new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
    }
    return jsonPayload(value);
  }

  function payloadSize(payload) {
    if (payload === null) return 0;
    return typeof payload === 'string' ? utf8Length(payload) : payload.length;
  }

  /** JSON text of `value` (undefined is null); throws a TypeError when it has none. */
  function jsonPayload(value) {
    const json = JSON.stringify(value === undefined ? null : value);
    if (json === undefined) {
      throw new TypeError('gotalk: a ' + typeof value + ' value cannot be sent as JSON');
    }
    return json;
  }

  function decodeJSON(bytes) {
    return bytes.length ? JSON.parse(decoder.decode(bytes)) : null;
  }

  function errorText(err) {
    if (err instanceof Error) return err.message || String(err);
    return typeof err === 'string' ? err : JSON.stringify(err);
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

  // --- events -------------------------------------------------------------------------------

  class EventEmitter {
    on(event, fn) {
      if (!this._events) this._events = {};
      (this._events[event] || (this._events[event] = [])).push(fn);
      return this;
    }

    once(event, fn) {
      const wrapper = (...args) => {
        this.removeListener(event, wrapper);
        fn.apply(this, args);
      };
      return this.on(event, wrapper);
    }

    removeListener(event, fn) {
      const list = this._events && this._events[event];
      if (list) {
        const i = list.indexOf(fn);
        if (i !== -1) list.splice(i, 1);
      }
      return this;
    }

    removeListeners(event) {
      if (this._events) delete this._events[event];
      return this;
    }

    removeAllListeners() {
      this._events = {};
      return this;
    }

    emit(event, ...args) {
      const list = this._events && this._events[event];
      if (!list) return;
      for (const fn of list.slice()) {
        try {
          fn.apply(this, args);
        } catch (err) {
          setTimeout(() => { throw err; }, 0); // report, but keep the socket going
        }
      }
    }
  }
  EventEmitter.prototype.addListener = EventEmitter.prototype.on;
  EventEmitter.prototype.off = EventEmitter.prototype.removeListener;

  // --- handlers -----------------------------------------------------------------------------

  /** Operations and notifications this side answers; the empty name is the fallback. */
  class Handlers {
    constructor() {
      this._requests = new Map();
      this._notifications = new Map();
    }

    handleRequest(op, fn) {
      this._requests.set(op, { fn: fn, buffer: false });
    }

    handleBufferRequest(op, fn) {
      this._requests.set(op, { fn: fn, buffer: true });
    }

    handleNotification(name, fn) {
      this._notifications.set(name, { fn: fn, buffer: false });
    }

    handleBufferNotification(name, fn) {
      this._notifications.set(name, { fn: fn, buffer: true });
    }

    _request(op) {
      return this._requests.get(op) || this._requests.get('') || null;
    }

    _notification(name) {
      return this._notifications.get(name) || this._notifications.get('') || null;
    }

    findRequestHandler(op) {
      const entry = this._request(op);
      return entry ? entry.fn : null;
    }

    findNotificationHandler(name) {
      const entry = this._notification(name);
      return entry ? entry.fn : null;
    }
  }
  Handlers.prototype.handle = Handlers.prototype.handleRequest;

  // --- reading: a byte queue and the message header parser ----------------------------------

  /** Received bytes as a list of chunks; taking n bytes copies only when chunks are split. */
  class ByteQueue {
    constructor() {
      this.chunks = [];
      this.length = 0;
    }

    push(bytes) {
      if (bytes.length) {
        this.chunks.push(bytes);
        this.length += bytes.length;
      }
    }

    peek(n) {
      if (n === 0) return EMPTY;
      const first = this.chunks[0];
      if (first.length >= n) return first.subarray(0, n);
      const out = new Uint8Array(n);
      let off = 0;
      for (const chunk of this.chunks) {
        const k = Math.min(chunk.length, n - off);
        out.set(chunk.subarray(0, k), off);
        off += k;
        if (off === n) break;
      }
      return out;
    }

    take(n) {
      const out = this.peek(n);
      this.length -= n;
      while (n > 0) {
        const chunk = this.chunks[0];
        if (chunk.length <= n) {
          this.chunks.shift();
          n -= chunk.length;
        } else {
          this.chunks[0] = chunk.subarray(n);
          n = 0;
        }
      }
      return out;
    }
  }

  // Header layouts by type byte: has a 4-byte id, has a text3 name, has wait8, has size8.
  const LAYOUTS = {
    r: { id: true, name: true },
    s: { id: true, name: true },
    p: { id: true },
    R: { id: true },
    S: { id: true },
    E: { id: true },
    e: { id: true, wait: true },
    n: { name: true },
  };

  /**
   * Take the header of the next message from `queue`: null when more bytes are needed.
   * Throws a protocol error for an unknown type, bad hex or a payload over `maxSize`.
   */
  function readHeader(queue, maxSize) {
    const type = String.fromCharCode(queue.peek(1)[0]);
    if (type === 'h' || type === 'f') {
      const length = type === 'h' ? 13 : 9;
      if (queue.length < length) return null;
      const b = queue.take(length);
      const load = type === 'h' ? readHex(b, 1, 4) : 0;
      const n = readHex(b, length - 8, 8);
      if (load < 0 || n < 0) throw protocolError(ERR_INVALID, 'malformed ' + type + ' message');
      return type === 'h' ? { type: type, load: load, time: n, size: 0 }
                          : { type: type, code: n, size: 0 };
    }
    const layout = LAYOUTS[type];
    if (!layout) throw protocolError(ERR_INVALID, 'unknown message type ' + JSON.stringify(type));
    const idEnd = 1 + (layout.id ? 4 : 0);
    let nameLength = 0;
    if (layout.name) {
      if (queue.length < idEnd + 3) return null;
      nameLength = readHex(queue.peek(idEnd + 3), idEnd, 3);
      if (nameLength < 0) throw protocolError(ERR_INVALID, 'malformed name size');
    }
    const nameEnd = idEnd + (layout.name ? 3 + nameLength : 0);
    const length = nameEnd + (layout.wait ? 8 : 0) + 8;
    if (queue.length < length) return null;
    const b = queue.take(length);
    const header = { type: type, size: readHex(b, length - 8, 8) };
    if (layout.id) header.id = latin1(b.subarray(1, 5));
    if (layout.name) header.name = decoder.decode(b.subarray(idEnd + 3, nameEnd));
    if (layout.wait) header.wait = readHex(b, nameEnd, 8);
    if (header.size < 0 || header.wait < 0) {
      throw protocolError(ERR_INVALID, 'malformed ' + type + ' header');
    }
    if (header.size > maxSize) {
      throw protocolError(ERR_INVALID, 'payload of ' + header.size + ' bytes is over the limit');
    }
    return header;
  }

  /** One message header as bytes: type, optional id (latin1 string), name, wait, size. */
  function makeHeader(type, id, name, wait, size) {
    const nameBytes = name === null ? null : encoder.encode(name);
    if (nameBytes && nameBytes.length > 0xfff) throw new Error('gotalk: name too long: ' + name);
    const length = 1 + (id === null ? 0 : 4) + (nameBytes ? 3 + nameBytes.length : 0) +
                   (wait === null ? 0 : 8) + 8;
    const out = new Uint8Array(length);
    let pos = 0;
    out[pos++] = type.charCodeAt(0);
    if (id !== null) {
      for (let i = 0; i < 4; i++) out[pos++] = id.charCodeAt(i) & 0xff;
    }
    if (nameBytes) {
      pos = putHex(out, pos, nameBytes.length, 3);
      out.set(nameBytes, pos);
      pos += nameBytes.length;
    }
    if (wait !== null) pos = putHex(out, pos, wait, 8);
    putHex(out, pos, size, 8);
    return out;
  }

  // --- stream requests ----------------------------------------------------------------------

  /**
   * A stream request: `write(value)` sends a part (strings and bytes raw, other values as
   * JSON; an empty value ends it), `end()` ends it. Events: `data` (each result part, a
   * Uint8Array), `end` (the result is complete), `error`, and `close` (error or null).
   */
  class StreamRequest extends EventEmitter {
    constructor(sock, op, id) {
      super();
      this.sock = sock;
      this.op = op;
      this.id = id;
      this._started = false;
      this._ended = false;
      this._finished = false;
    }

    write(value) {
      if (this._ended) return;
      const payload = rawPayload(value);
      if (payloadSize(payload) === 0) this.end();
      else this._send(payload);
    }

    end() {
      if (this._ended) return;
      if (!this._started && !this._send(null)) return;
      this._ended = true;
      this.sock._sendMessage(makeHeader('p', this.id, null, null, 0), null);
    }

    /** Send the first part (as the `s` message) or a next one; false if the socket is down. */
    _send(payload) {
      const sock = this.sock;
      if (!sock._canSend()) {
        this._ended = true;
        setTimeout(() => this._finish(new Error('socket is closed')), 0);
        return false;
      }
      const size = payloadSize(payload);
      if (!this._started) {
        const header = makeHeader('s', this.id, this.op, null, size); // may throw: not pending
        this._started = true;
        sock._pending.set(this.id, this);
        sock._sendMessage(header, payload);
      } else {
        sock._sendMessage(makeHeader('p', this.id, null, null, size), payload);
      }
      return true;
    }

    // called by the socket
    _result(type, payload) {
      if (type === 'S' && payload.length === 0) {
        this._finish(null);
        return;
      }
      this.emit('data', payload);
      if (type === 'R') this._finish(null);
    }

    _fail(err) {
      this._finish(err);
    }

    _finish(err) {
      if (this._finished) return;
      this._finished = true;
      this._ended = true;
      this.sock._settled(this.id, this);
      if (err) this.emit('error', err);
      else this.emit('end');
      this.emit('close', err);
    }
  }

  // --- the socket ---------------------------------------------------------------------------

  let defaultHandlers = new Handlers();

  /**
   * One connection to a gotalk responder. `open()` connects once; `openKeepAlive()` stays
   * connected, reconnecting after random delays of up to 500 ms, then 1, 2, 4 and 5 s.
   * Events: `open` (the socket), `close` (an Error, or null after a normal close),
   * `heartbeat` ({time, load}) and `retry` ({op, wait, message, attempt}).
   */
  class Sock extends EventEmitter {
    constructor(handlers) {
      super();
      this.handlers = handlers || defaultHandlers;
      this.ws = null;
      this.heartbeatInterval = HEARTBEAT_INTERVAL;
      this.connectTimeout = CONNECT_TIMEOUT;
      this.requestTimeout = 0; // ms per request, retries included; 0: no limit
      this.maxRetries = MAX_RETRIES;
      this.maxMessageSize = MAX_MESSAGE_SIZE;
      this.sendBufferLimit = SEND_BUFFER_LIMIT;
      this._address = null;
      this._pending = new Map(); // our request id -> call or StreamRequest
      this._refusedStreams = new Set(); // stream requests from the server we answered with E
      this._nextId = 0;
      this._nextStreamId = 0;
      this._keepAlive = false;
      this._backoff = BACKOFF_FIRST;
      this._reconnectTimer = null;
      this._heartbeatTimer = null;
      this._connectTimer = null;
      this._ending = false;
      this._userClosed = false;
      this._onconnect = null;
      this._resetConnectionState();
    }

    _resetConnectionState() {
      this._rx = new ByteQueue();
      this._header = null;
      this._versionOk = false;
      this._queued = [];
      this._queuedMessages = 0;
      this._opened = false;
      this._error = null;
      this._refusedStreams.clear();
      // liveness and back-off, per connection
      this._openedAt = 0;
      this._served = false; // the server sent a message other than a heartbeat
      this._lastReceived = 0; // Date.now() of the last frame
      this._lastTick = 0;
      this._silence = 0; // ms without frames, counted by heartbeat ticks
      this._lastBeat = 0; // Date.now() of the server's last heartbeat (the open before one)
      this._beatGap = -1; // longest gap seen between the server's heartbeats; -1: none yet
    }

    get isOpen() {
      return this.ws !== null && this._opened && this.ws.readyState === OPEN;
    }

    address() {
      return this._address;
    }

    // --- connecting ---

    open(addr, onconnect) {
      if (typeof addr === 'function') {
        onconnect = addr;
        addr = undefined;
      }
      const target = addr || gotalk.defaultResponderAddress;
      if (!target) {
        throw new Error('gotalk: no address given and gotalk.defaultResponderAddress is not set');
      }
      this._address = resolveAddress(target);
      this._onconnect = typeof onconnect === 'function' ? onconnect : null;
      this._userClosed = false;
      this._ending = false;
      this._connect();
      return this;
    }

    openKeepAlive(addr) {
      this._keepAlive = true;
      this._backoff = BACKOFF_FIRST;
      return this.open(addr);
    }

    _connect() {
      if (this.ws) return;
      const WS = gotalk.WebSocket || (typeof WebSocket !== 'undefined' ? WebSocket : null);
      if (!WS) throw new Error('gotalk: no WebSocket here (Node needs --experimental-websocket)');
      let ws;
      try {
        ws = new WS(withRetryFlag(this._address));
      } catch (err) {
        setTimeout(() => this._connectFailed(err), 0);
        return;
      }
      this._resetConnectionState();
      ws.binaryType = 'arraybuffer';
      this.ws = ws;
      // Armed after the caller's synchronous code, so `sock.connectTimeout = ...` right after
      // gotalk.open() / gotalk.connection() applies to the first attempt.
      Promise.resolve().then(() => this._armConnectTimer(ws));
      ws.onopen = () => this._onOpen(ws);
      ws.onmessage = (event) => this._onFrame(ws, event.data);
      ws.onerror = () => {
        if (ws !== this.ws) return;
        if (!this._error) this._error = new Error('WebSocket error');
        // A failed handshake: browsers follow with a close event, Node 20 does not.
        if (!this._opened) this._lost(ws, new Error('cannot connect to ' + this._address));
      };
      ws.onclose = (event) => this._onClose(ws, event);
    }

    /** Fail the attempt unless the handshake and the server's "01" come within the limit. */
    _armConnectTimer(ws) {
      const timeout = this.connectTimeout;
      if (ws !== this.ws || this._versionOk || !(timeout > 0)) return;
      this._connectTimer = setTimeout(() => {
        this._connectTimer = null;
        if (ws !== this.ws || this._versionOk) return;
        const message = 'no answer from ' + this._address + ' within ' + timeout + ' ms';
        if (this._opened) {
          this._protocolFailure(ws, protocolError(ERR_TIMEOUT, message), true);
          return;
        }
        const err = new Error('gotalk: cannot connect: ' + message);
        err.timeout = true;
        this._error = err;
        this._lost(ws, err);
        try {
          ws.close();
        } catch (e) {
          // already closing
        }
      }, timeout);
    }

    _connectFailed(err) {
      const cb = this._onconnect;
      this._onconnect = null;
      if (cb) cb(err, this);
      if (this._keepAlive && !this._userClosed) this._scheduleReconnect(err);
    }

    _onOpen(ws) {
      if (ws !== this.ws) return;
      this._opened = true;
      this._openedAt = this._lastTick = this._lastBeat = Date.now();
      ws.send(ascii('01'));
      const queued = this._queued;
      this._queued = [];
      this._queuedMessages = 0;
      for (const frame of queued) ws.send(frame);
      if (this.heartbeatInterval > 0) {
        this._heartbeatTimer = setInterval(() => this._tick(ws), this.heartbeatInterval);
      }
      this.emit('open', this);
      const cb = this._onconnect;
      this._onconnect = null;
      if (cb) cb(null, this);
    }

    _onClose(ws, event) {
      let err = this._error;
      if (!err && event.code !== 1000 && event.code !== 1001) {
        err = new Error('connection closed (code ' + event.code +
                        (event.reason ? ': ' + event.reason : '') + ')');
      }
      this._lost(ws, err);
    }

    /**
     * The heartbeat tick: send ours, and close when a server that sends heartbeats has sent
     * nothing for SILENT_BEATS times the longer of our interval and the longest gap between
     * its heartbeats. Each tick counts at most one interval of silence, so a tab whose timers
     * were throttled or that slept does not count the time it was away.
     */
    _tick(ws) {
      if (ws !== this.ws) return;
      const now = Date.now();
      const interval = this.heartbeatInterval;
      const since = Math.max(this._lastTick, this._lastReceived);
      this._silence += Math.max(0, Math.min(now - since, interval));
      this._lastTick = now;
      const limit = SILENT_BEATS * Math.max(interval, this._beatGap);
      if (this._beatGap >= 0 && this._silence >= limit) {
        this._protocolFailure(ws, protocolError(
          ERR_TIMEOUT, 'timeout: nothing from the server for ' + this._silence + ' ms'), true);
        return;
      }
      this.sendHeartbeat(0);
    }

    /** The connection `ws` is gone: reject what is pending, emit close, maybe reconnect. */
    _lost(ws, err) {
      if (ws !== this.ws) return;
      const wasOpen = this._opened;
      if (wasOpen && (this._served || Date.now() - this._openedAt >=
                      (this.heartbeatInterval > 0 ? this.heartbeatInterval : HEARTBEAT_INTERVAL))) {
        this._backoff = BACKOFF_FIRST; // it served us: a reconnect is not a storm
      }
      this.ws = null;
      this._opened = false;
      clearInterval(this._heartbeatTimer);
      this._heartbeatTimer = null;
      clearTimeout(this._connectTimer);
      this._connectTimer = null;
      ws.onopen = ws.onmessage = ws.onerror = ws.onclose = null;
      const reason = err || new Error('socket is closed');
      const pending = Array.from(this._pending.values());
      this._pending.clear();
      for (const call of pending) call._fail(reason);
      if (wasOpen) {
        this.emit('close', err || null);
      } else {
        const cb = this._onconnect;
        this._onconnect = null;
        if (cb) cb(err || new Error('connection failed'), this);
      }
      if (this._keepAlive && !this._userClosed) this._scheduleReconnect(err);
    }

    /** Reconnect after a random delay (see BACKOFF_FIRST): many tabs do not come in step. */
    _scheduleReconnect(err) {
      if (this._reconnectTimer !== null) return;
      let delay;
      if (err && err.isGotalkProtocolError && err.code !== ERR_TIMEOUT) {
        // the server does not want us (a version it does not speak, input it rejects):
        // trying again soon would only repeat that, as gotalk.js waits its longest delay
        this._backoff = BACKOFF_MAX;
        delay = BACKOFF_MAX * (0.5 + Math.random() / 2);
      } else {
        delay = this._backoff * Math.random();
        this._backoff = Math.min(this._backoff * 2, BACKOFF_MAX);
      }
      this._reconnectTimer = setTimeout(() => {
        this._reconnectTimer = null;
        if (this._keepAlive && !this._userClosed) this._connect();
      }, delay);
    }

    /** Close now: pending requests are rejected and keep-alive stops. */
    close() {
      this._keepAlive = false;
      this._userClosed = true;
      clearTimeout(this._reconnectTimer);
      this._reconnectTimer = null;
      const ws = this.ws;
      if (ws) {
        this._lost(ws, null);
        try {
          ws.close(1000);
        } catch (e) {
          // already closing
        }
      }
      return this;
    }

    /** Close once pending requests are answered (a second call closes at once). */
    end() {
      if (this._ending || this._pending.size === 0) return this.close();
      this._ending = true;
      this._keepAlive = false;
      return this;
    }

    _settled(id, call) {
      if (this._pending.get(id) === call) this._pending.delete(id);
      if (this._ending && this._pending.size === 0) this.close();
    }

    /** Send f0000000<code>, then close: for input we cannot make sense of, or a timeout. */
    _protocolFailure(ws, err, timeout) {
      if (timeout) err.timeout = true;
      this._error = err;
      try {
        ws.send(ascii('f' + pad(err.code.toString(16), 8)));
        ws.close(4000 + err.code, err.message.slice(0, 100));
      } catch (e) {
        // already closing
      }
      this._lost(ws, err);
    }

    // --- sending ---

    _canSend() {
      const ws = this.ws;
      if (!ws || this._ending) return false;
      if (this._opened) return ws.readyState === OPEN;
      return ws.readyState === CONNECTING && this._queuedMessages < this.sendBufferLimit;
    }

    _frame(frame) {
      if (this._opened) this.ws.send(frame);
      else this._queued.push(frame);
    }

    _sendMessage(header, payload) {
      if (!this.ws) return;
      if (!this._opened) this._queuedMessages++;
      this._frame(header);
      if (payload !== null && payloadSize(payload) > 0) this._frame(payload);
    }

    _newId(stream) {
      if (this._pending.size >= STREAM_IDS) throw new Error('gotalk: too many pending requests');
      for (;;) {
        let id;
        if (stream) {
          id = '!' + pad(this._nextStreamId.toString(36), 3);
          this._nextStreamId = (this._nextStreamId + 1) % STREAM_IDS;
        } else {
          id = pad(this._nextId.toString(36), 4);
          this._nextId = (this._nextId + 1) % SINGLE_IDS;
        }
        if (!this._pending.has(id)) return id;
      }
    }

    /**
     * Send request `op` with the payload `encode()` returns. Whatever fails before the request
     * is sent (a value without JSON form, a name too long) rejects, and leaves nothing pending.
     */
    _call(op, encode, buffer, cb) {
      const promise = new Promise((resolve, reject) => {
        if (!this._canSend()) {
          reject(new Error('socket is closed'));
          return;
        }
        let payload, id, header;
        try {
          payload = encode();
          id = this._newId(false);
          header = makeHeader('r', id, op, null, payloadSize(payload));
        } catch (err) {
          reject(err);
          return;
        }
        const call = {
          op: op, payload: payload, attempts: 0, timer: null, deadline: null,
          _result: (type, bytes) => {
            clearTimeout(call.deadline);
            this._settled(id, call);
            if (buffer) {
              resolve(bytes);
              return;
            }
            try {
              resolve(decodeJSON(bytes));
            } catch (err) {
              reject(new Error('invalid JSON in the result of ' + op + ': ' + err.message));
            }
          },
          _fail: (err) => {
            clearTimeout(call.timer);
            clearTimeout(call.deadline);
            this._settled(id, call);
            reject(err);
          },
          _retry: (wait, message) => this._retry(id, call, wait, message),
        };
        const timeout = this.requestTimeout;
        if (timeout > 0) {
          call.deadline = setTimeout(() => {
            if (this._pending.get(id) !== call) return;
            const err = new Error('gotalk: no result for ' + op + ' within ' + timeout + ' ms');
            err.timeout = true;
            call._fail(err); // a late result for this id is ignored
          }, timeout);
        }
        this._pending.set(id, call);
        this._sendMessage(header, payload);
      });
      if (typeof cb === 'function') promise.then((value) => cb(null, value), (err) => cb(err));
      return promise;
    }

    _retry(id, call, wait, message) {
      call.attempts++;
      if (call.attempts > this.maxRetries) {
        call._fail(remoteError(message || 'retry limit reached', { retry: true, wait: wait }));
        return;
      }
      this.emit('retry', { op: call.op, wait: wait, message: message, attempt: call.attempts });
      call.timer = setTimeout(() => {
        call.timer = null;
        if (this._pending.get(id) !== call) return; // rejected meanwhile (disconnected)
        if (!this.isOpen) {
          call._fail(new Error('socket is closed'));
          return;
        }
        this._sendMessage(makeHeader('r', id, call.op, null, payloadSize(call.payload)),
                          call.payload);
      }, wait);
    }

    /**
     * Request `op` with `value` as JSON; resolves with the decoded JSON result.
     * `request(op, cb)` (old gotalk.js pages) sends null and calls `cb(err, result)`.
     */
    request(op, value, cb) {
      if (typeof value === 'function' && cb === undefined) {
        cb = value;
        value = null;
      }
      return this._call(op, () => jsonPayload(value), false, cb);
    }

    /** Request `op` with a raw payload (string or bytes); resolves with a Uint8Array. */
    bufferRequest(op, buf, cb) {
      if (typeof buf === 'function' && cb === undefined) {
        cb = buf;
        buf = null;
      }
      return this._call(op, () => rawPayload(buf), true, cb);
    }

    streamRequest(op) {
      return new StreamRequest(this, op, this._newId(true));
    }

    notify(name, value) {
      this.bufferNotify(name, jsonPayload(value));
    }

    bufferNotify(name, buf) {
      if (!this._canSend()) throw new Error('socket is closed');
      const payload = rawPayload(buf);
      this._sendMessage(makeHeader('n', null, name, null, payloadSize(payload)), payload);
    }

    /** Send a heartbeat; `load` is between 0 (idle) and 1 (overloaded). */
    sendHeartbeat(load) {
      if (!this.isOpen) return;
      const level = Math.max(0, Math.min(0xffff, Math.round((load || 0) * 0xffff)));
      const now = Math.floor(Date.now() / 1000) >>> 0;
      this.ws.send(ascii('h' + pad(level.toString(16), 4) + pad(now.toString(16), 8)));
    }

    // --- receiving ---

    _onFrame(ws, data) {
      if (ws !== this.ws) return;
      this._lastReceived = Date.now();
      this._silence = 0;
      this._rx.push(typeof data === 'string' ? encoder.encode(data) : new Uint8Array(data));
      try {
        this._read(ws);
      } catch (err) {
        if (!err.isGotalkProtocolError) throw err;
        this._protocolFailure(ws, err);
      }
    }

    _read(ws) {
      const queue = this._rx;
      if (!this._versionOk) {
        if (queue.length < 2) return;
        const version = latin1(queue.take(2));
        if (version !== '01') {
          throw protocolError(ERR_UNSUPPORTED, 'unsupported protocol version ' +
                              JSON.stringify(version));
        }
        this._versionOk = true;
        clearTimeout(this._connectTimer);
        this._connectTimer = null;
      }
      while (queue.length > 0 || this._header) {
        if (!this._header) {
          this._header = readHeader(queue, this.maxMessageSize);
          if (!this._header) return;
        }
        const header = this._header;
        if (queue.length < header.size) return;
        this._header = null;
        this._dispatch(ws, header, queue.take(header.size));
        if (ws !== this.ws) return; // the message closed the connection
      }
    }

    _dispatch(ws, msg, payload) {
      if (msg.type !== 'h' && msg.type !== 'f') this._served = true;
      switch (msg.type) {
        case 'R':
        case 'S': {
          const call = this._pending.get(msg.id);
          if (call) call._result(msg.type, payload);
          break; // results for unknown ids are ignored, as Go peers do
        }
        case 'E': {
          const call = this._pending.get(msg.id);
          if (call) call._fail(remoteError(decoder.decode(payload)));
          break;
        }
        case 'e': {
          const call = this._pending.get(msg.id);
          if (!call) break;
          const message = decoder.decode(payload);
          if (call._retry) call._retry(msg.wait, message);
          else call._fail(remoteError(message, { retry: true, wait: msg.wait }));
          break;
        }
        case 'r':
          this._serve(msg.id, msg.name, payload);
          break;
        case 's':
          // Browser peers take no stream requests (gotalk.js cannot either): refuse it.
          this._refusedStreams.add(msg.id);
          this._sendError(msg.id, 'stream requests not supported');
          break;
        case 'p':
          if (!this._refusedStreams.has(msg.id)) {
            throw protocolError(ERR_INVALID, 'stream part for an unknown stream');
          }
          if (payload.length === 0) this._refusedStreams.delete(msg.id);
          break;
        case 'n':
          this._notification(msg.name, payload);
          break;
        case 'h': {
          const now = Date.now();
          this._beatGap = Math.max(this._beatGap, now - this._lastBeat);
          this._lastBeat = now;
          this.emit('heartbeat', { time: new Date(msg.time * 1000), load: msg.load });
          break;
        }
        case 'f': {
          const err = protocolError(msg.code, 'the server sent f' + pad(msg.code.toString(16), 8));
          this._error = err;
          try {
            ws.close(4000 + Math.min(msg.code, 999));
          } catch (e) {
            // already closing
          }
          this._lost(ws, err);
          break;
        }
        default:
          throw protocolError(ERR_INVALID, 'unexpected message ' + msg.type);
      }
    }

    _sendError(id, message) {
      const payload = String(message);
      this._sendMessage(makeHeader('E', id, null, null, utf8Length(payload)), payload);
    }

    /** Answer a request from the server with a handler registered on this side. */
    _serve(id, op, payload) {
      const entry = this.handlers._request(op);
      if (!entry) {
        this._sendError(id, 'unknown operation "' + op + '"');
        return;
      }
      const ws = this.ws;
      let answered = false;
      const reply = (value) => {
        if (answered || ws !== this.ws) return;
        let out;
        try {
          out = entry.buffer ? rawPayload(value) : jsonPayload(value);
        } catch (err) {
          fail('cannot send the result: ' + err.message);
          return;
        }
        answered = true;
        this._sendMessage(makeHeader('R', id, null, null, payloadSize(out)), out);
      };
      const fail = (err) => {
        if (answered || ws !== this.ws) return;
        answered = true;
        this._sendError(id, errorText(err));
      };
      const resolver = function (value) { reply(value); };
      resolver.error = fail;
      let params = payload;
      if (!entry.buffer) {
        try {
          params = decodeJSON(payload);
        } catch (err) {
          fail('invalid JSON payload: ' + err.message);
          return;
        }
      }
      let returned;
      try {
        returned = entry.fn(params, resolver, op);
      } catch (err) {
        fail(err);
        return;
      }
      // Handlers answer through the resolver (gotalk.js style) or by returning a value or
      // a Promise.
      if (returned && typeof returned.then === 'function') returned.then(reply, fail);
      else if (returned !== undefined) reply(returned);
    }

    _notification(name, payload) {
      const entry = this.handlers._notification(name);
      if (!entry) return;
      let value = payload;
      if (!entry.buffer) {
        try {
          value = decodeJSON(payload);
        } catch (err) {
          return; // notifications cannot be answered with an error
        }
      }
      try {
        entry.fn(value, name);
      } catch (err) {
        setTimeout(() => { throw err; }, 0);
      }
    }
  }
  Sock.prototype.requestp = Sock.prototype.request;
  Sock.prototype.bufferRequestp = Sock.prototype.bufferRequest;

  // --- the module -----------------------------------------------------------------------------

  const gotalk = {
    version: '1.0.0-peerwire',
    defaultResponderAddress: addressFromScript(scriptUrl),
    WebSocket: null, // a WebSocket class to use instead of the global one
    Handlers: function () { return new Handlers(); },
    Sock: function (handlers) { return new Sock(handlers); },
    EventEmitter: EventEmitter,
    protocol: {
      Version: 1,
      ErrorAbnormal: ERR_ABNORMAL,
      ErrorUnsupported: ERR_UNSUPPORTED,
      ErrorInvalidMsg: ERR_INVALID,
      ErrorTimeout: ERR_TIMEOUT,
    },
    utf8: {
      encode: (s) => encoder.encode(s),
      decode: (bytes) => decoder.decode(bytes),
    },

    get defaultHandlers() {
      return defaultHandlers;
    },
    set defaultHandlers(handlers) {
      defaultHandlers = handlers;
    },

    handle: (op, fn) => defaultHandlers.handleRequest(op, fn),
    handleRequest: (op, fn) => defaultHandlers.handleRequest(op, fn),
    handleBufferRequest: (op, fn) => defaultHandlers.handleBufferRequest(op, fn),
    handleNotification: (name, fn) => defaultHandlers.handleNotification(name, fn),
    handleBufferNotification: (name, fn) => defaultHandlers.handleBufferNotification(name, fn),

    /** A socket that stays connected to `addr` (default: where this script came from). */
    connection: (addr, handlers) => new Sock(handlers).openKeepAlive(addr),

    /** A socket connected once to `addr`; `onconnect(err, sock)` runs when it is up. */
    open: (addr, onconnect, handlers) => new Sock(handlers).open(addr, onconnect),
  };

  return gotalk;
});
