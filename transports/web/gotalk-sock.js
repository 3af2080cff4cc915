  // --- gotalk-sock.js: requests, and answering what the server sends -------------------------
  // (a part of the library: statements of the function that gotalk-head.js opens)

  /**
   * One connection to a gotalk responder. `open()` connects once; `openKeepAlive()` stays
   * connected, reconnecting after random delays of up to 500 ms, then 1, 2, 4 and 5 s.
   * Events: `open` (the socket), `close` (an Error, or null after a normal close),
   * `heartbeat` ({time, load}) and `retry` ({op, wait, message, attempt}). It owns a
   * Connection (gotalk-connection.js: the WebSocket, heartbeats, reconnects), built with the
   * functions it reports to, and forwards to it the settings and calls that are the
   * connection's (`ws`, `isOpen`, `address()`, `sendHeartbeat()`); this adds our requests
   * (ids, results, retries, timeouts, `_pending`: id -> call or StreamRequest, failed with
   * the error when the connection is lost) and answers what the server sends.
   */
  class Sock extends EventEmitter {
    constructor(handlers) {
      super();
      this.handlers = handlers || defaultHandlers;
      this.requestTimeout = 0; // ms per request, retries included; 0: no limit
      this.maxRetries = MAX_RETRIES;
      this._nextId = 0;
      this._nextStreamId = 0;
      this._pending = new Map(); // our request id -> call or StreamRequest
      // stream requests from the server we answered with E, until their last part: the
      // last REFUSED_STREAMS of them (insertion order: the oldest is forgotten first)
      this._refusedStreams = new Set();
      this._ending = false;
      this._onconnect = null;
      this._conn = new Connection({
        message: (msg, payload) => this._dispatch(msg, payload),
        heartbeat: (msg) => {
          this.emit('heartbeat', { time: new Date(msg.time * 1000), load: msg.load });
        },
        open: () => this._connected(),
        lost: (err, wasOpen) => this._lost(err, wasOpen),
        connectFailed: (err) => this._connectResult(err),
      });
    }

    // --- the connection's settings and state (see Connection) ---

    get ws() {
      return this._conn.ws;
    }

    get isOpen() {
      return this._conn.isOpen;
    }

    address() {
      return this._conn.address();
    }

    get heartbeatInterval() {
      return this._conn.heartbeatInterval;
    }

    set heartbeatInterval(ms) {
      this._conn.heartbeatInterval = ms;
    }

    get connectTimeout() {
      return this._conn.connectTimeout;
    }

    set connectTimeout(ms) {
      this._conn.connectTimeout = ms;
    }

    get maxMessageSize() {
      return this._conn.maxMessageSize;
    }

    set maxMessageSize(bytes) {
      this._conn.maxMessageSize = bytes;
    }

    get sendBufferLimit() {
      return this._conn.sendBufferLimit;
    }

    set sendBufferLimit(messages) {
      this._conn.sendBufferLimit = messages;
    }

    /** Send a heartbeat; `load` is between 0 (idle) and 1 (overloaded). */
    sendHeartbeat(load) {
      this._conn.sendHeartbeat(load);
    }

    // --- opening and closing ---

    open(addr, onconnect) {
      if (typeof addr === 'function') {
        onconnect = addr;
        addr = undefined;
      }
      const target = addr || gotalk.defaultResponderAddress;
      if (!target) {
        throw new Error('gotalk: no address given and gotalk.defaultResponderAddress is not set');
      }
      const address = resolveAddress(target);
      this._onconnect = typeof onconnect === 'function' ? onconnect : null;
      this._ending = false;
      this._conn.open(address);
      return this;
    }

    openKeepAlive(addr) {
      this._conn.keepAlive(true);
      return this.open(addr);
    }

    /** Close now: pending requests are rejected and keep-alive stops. */
    close() {
      this._conn.close();
      return this;
    }

    /** Close once pending requests are answered (a second call closes at once). */
    end() {
      if (this._ending || this._pending.size === 0) return this.close();
      this._ending = true;
      this._conn.keepAlive(false);
      return this;
    }

    _settled(id, call) {
      if (this._pending.get(id) === call) this._pending.delete(id);
      if (this._ending && this._pending.size === 0) this.close();
    }

    _connected() {
      this.emit('open', this);
      this._connectResult(null);
    }

    /** Give the connect callback of `open()` its result, once. */
    _connectResult(err) {
      const cb = this._onconnect;
      this._onconnect = null;
      if (cb) cb(err, this);
    }

    /** The connection is gone: reject what is pending, then emit close (or fail the open). */
    _lost(err, wasOpen) {
      this._refusedStreams.clear();
      const reason = err || new Error('socket is closed');
      const pending = Array.from(this._pending.values());
      this._pending.clear();
      for (const call of pending) call._fail(reason);
      if (wasOpen) this.emit('close', err || null);
      else this._connectResult(err || new Error('connection failed'));
    }

    // --- requests ---

    _canSend() {
      return !this._ending && this._conn.canSend();
    }

    _sendMessage(header, payload) {
      this._conn.send(header, payload);
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
          op: op, payload: payload, attempts: 0, timer: null, deadline: null, refused: null,
          _result: (type, bytes) => {
            if (call.refused) return; // refused by a draining server: a result is not its
            if (type === 'S') {
              // parts of a streamed result (a peerwire async generator): one of them is not
              // the result; the rest of them, for an id no longer pending, are ignored
              call._fail(new Error('gotalk: ' + op + ' answered with a streamed result, ' +
                                   'not one result'));
              return;
            }
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
            reject(call.refused || err); // refused: not run, whatever ends the wait
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
          }, timerDelay(timeout));
        }
        this._pending.set(id, call);
        this._sendMessage(header, payload);
      });
      if (typeof cb === 'function') promise.then((value) => cb(null, value), (err) => cb(err));
      return promise;
    }

    /**
     * A retry result: send the request again after `wait` ms (the `e` header's, up to
     * 0xffffffff), at most `maxRetries` times. A wait past what timers hold (2**31 - 1 ms,
     * 24.8 days; longer ones fire at once) rejects at once, with `err.retry` and `err.wait`.
     * One from a server draining for a graceful close (message CLOSING) is not sent again:
     * the request rejects with it (`err.retry`, not run) once the connection closes or its
     * `requestTimeout` passes, as the Python client raises RetryLater; page code may send
     * it again on the next connection. Nothing is kept across a reconnect. A stream
     * request takes its retry results itself (StreamRequest._retry: CLOSING the same way).
     */
    _retry(id, call, wait, message) {
      if (call.refused) return;
      if (message === CLOSING) {
        // the server is draining for a graceful close: on this connection it would be
        // refused again; it stays pending (nothing is sent) and fails with this error once
        // the connection closes, or at `requestTimeout`
        call.refused = remoteError(message, { retry: true, wait: wait });
        return;
      }
      call.attempts++;
      if (call.attempts > this.maxRetries || wait > MAX_TIMER) {
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

    /** A message from the server other than a heartbeat or "f" (the connection's). */
    _dispatch(msg, payload) {
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
          call._retry(msg.wait, decoder.decode(payload)); // a StreamRequest's: its own
          break;
        }
        case 'r':
          this._serve(msg.id, msg.name, payload);
          break;
        case 's':
          // Browser peers take no stream requests (gotalk.js cannot either): refuse it.
          this._refusedStreams.add(msg.id);
          if (this._refusedStreams.size > REFUSED_STREAMS) {
            this._refusedStreams.delete(this._refusedStreams.values().next().value);
          }
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
