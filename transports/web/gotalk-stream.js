  // --- gotalk-stream.js: stream requests -----------------------------------------------------
  // (a part of the library: statements of the function that gotalk-head.js opens)


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
