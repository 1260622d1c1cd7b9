// Live views over an RpcConnection that ride through reconnects (docs/WEB.md "The JavaScript
// client"): LaneView mirrors a session's lane (PROTOCOL.md §3.3), OutputFollower follows a
// tool call's raw output (§3.2, the raw channel), readAll reads a call's complete output.
// Import them from rpc.js.
//
// Theory of operation. Both views listen to their connection's "open", "close" and
// "notification" events, and start over on every open, because a subscription or a follower
// ends with its connection (dshd keeps nothing of it):
//
// * LaneView `subscribe`s; seq 0 of each subscription is a base batch, fed into a fresh
//   Mirror, so every (re)subscription rebuilds the value from scratch (no replay, OPS.md §4).
//   A MirrorBroken (seq gap, bad batch) unsubscribes that subscription and subscribes again
//   (at once, then with a growing pause if it keeps breaking). onChange(view) follows every
//   batch applied. Until the new base batch arrives the view keeps the last value it had
//   (`live` says whether it is current).
// * OutputFollower keeps `offset`, the next byte it expects, and calls `tool.follow` from it
//   on every open; a chunk that starts before `offset` (it cannot, but a re-follow must
//   never double a byte) is cut, one that starts after it is reported as a gap. So across a
//   reconnect no byte is lost and none is delivered twice. eof ends it for good.
//
// A response precedes its first notification on the wire, but under Node several WebSocket
// messages can be dispatched before the awaiting code runs; so while a subscribe / follow is
// in flight, notifications with an id nobody knows yet are kept (bounded) and replayed once
// the answer names the id.

import { Mirror, MirrorBroken } from "./lane.js";
import { CONNECTION_LOST, b64decode } from "./connection.js";

/** Notifications kept per view while its subscribe / follow is in flight. */
export const MAX_EARLY = 256;
/** tool.read's largest page (PROTOCOL.md §3.2) and readAll's default bound on one read. */
export const READ_LIMIT = 4194304;
export const READ_ALL_MAX_BYTES = 64 * 1024 * 1024;

function pause(breaks) {
  return breaks <= 1 ? 0 : Math.min(5000, 250 * 2 ** (breaks - 2));
}

/** A base for both views: listeners on the connection, a generation per (re)start. */
class Live {
  constructor(conn) {
    this.conn = conn;
    this.stopped = false;
    this._gen = 0;
    this._early = null; // [params] while a request naming our id is in flight, else null
    this._earlyOverflow = false;
    this._timer = null;
    this._off = [];
    this._started = false;
  }

  _listen(notificationMethod) {
    if (this._started || this.stopped) return;
    this._started = true;
    this._off.push(
      this.conn.on("open", () => this._restart()),
      this.conn.on("close", () => this._dropped()),
      this.conn.on("notification", (method, params) => {
        if (method === notificationMethod && params && typeof params === "object") this._note(params);
      }),
    );
    if (this.conn.state === "open") this._restart();
  }

  _unlisten() {
    this.stopped = true;
    clearTimeout(this._timer);
    for (const off of this._off.splice(0)) off();
  }

  _later(ms, fn) {
    clearTimeout(this._timer);
    this._timer = ms > 0 ? setTimeout(fn, ms) : null;
    if (ms <= 0) fn();
  }

  _keepEarly(params) {
    if (this._early === null) return;
    if (this._early.length < MAX_EARLY) this._early.push(params);
    else this._earlyOverflow = true;
  }

  _takeEarly(matches) {
    const early = this._early ?? [];
    const overflow = this._earlyOverflow;
    this._early = null;
    this._earlyOverflow = false;
    return { kept: early.filter(matches), overflow };
  }
}

export class LaneView extends Live {
  /** Make a LaneView of `sessionId` on `conn` (started: it subscribes when `conn` opens). */
  static subscribe(conn, sessionId, onChange, options = {}) {
    return new LaneView(conn, sessionId, onChange, options);
  }

  /**
   * options: {onError(RpcError) for a refused subscribe (retried at the next open),
   *   onBroken(MirrorBroken), start: false to call start() later}
   */
  constructor(conn, sessionId, onChange, options = {}) {
    super(conn);
    this.sessionId = sessionId;
    this.onChange = onChange ?? (() => {});
    this.onError = options.onError ?? (() => {});
    this.onBroken = options.onBroken ?? (() => {});
    this.mirror = new Mirror();
    this.subscriptionId = null;
    this.subscriptions = 0; // subscribe requests answered (1 + every resubscription)
    this.broken = 0; // MirrorBroken seen
    this.error = null; // the last refused subscribe
    this._fresh = true; // the next batch must start a fresh mirror
    this._breaks = 0; // consecutive breaks without a good batch between them
    if (options.start !== false) this.start();
  }

  /** The lane value (mutated in place by each batch; null before the first base batch). */
  get value() {
    return this.mirror.value;
  }

  /** True while a subscription is active and its mirror holds its base batch and deltas. */
  get live() {
    return this.subscriptionId !== null && !this._fresh && this.mirror.ready;
  }

  /** Start following the connection (idempotent; the constructor does it by default). */
  start() {
    this._listen("stream");
    return this;
  }

  /** Stop for good: unsubscribe (best effort) and leave the connection's events. */
  close() {
    this._unlisten();
    this._unsubscribe(this.subscriptionId);
    this.subscriptionId = null;
  }

  _unsubscribe(id) {
    if (id !== null && this.conn.state === "open") {
      this.conn.request("unsubscribe", { subscriptionId: id }).catch(() => {});
    }
  }

  _dropped() {
    this._gen += 1; // an answer to a request of the dropped connection is stale
    this.subscriptionId = null;
    this._early = null;
  }

  _restart() {
    if (this.stopped) return;
    const gen = ++this._gen;
    this.subscriptionId = null;
    this._early = [];
    this.conn.request("subscribe", { sessionId: this.sessionId }).then(
      (result) => {
        if (gen !== this._gen || this.stopped) {
          this._unsubscribe(result.subscriptionId);
          return;
        }
        this.subscriptions += 1;
        this.error = null;
        this.subscriptionId = result.subscriptionId;
        this._fresh = true;
        const { kept } = this._takeEarly((p) => p.subscriptionId === result.subscriptionId);
        for (const p of kept) if (gen === this._gen) this._feed(p);
      },
      (err) => {
        if (gen !== this._gen || this.stopped) return;
        this._early = null;
        if (err.code === CONNECTION_LOST) return; // the next open subscribes again
        this.error = err;
        this.onError(err);
      },
    );
  }

  _note(params) {
    if (this.subscriptionId !== null && params.subscriptionId === this.subscriptionId) this._feed(params);
    else this._keepEarly(params);
  }

  _feed(params) {
    try {
      if (this._fresh) {
        const mirror = new Mirror(); // throws MirrorBroken unless this is a base batch
        mirror.applyBatch(params.seq, params.ops);
        this.mirror = mirror;
        this._fresh = false;
      } else {
        this.mirror.applyBatch(params.seq, params.ops);
      }
    } catch (err) {
      if (!(err instanceof MirrorBroken)) throw err;
      this._broke(err);
      return;
    }
    this._breaks = 0;
    this.onChange(this);
  }

  _broke(err) {
    this.broken += 1;
    this._breaks += 1;
    this.onBroken(err);
    const old = this.subscriptionId;
    this.subscriptionId = null;
    this._gen += 1;
    this._unsubscribe(old);
    this._later(pause(this._breaks), () => this._restart());
  }
}

export class OutputFollower extends Live {
  /**
   * Follow the raw output of `callId` in `sessionId` from `options.offset` (default 0).
   * options: {onData(Uint8Array, offset), onEof(exitCode|null), onGap({from, to}),
   *   onError(err) (a refused follow ends it; a daemon read error is retried), offset,
   *   start: false to call start() later}
   */
  constructor(conn, sessionId, callId, options = {}) {
    super(conn);
    this.sessionId = sessionId;
    this.callId = callId;
    this.onData = options.onData ?? (() => {});
    this.onEof = options.onEof ?? (() => {});
    this.onGap = options.onGap ?? (() => {});
    this.onError = options.onError ?? (() => {});
    this.offset = options.offset ?? 0; // the next byte expected
    this.followId = null;
    this.follows = 0; // tool.follow requests answered (1 + every resume)
    this.received = 0; // bytes delivered to onData
    this.done = false; // eof seen, or the follow was refused
    this.exitCode = null;
    this.error = null;
    this._retries = 0;
    if (options.start !== false) this.start();
  }

  /** Start following (idempotent; the constructor does it by default). */
  start() {
    this._listen("output");
    return this;
  }

  /** Stop following (tool.unfollow, best effort). */
  stop() {
    this._unlisten();
    this._unfollow(this.followId);
    this.followId = null;
  }

  _unfollow(id) {
    if (id !== null && this.conn.state === "open") {
      this.conn.request("tool.unfollow", { followId: id }).catch(() => {});
    }
  }

  _dropped() {
    this._gen += 1;
    this.followId = null;
    this._early = null;
  }

  _restart() {
    if (this.stopped || this.done) return;
    const gen = ++this._gen;
    this.followId = null;
    this._early = [];
    const params = { sessionId: this.sessionId, callId: this.callId, offset: this.offset };
    this.conn.request("tool.follow", params).then(
      (result) => {
        if (gen !== this._gen || this.stopped || this.done) {
          this._unfollow(result.followId);
          return;
        }
        this.follows += 1;
        this.followId = result.followId;
        const { kept, overflow } = this._takeEarly((p) => p.followId === result.followId);
        for (const p of kept) if (gen === this._gen) this._handle(p);
        if (overflow && gen === this._gen && !this.done) this._refollow(0); // from this.offset
      },
      (err) => {
        if (gen !== this._gen || this.stopped) return;
        this._early = null;
        if (err.code === CONNECTION_LOST) return; // the next open follows again
        this._finish();
        this.error = err;
        this.onError(err);
      },
    );
  }

  _refollow(ms) {
    const old = this.followId;
    this.followId = null;
    this._gen += 1;
    this._unfollow(old);
    this._later(ms, () => this._restart());
  }

  _note(params) {
    if (this.followId !== null && params.followId === this.followId) this._handle(params);
    else this._keepEarly(params);
  }

  _handle(p) {
    if (p.gap && typeof p.gap === "object") {
      this._gap(p.gap.from, p.gap.to);
      return;
    }
    if (typeof p.error === "string") {
      // dshd could not read the log: the follower ended; follow again from our offset.
      this.error = new Error(p.error);
      this.onError(this.error);
      this._retries += 1;
      this._refollow(Math.min(5000, 250 * 2 ** Math.min(this._retries - 1, 5)));
      return;
    }
    if (typeof p.data === "string") this._data(p.offset, b64decode(p.data));
    if (p.eof === true) {
      this._finish();
      this.exitCode = p.exitCode ?? null;
      this.onEof(this.exitCode);
    }
  }

  _gap(from, to) {
    if (to > this.offset) {
      this.onGap({ from: Math.max(from, this.offset), to });
      this.offset = to;
    }
  }

  _data(at, bytes) {
    if (at > this.offset) this._gap(this.offset, at);
    if (at < this.offset) {
      bytes = bytes.subarray(Math.min(bytes.length, this.offset - at)); // never twice
      at = this.offset;
    }
    if (bytes.length === 0) return;
    this._retries = 0;
    this.offset += bytes.length;
    this.received += bytes.length;
    this.onData(bytes, at);
  }

  _finish() {
    this.done = true;
    this.followId = null;
    this._unlisten();
  }
}

/**
 * A call's output from `offset` (default 0) to its current end, paging `tool.read`:
 * {data: Uint8Array, offset (where data starts), firstOffset, endOffset, eof, more}. An
 * offset the disk cap already dropped starts at `firstOffset` instead. `more` is true when
 * `maxBytes` (default 64 MiB) stopped it before the end (read on from offset + data.length).
 */
export async function readAll(conn, sessionId, callId, options = {}) {
  const limit = options.limit ?? READ_LIMIT;
  const maxBytes = options.maxBytes ?? READ_ALL_MAX_BYTES;
  let start = options.offset ?? 0;
  let at = start;
  let last = null;
  const parts = [];
  let total = 0;
  for (let movedToFirst = false; ;) {
    let result;
    try {
      result = await conn.request("tool.read", { sessionId, callId, offset: at, limit });
    } catch (err) {
      const first = err.data && err.data.firstOffset;
      if (!movedToFirst && total === 0 && err.code === -32602 && Number.isInteger(first) && first > at) {
        start = at = first;
        movedToFirst = true;
        continue;
      }
      throw err;
    }
    last = result;
    const bytes = b64decode(result.data);
    parts.push(bytes);
    total += bytes.length;
    at += bytes.length;
    if (bytes.length === 0 || at >= result.endOffset || total >= maxBytes) break;
  }
  const data = new Uint8Array(total);
  let pos = 0;
  for (const part of parts) {
    data.set(part, pos);
    pos += part.length;
  }
  const more = at < last.endOffset;
  return { data, offset: start, firstOffset: last.firstOffset, endOffset: last.endOffset, eof: last.eof && !more, more };
}
