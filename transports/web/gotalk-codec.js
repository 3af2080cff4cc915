  // --- gotalk-codec.js: payloads, hex, and the message header codec --------------------------
  // (a part of the library: statements of the function that gotalk-head.js opens)

  // --- payloads and hex ---------------------------------------------------------------------

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

  // --- reading: a byte queue and the message header parser ----------------------------------

  // Frames under SMALL_FRAME bytes are copied into shared buffers of MERGE_BUFFER bytes: one
  // chunk per frame costs far more than its bytes (a view and an ArrayBuffer each, some
  // 500 bytes in V8), so a payload sent in 1-byte frames would cost hundreds of times its
  // size. Larger frames are kept as they came (a chunk costs them under 3%).
  const SMALL_FRAME = 4096;
  const MERGE_BUFFER = 65536;

  /**
   * Received bytes as a list of chunks (from `_first` on): the frames as they came, or for
   * small ones views of shared merge buffers, each filled before the next is made, so what
   * is held is O(bytes held) and each byte is copied at most twice (into a merge buffer,
   * then out of it). Taking n bytes gives a view of a frame when they are all in one, else
   * a copy: a view of a merge buffer is never given out, as it would keep the whole buffer.
   * The queue (one per connection) keeps its last merge buffer, refilled once emptied.
   */
  class ByteQueue {
    constructor() {
      this.chunks = [];
      this._first = 0; // chunks before it are taken (dropped in batches: no O(n) shift)
      this.length = 0;
      this._merge = null; // the merge buffer being filled, and the end of its used part
      this._mergeEnd = 0;
      this._merged = new WeakSet(); // the ArrayBuffers of merge buffers
    }

    push(bytes) {
      const n = bytes.length;
      if (n === 0) return;
      this.length += n;
      if (n >= SMALL_FRAME) {
        this.chunks.push(bytes);
        return;
      }
      let merge = this._merge;
      if (merge === null || this._mergeEnd + n > MERGE_BUFFER) {
        merge = this._merge = new Uint8Array(MERGE_BUFFER);
        this._mergeEnd = 0;
        this._merged.add(merge.buffer);
      }
      const start = this._mergeEnd;
      merge.set(bytes, start);
      this._mergeEnd = start + n;
      const chunks = this.chunks;
      const last = chunks.length > this._first ? chunks[chunks.length - 1] : null;
      if (last && last.buffer === merge.buffer && last.byteOffset + last.length === start) {
        chunks[chunks.length - 1] = merge.subarray(last.byteOffset, start + n); // grow it
      } else {
        chunks.push(merge.subarray(start, start + n));
      }
    }

    peek(n) {
      if (n === 0) return EMPTY;
      const first = this.chunks[this._first];
      if (first.length >= n) {
        return this._merged.has(first.buffer) ? first.slice(0, n) : first.subarray(0, n);
      }
      const out = new Uint8Array(n);
      let off = 0;
      for (let i = this._first; off < n; i++) {
        const chunk = this.chunks[i];
        const k = Math.min(chunk.length, n - off);
        out.set(chunk.subarray(0, k), off);
        off += k;
      }
      return out;
    }

    take(n) {
      const out = this.peek(n);
      this.length -= n;
      const chunks = this.chunks;
      while (n > 0) {
        const chunk = chunks[this._first];
        if (chunk.length <= n) {
          chunks[this._first++] = null;
          n -= chunk.length;
        } else {
          chunks[this._first] = chunk.subarray(n);
          n = 0;
        }
      }
      if (this._first === chunks.length) {
        chunks.length = 0;
        this._first = 0;
        this._mergeEnd = 0; // no view of it is left: fill it again from its start
      } else if (this._first >= 1024 && this._first * 2 >= chunks.length) {
        chunks.splice(0, this._first); // O(chunks left), at most once per as many taken
        this._first = 0;
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
