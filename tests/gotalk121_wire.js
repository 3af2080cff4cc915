// A browser Gotalk client that behaves on the wire as the real gotalk.js 1.2.1 does (written
// for the tests from the measured wire facts, not from its source):
// - one header per binary frame, its payload (if any) in the next frame, a TEXT frame for
//   JSON strings; it reads frames the same way and fails on anything else;
// - request ids are base-36 ASCII ('0000', '0001', ...), stream requests '!000', ...;
// - a retry result (`e`) is not understood: it sends `f00000002` and closes;
// - streamRequest ends only on the empty `S` (an `R` would leave it waiting);
// - heartbeats (`h`, load 0) every `heartbeatMs` (20 s by default).
// `window.wire` records what happened, for the test to check.
(function () {
  'use strict';
  const enc = new TextEncoder();
  const dec = new TextDecoder();
  const hex = (n, width) => n.toString(16).padStart(width, '0');
  const ascii = (s) => enc.encode(s);

  class Wire121 {
    constructor(url, heartbeatMs = 20000) {
      this.log = { sent: [], received: [], faults: [], closed: null, heartbeats: 0 };
      this.pending = new Map();   // id -> {resolve, reject, parts|null}
      this.notifications = [];
      this.nextId = 0;
      this.nextStreamId = 0;
      this.expectPayload = null;  // the header waiting for its payload frame
      this.ws = new WebSocket(url);
      this.ws.binaryType = 'arraybuffer';
      this.opened = new Promise((resolve, reject) => {
        this.ws.onopen = () => {
          this.sendHeader('01');
          this.beat();
          this.timer = setInterval(() => this.beat(), heartbeatMs);
        };
        this.versionSeen = resolve;
        this.ws.onerror = () => reject(new Error('websocket error'));
      });
      this.ws.onmessage = (ev) => this.onFrame(ev.data);
      this.ws.onclose = (ev) => {
        clearInterval(this.timer);
        this.log.closed = { code: ev.code, reason: ev.reason };
        for (const p of this.pending.values()) p.reject(new Error('connection closed'));
        this.pending.clear();
      };
    }

    beat() {
      this.sendHeader('h0000' + hex(Math.floor(Date.now() / 1000) >>> 0, 8));
    }

    sendHeader(text) {
      this.log.sent.push(text.slice(0, 1));
      this.ws.send(ascii(text));  // headers: binary frames
    }

    sendPayload(text) {
      if (text.length) this.ws.send(text);  // JSON strings: text frames
    }

    newId(stream) {
      if (stream) return '!' + (this.nextStreamId++).toString(36).padStart(3, '0');
      return (this.nextId++).toString(36).padStart(4, '0');
    }

    message(type, id, op, text) {
      const size = hex(enc.encode(text).length, 8);
      const name = op === null ? '' : hex(enc.encode(op).length, 3) + op;
      this.sendHeader(type + id + name + size);
      this.sendPayload(text);
    }

    request(op, value) {
      const id = this.newId(false);
      const done = new Promise((resolve, reject) => {
        this.pending.set(id, { resolve, reject, parts: null });
      });
      this.message('r', id, op, JSON.stringify(value));
      return done;
    }

    streamRequest(op) {
      const id = this.newId(true);
      let started = false;
      const done = new Promise((resolve, reject) => {
        this.pending.set(id, { resolve, reject, parts: [] });
      });
      return {
        write: (value) => {
          const text = JSON.stringify(value);
          if (started) this.message('p', id, null, text);
          else this.message('s', id, op, text);
          started = true;
        },
        end: () => this.message('p', id, null, ''),
        done,  // resolves with the parts on the empty S
      };
    }

    notify(name, value) {
      this.message('n', '', name, JSON.stringify(value));
    }

    fault(code, why) {
      this.log.faults.push(why);
      this.sendHeader('f' + hex(code, 8));
      this.ws.close(4000 + code, why);
    }

    onFrame(data) {
      const bytes = new Uint8Array(data instanceof ArrayBuffer ? data : enc.encode(data));
      if (this.expectPayload) {
        const header = this.expectPayload;
        this.expectPayload = null;
        if (bytes.length !== header.size) return this.fault(2, 'payload frame of wrong size');
        return this.deliver(header, dec.decode(bytes));
      }
      const text = dec.decode(bytes);
      if (text === '01' && !this.versionKnown) {
        this.versionKnown = true;
        return this.versionSeen(true);
      }
      const header = this.parseHeader(text);
      if (header === null) return this.fault(2, 'not one header per frame: ' + text.slice(0, 20));
      this.log.received.push(header.type);
      if (header.type === 'e') return this.fault(2, 'unexpected retry result');  // as 1.2.1
      if (header.size > 0) this.expectPayload = header;
      else this.deliver(header, '');
    }

    parseHeader(text) {
      const type = text[0];
      let at = 1;
      const take = (n) => { const s = text.slice(at, at + n); at += n; return s; };
      const header = { type, id: '', op: '', size: 0 };
      if ('rsRSEpe'.includes(type)) header.id = take(4);
      if ('rsn'.includes(type)) header.op = take(parseInt(take(3), 16));
      if (type === 'e') header.wait = parseInt(take(8), 16);
      if ('rsnRSEpe'.includes(type)) header.size = parseInt(take(8), 16);
      else if (type === 'h') take(12);
      else if (type === 'f') header.code = parseInt(take(8), 16);
      else return null;
      return at === text.length && !Number.isNaN(header.size) ? header : null;
    }

    deliver(header, payload) {
      const call = this.pending.get(header.id);
      switch (header.type) {
        case 'h': this.log.heartbeats++; return;
        case 'n': this.notifications.push([header.op, JSON.parse(payload)]); return;
        case 'f': this.log.faults.push('server fault ' + header.code); return;
        case 'r': case 's':  // this page serves nothing
          this.message('E', header.id, null, 'unknown operation "' + header.op + '"');
          return;
      }
      if (!call) return;  // results for unknown ids are ignored
      if (header.type === 'R' && call.parts === null) {
        this.pending.delete(header.id);
        call.resolve(JSON.parse(payload));
      } else if (header.type === 'E') {
        this.pending.delete(header.id);
        call.reject(new Error(payload));
      } else if (header.type === 'S' && call.parts !== null) {
        if (payload.length) call.parts.push(JSON.parse(payload));
        else { this.pending.delete(header.id); call.resolve(call.parts); }
      }  // an R for a stream request leaves it waiting, as in 1.2.1
    }
  }

  window.Wire121 = Wire121;
})();
