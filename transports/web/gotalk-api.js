  // --- gotalk-api.js: the module object; closes the library's function -----------------------
  // (a part of the library: statements of the function that gotalk-head.js opens)

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
