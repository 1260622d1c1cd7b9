// JSON-RPC 2.0 to dshd over the bridge's WebSocket (docs/PROTOCOL.md §1–§2, docs/WEB.md):
// RpcConnection, RpcError, and base64 helpers. Import them from rpc.js (the façade).
//
// Theory of operation: one RpcConnection owns one WebSocket at a time and keeps one open
// forever. Each (re)connect sends `initialize` first ({protocolVersion: 1, client: {name:
// "dsh-web"}, capabilities: {approvals: true}}); the connection is `open` once it answered,
// and only then are requests written. Until then `request()` waits in a bounded queue (it
// was never sent, so it may wait for the next connection). A request already written when
// the socket drops rejects with RpcError(-32099, "connection lost"): whether dshd ran it is
// unknown, and the caller decides (tool.run with a callId is safe to repeat). What a person
// asked for (a command, a turn, a decision) must not run later by surprise: such a request
// passes `{wait: false}` and, made while not open, rejects at once with RpcError(-32098,
// "not connected; nothing was sent") and is never sent. `hold()` stops reconnecting (a signed-out page: no
// retry can help) until `resume()` connects again at once. On any close
// the connection waits 0.25 s, doubling to 5 s, and connects again; only an answered
// initialize resets the delay (a WebSocket that opens and is closed at once -- 4001 while
// dshd is down -- keeps backing off). The subprotocols offered (`protocols`, the bridge's
// token for the page: docs/WEB.md) are read again at each connect. `close()` ends it for good. Messages are matched by id; a message with a method and
// no id is a notification, given to every "notification" listener as (method, params).
// Listeners ("open", "close", "notification") are how LaneView and OutputFollower ride
// through reconnects: on every "open" they subscribe / follow again.
//
// No I/O of its own beyond the WebSocket it is given; `WebSocket` is a constructor option
// (default globalThis.WebSocket), so Node can pass one that sets the cookie and Origin.

/** How long the first reconnect waits, and the longest wait (milliseconds). */
export const BACKOFF_FIRST_MS = 250;
export const BACKOFF_MAX_MS = 5000;
/** Bounds: requests in flight on one connection, and requests waiting for a connection. */
export const MAX_PENDING = 4096;
export const MAX_QUEUED = 1024;
/** A handshake not answered by then is given up; a close event waited for after an error. */
export const CONNECT_TIMEOUT_MS = 10000;
export const CLOSE_GRACE_MS = 2000;
/** The bridge's bound on one WebSocket message, either way (docs/WEB.md). */
export const MAX_MESSAGE_BYTES = 16 * 1024 * 1024;
/** The code a request gets when its connection dropped before it was answered. */
export const CONNECTION_LOST = -32099;
/** The code a `{wait: false}` request gets when made while not connected (it was not sent). */
export const NOT_CONNECTED = -32098;

/** A JSON-RPC error answer (or a local failure with a -32099 code). */
export class RpcError extends Error {
  constructor(code, message, data = undefined) {
    super(message);
    this.name = "RpcError";
    this.code = code;
    this.data = data;
  }
}

const OPEN = 1; // WebSocket.OPEN, without relying on the constructor's statics

export class RpcConnection {
  /**
   * @param {string} url ws:// or wss:// URL of the bridge's /ws
   * @param {object} options {WebSocket, protocols (array, or a function returning one),
   *   onOpen(initResult), onClose({code, reason, retryInMs}), onNotification(method, params),
   *   client: {name, version}, backoffFirstMs, backoffMaxMs}
   */
  constructor(url, options = {}) {
    this.url = url;
    this.WebSocket = options.WebSocket ?? globalThis.WebSocket;
    if (typeof this.WebSocket !== "function") {
      throw new TypeError("no WebSocket: pass options.WebSocket (Node 20: --experimental-websocket)");
    }
    this.client = options.client ?? { name: "dsh-web" };
    // The subprotocols offered at each connect: an array, or a function called each time
    // (the page's reads the token from storage, so a sign-in in another tab is picked up).
    this.protocols = options.protocols ?? null;
    this.backoffFirstMs = options.backoffFirstMs ?? BACKOFF_FIRST_MS;
    this.backoffMaxMs = options.backoffMaxMs ?? BACKOFF_MAX_MS;
    this.state = "connecting"; // "connecting" | "open" | "closed"
    this.lastClose = null; // {code, reason} of the last close, for the page's status line
    this.lastError = null; // the last error line dshd sent with id null (e.g. -32013)
    this.server = null; // the initialize answer of the current connection
    this.opens = 0; // how many times a connection was opened (initialize answered)
    this._listeners = { open: new Set(), close: new Set(), notification: new Set() };
    if (options.onOpen) this._listeners.open.add(options.onOpen);
    if (options.onClose) this._listeners.close.add(options.onClose);
    if (options.onNotification) this._listeners.notification.add(options.onNotification);
    this._ws = null;
    this._nextId = 1;
    this._pending = new Map(); // id -> {resolve, reject, method}
    this._queue = []; // [{method, params, resolve, reject}] waiting for "open"
    this._delay = this.backoffFirstMs;
    this._timer = null;
    this._closed = false;
    this._held = false; // hold(): no reconnect until resume()
    this._connect();
  }

  /** Add a listener ("open" | "close" | "notification"); returns a function removing it. */
  on(type, fn) {
    const set = this._listeners[type];
    if (!set) throw new TypeError(`no such event: ${type}`);
    set.add(fn);
    return () => set.delete(fn);
  }

  /** Send a request; resolves with its result, rejects with RpcError. With `{wait: false}`
   * it is refused at once (NOT_CONNECTED, never sent) unless the connection is open now. */
  request(method, params = {}, { wait = true } = {}) {
    if (this._closed) return Promise.reject(new RpcError(CONNECTION_LOST, "connection closed"));
    return new Promise((resolve, reject) => {
      if (this.state === "open") {
        this._send(method, params, resolve, reject);
      } else if (!wait) {
        reject(new RpcError(NOT_CONNECTED, "not connected; nothing was sent"));
      } else if (this._queue.length >= MAX_QUEUED) {
        reject(new RpcError(CONNECTION_LOST, `not connected, and ${MAX_QUEUED} requests already wait`));
      } else {
        this._queue.push({ method, params, resolve, reject });
      }
    });
  }

  /** Send a notification (no answer); dropped when not open. Returns whether it was sent. */
  notify(method, params = {}) {
    if (this.state !== "open") return false;
    this._ws.send(JSON.stringify({ jsonrpc: "2.0", method, params }));
    return true;
  }

  /** Stop reconnecting after the current socket closes (or now, between attempts). */
  hold() {
    this._held = true;
    clearTimeout(this._timer);
    this._timer = null;
  }

  /** After hold(): connect again now (with the first backoff) if no socket is open. */
  resume() {
    if (!this._held || this._closed) return;
    this._held = false;
    this._delay = this.backoffFirstMs;
    if (!this._ws && !this._timer) this._connect();
  }

  /** End for good: no reconnect; everything pending or queued rejects. */
  close() {
    this._closed = true;
    clearTimeout(this._timer);
    this._timer = null;
    const ws = this._ws;
    this._ws = null;
    this._dropPending("connection closed");
    for (const q of this._queue.splice(0)) q.reject(new RpcError(CONNECTION_LOST, "connection closed"));
    this.state = "closed";
    if (ws) {
      detach(ws);
      try {
        ws.close(1000, "client closed");
      } catch {
        // already closing
      }
    }
  }

  _connect() {
    this._timer = null;
    if (this._closed) return;
    this.state = "connecting";
    let ws;
    try {
      const protocols = typeof this.protocols === "function" ? this.protocols() : this.protocols;
      ws = protocols ? new this.WebSocket(this.url, protocols) : new this.WebSocket(this.url);
    } catch (err) {
      this._closedWith(null, { code: 1006, reason: `cannot connect: ${err.message}` });
      return;
    }
    this._ws = ws;
    let opened = false;
    // A handshake that neither opens nor fails (a black-holed SYN) is given up.
    const giveUp = setTimeout(() => this._abandon(ws, "no answer to the WebSocket handshake"), CONNECT_TIMEOUT_MS);
    ws.onopen = () => {
      opened = true;
      clearTimeout(giveUp);
      this._initialize(ws);
    };
    ws.onmessage = (ev) => this._receive(ev.data);
    ws.onerror = () => {
      // Browsers follow an error with a close event; Node 20's undici does not when the
      // handshake fails (readyState stays CONNECTING), so a failed handshake is a close here.
      clearTimeout(giveUp);
      if (!opened) this._abandon(ws, "connection failed");
      else setTimeout(() => this._abandon(ws, "connection error"), CLOSE_GRACE_MS);
    };
    ws.onclose = (ev) => {
      clearTimeout(giveUp);
      this._closedWith(ws, { code: ev.code, reason: ev.reason || "" });
    };
  }

  /** Treat `ws` as closed (1006) if it is still this connection's socket. */
  _abandon(ws, reason) {
    if (ws !== this._ws) return;
    this._closedWith(ws, { code: 1006, reason }); // detaches ws first: its close cannot recurse
    try {
      ws.close();
    } catch {
      // not open yet or closing already
    }
  }

  _initialize(ws) {
    const params = { protocolVersion: 1, client: this.client, capabilities: { approvals: true } };
    new Promise((resolve, reject) => this._send("initialize", params, resolve, reject)).then(
      (result) => {
        if (ws !== this._ws) return;
        this.server = result;
        this.state = "open";
        this.opens += 1;
        this._delay = this.backoffFirstMs;
        for (const q of this._queue.splice(0)) this._send(q.method, q.params, q.resolve, q.reject);
        this._emit("open", result);
      },
      (err) => {
        if (ws !== this._ws) return;
        this.lastError = err;
        try {
          ws.close(4002, `initialize failed: ${err.message}`.slice(0, 120));
        } catch {
          // closing already
        }
      },
    );
  }

  _send(method, params, resolve, reject) {
    if (this._pending.size >= MAX_PENDING) {
      reject(new RpcError(CONNECTION_LOST, `${MAX_PENDING} requests already wait for an answer`));
      return;
    }
    const ws = this._ws;
    if (!ws || ws.readyState !== OPEN) {
      reject(new RpcError(CONNECTION_LOST, "connection lost"));
      return;
    }
    const id = this._nextId++;
    let text;
    try {
      text = JSON.stringify({ jsonrpc: "2.0", id, method, params });
    } catch (err) {
      reject(new TypeError(`the params of ${method} are not JSON: ${err.message}`));
      return;
    }
    if (text.length * 3 > MAX_MESSAGE_BYTES && utf8Length(text) > MAX_MESSAGE_BYTES) {
      // The bridge would close the whole connection (1009); refuse this request alone.
      reject(new RpcError(-32600, `${method}: the request is over ${MAX_MESSAGE_BYTES} bytes (the bridge's bound)`));
      return;
    }
    this._pending.set(id, { resolve, reject, method });
    try {
      ws.send(text);
    } catch (err) {
      this._pending.delete(id);
      reject(new RpcError(CONNECTION_LOST, `connection lost: ${err.message}`));
    }
  }

  _receive(data) {
    if (typeof data !== "string") return; // the bridge sends text only
    let msg;
    try {
      msg = JSON.parse(data);
    } catch {
      this.lastError = new RpcError(-32700, `unparsable line from dshd: ${data.slice(0, 80)}`);
      return;
    }
    for (const one of Array.isArray(msg) ? msg : [msg]) this._dispatch(one);
  }

  _dispatch(msg) {
    if (msg === null || typeof msg !== "object") return;
    if (typeof msg.method === "string") {
      if (msg.id === undefined) this._emit("notification", msg.method, msg.params ?? {});
      return; // dshd sends no requests to clients
    }
    const entry = msg.id === null || msg.id === undefined ? undefined : this._pending.get(msg.id);
    if (!entry) {
      if (msg.error) this.lastError = new RpcError(msg.error.code, msg.error.message, msg.error.data);
      return;
    }
    this._pending.delete(msg.id);
    if (msg.error) entry.reject(new RpcError(msg.error.code, String(msg.error.message), msg.error.data));
    else entry.resolve(msg.result);
  }

  _closedWith(ws, info) {
    if (ws !== this._ws) return; // a socket this connection already left
    this._ws = null;
    if (ws) detach(ws);
    this.lastClose = info;
    this.server = null;
    this._dropPending("connection lost");
    if (this._closed) return;
    this.state = "closed";
    const delay = this._delay;
    this._delay = Math.min(this._delay * 2, this.backoffMaxMs);
    if (!this._held) this._timer = setTimeout(() => this._connect(), delay);
    info.retryInMs = delay;
    this._emit("close", info);
  }

  _dropPending(message) {
    const pending = [...this._pending.values()];
    this._pending.clear();
    for (const p of pending) p.reject(new RpcError(CONNECTION_LOST, message, { method: p.method }));
  }

  _emit(type, ...args) {
    for (const fn of [...this._listeners[type]]) {
      try {
        fn(...args);
      } catch (err) {
        // A listener's bug must not break the connection or the other listeners.
        queueMicrotask(() => {
          throw err;
        });
      }
    }
  }
}

function utf8Length(text) {
  return new TextEncoder().encode(text).length;
}

function detach(ws) {
  ws.onopen = ws.onmessage = ws.onerror = ws.onclose = null;
}

// --- base64 (the raw channel's bytes travel as base64 strings, PROTOCOL.md §3.2) -----------

const CHUNK = 0x8000;

/** Base64 of a Uint8Array, or of a string's UTF-8 bytes. */
export function b64encode(input) {
  const bytes = typeof input === "string" ? new TextEncoder().encode(input) : input;
  if (!(bytes instanceof Uint8Array)) throw new TypeError("b64encode takes a Uint8Array or a string");
  let binary = "";
  for (let i = 0; i < bytes.length; i += CHUNK) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + CHUNK));
  }
  return btoa(binary);
}

/** The bytes of a base64 string (throws on a string that is not base64). */
export function b64decode(text) {
  const binary = atob(text);
  const out = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) out[i] = binary.charCodeAt(i);
  return out;
}
