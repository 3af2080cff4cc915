  // --- gotalk-connection.js: one WebSocket at a time, heartbeats, reconnects -----------------
  // (a part of the library: statements of the function that gotalk-head.js opens)

  /**
   * One WebSocket at a time for a socket (Sock, in gotalk-sock.js, owns one): connecting, the
   * server's "01", heartbeats and the liveness check, the server's "f", the reconnect back-off,
   * close, framing what is sent (up to `sendBufferLimit` messages queued while connecting) and
   * cutting what is received into messages. It knows nothing of requests: it reports to the
   * functions it is built with, `on`:
   * - `message(header, payload)`: each received message other than a heartbeat or "f" (a
   *   gotalk protocol error it throws closes the connection with that error);
   * - `heartbeat(header)`: each heartbeat, once the liveness check has counted it;
   * - `open()`: the WebSocket is open, "01" and what was queued are sent;
   * - `lost(err, wasOpen)`: the WebSocket is gone (err: null after a normal close), before a
   *   reconnect is scheduled;
   * - `connectFailed(err)`: no WebSocket could be made for the address (a bad URL).
   */
  class Connection {
    constructor(on) {
      this._on = on;
      this.ws = null;
      this.heartbeatInterval = HEARTBEAT_INTERVAL;
      this.connectTimeout = CONNECT_TIMEOUT;
      this.maxMessageSize = MAX_MESSAGE_SIZE;
      this.sendBufferLimit = SEND_BUFFER_LIMIT;
      this._address = null;
      this._keepAlive = false;
      this._backoff = BACKOFF_FIRST;
      this._reconnectTimer = null;
      this._heartbeatTimer = null;
      this._connectTimer = null;
      this._userClosed = false;
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

    /** Connect to `address` (a ws:// or wss:// URL), unless a WebSocket is already there. */
    open(address) {
      this._address = address;
      this._userClosed = false;
      this._connect();
    }

    /** Keep connected (reconnect after each loss, from the first back-off delay), or stop. */
    keepAlive(on) {
      this._keepAlive = on;
      if (on) this._backoff = BACKOFF_FIRST;
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
      }, timerDelay(timeout));
    }

    _connectFailed(err) {
      this._on.connectFailed(err);
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
        this._heartbeatTimer = setInterval(() => this._tick(ws),
                                            timerDelay(this.heartbeatInterval));
      }
      this._on.open();
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

    /** The connection `ws` is gone: report it (`on.lost`), maybe reconnect. */
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
      this._on.lost(err, wasOpen);
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

    /** Close now (`on.lost` with null if it was connected); keep-alive stops. */
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

    /** Whether a message can go now or be queued (connecting, under `sendBufferLimit`). */
    canSend() {
      const ws = this.ws;
      if (!ws) return false;
      if (this._opened) return ws.readyState === OPEN;
      return ws.readyState === CONNECTING && this._queuedMessages < this.sendBufferLimit;
    }

    _frame(frame) {
      if (this._opened) this.ws.send(frame);
      else this._queued.push(frame);
    }

    /** Send a message (header, then payload unless empty); dropped when not connected. */
    send(header, payload) {
      if (!this.ws) return;
      if (!this._opened) this._queuedMessages++;
      this._frame(header);
      if (payload !== null && payloadSize(payload) > 0) this._frame(payload);
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
        this._receive(ws, header, queue.take(header.size));
        if (ws !== this.ws) return; // the message closed the connection
      }
    }

    /** Heartbeats and "f" are ours; every other message goes to `on.message`. */
    _receive(ws, msg, payload) {
      if (msg.type === 'h') {
        const now = Date.now();
        this._beatGap = Math.max(this._beatGap, now - this._lastBeat);
        this._lastBeat = now;
        this._on.heartbeat(msg);
      } else if (msg.type === 'f') {
        const err = protocolError(msg.code, 'the server sent f' + pad(msg.code.toString(16), 8));
        this._error = err;
        try {
          ws.close(4000 + Math.min(msg.code, 999));
        } catch (e) {
          // already closing
        }
        this._lost(ws, err);
      } else {
        this._served = true;
        this._on.message(msg, payload);
      }
    }
  }
