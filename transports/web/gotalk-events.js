  // --- gotalk-events.js: the event emitter and the handler registry --------------------------
  // (a part of the library: statements of the function that gotalk-head.js opens)

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

  // The handlers of gotalk.handle() & co., and of sockets made without their own.
  let defaultHandlers = new Handlers();
