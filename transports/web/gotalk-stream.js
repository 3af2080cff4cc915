  // --- gotalk-stream.js: stream requests -----------------------------------------------------
  // (a part of the library: statements of the function that gotalk-head.js opens)


  /**
   * A stream request: `write(value)` sends a part (strings and bytes raw, other values as
   * JSON; an empty value ends it), `end()` ends it. Events: `data` (each result part, a
   * Uint8Array), `end` (the result is complete), `error`, and `close` (error or null).
   * Refused by a server draining for a graceful close (CLOSING) it fails as a request does
   * (see Sock._retry): nothing more is sent, and `error` comes (`err.retry`, not run) once
   * the connection closes, or at `requestTimeout` counted from its first part.
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
      this._startedAt = 0; // Date.now() when the first part went out
      this._refused = null; // the CLOSING error it fails with, once refused
      this._deadline = null;
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
        this._startedAt = Date.now();
        sock._pending.set(this.id, this);
        sock._sendMessage(header, payload);
      } else {
        sock._sendMessage(makeHeader('p', this.id, null, null, size), payload);
      }
      return true;
    }

    // called by the socket
    _result(type, payload) {
      if (this._refused) return; // refused by a draining server: a result is not its
      if (type === 'S' && payload.length === 0) {
        this._finish(null);
        return;
      }
      this.emit('data', payload);
      if (type === 'R') this._finish(null);
    }

    _fail(err) {
      this._finish(this._refused || err); // refused: not run, whatever ends the wait
    }

    /**
     * A retry result. CLOSING (the server drains for a graceful close): it stays pending,
     * sending nothing, until the connection closes or `requestTimeout` passes, then fails
     * with it, as a request does; any other fails at once (parts already sent cannot be
     * sent again), with `err.retry` and `err.wait`.
     */
    _retry(wait, message) {
      if (this._refused) return;
      const err = remoteError(message, { retry: true, wait: wait });
      if (message !== CLOSING) {
        this._finish(err);
        return;
      }
      this._refused = err;
      this._ended = true; // the server dropped it: later parts would be dropped too
      const timeout = this.sock.requestTimeout;
      if (timeout > 0) {
        const left = Math.max(0, this._startedAt + timeout - Date.now());
        this._deadline = setTimeout(() => this._finish(err), timerDelay(left));
      }
    }

    _finish(err) {
      if (this._finished) return;
      this._finished = true;
      this._ended = true;
      clearTimeout(this._deadline);
      this.sock._settled(this.id, this);
      if (err) this.emit('error', err);
      else this.emit('end');
      this.emit('close', err);
    }
  }
