// rpc.js without a daemon: base64, and RpcConnection's reconnect schedule and bounds against
// a real refused TCP port (nothing listens on it). The daemon-backed behaviour (initialize,
// requests, LaneView, OutputFollower, a bridge restart) is tests/web/test_js_rpc.py's.
// Needs node --experimental-websocket (test_js.py passes it).
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:net";

import {
  RpcConnection, RpcError, b64encode, b64decode, CONNECTION_LOST, MAX_QUEUED, NOT_CONNECTED,
} from "../../../client/web/static/rpc.js";

/** A port nothing listens on: bind one, note it, close it. */
async function refusedPort() {
  const server = createServer();
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address();
  await new Promise((r) => server.close(r));
  return port;
}

async function until(predicate, what, ms = 10000) {
  const deadline = Date.now() + ms;
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`not within ${ms} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

test("b64 round-trips every byte value and big buffers, and matches Buffer's", () => {
  const every = Uint8Array.from({ length: 256 }, (_, i) => i);
  assert.deepStrictEqual(b64decode(b64encode(every)), every);
  assert.equal(b64encode(every), Buffer.from(every).toString("base64"));
  const big = new Uint8Array(3 * 1024 * 1024 + 1);
  for (let i = 0; i < big.length; i++) big[i] = (i * 2654435761) >>> 24;
  assert.equal(b64encode(big), Buffer.from(big).toString("base64"));
  assert.deepStrictEqual(b64decode(Buffer.from(big).toString("base64")), big);
  assert.equal(b64encode("✓ ok"), Buffer.from("✓ ok", "utf8").toString("base64"));
  assert.deepStrictEqual(b64decode(""), new Uint8Array(0));
  assert.throws(() => b64decode("not base64!"));
  assert.throws(() => b64encode([1, 2]), TypeError);
});

test("reconnects forever with a doubling, capped backoff; close() ends it", async () => {
  const port = await refusedPort();
  const closes = [];
  const conn = new RpcConnection(`ws://127.0.0.1:${port}/ws`, {
    backoffFirstMs: 10, backoffMaxMs: 40, onClose: (info) => closes.push(info),
  });
  await until(() => closes.length >= 5, "five failed attempts");
  assert.deepStrictEqual(closes.slice(0, 5).map((c) => c.retryInMs), [10, 20, 40, 40, 40]);
  assert.ok(closes.every((c) => c.code === 1006 && c.reason));
  assert.equal(conn.state === "closed" || conn.state === "connecting", true);
  assert.deepStrictEqual(conn.lastClose, closes[closes.length - 1]);
  conn.close();
  assert.equal(conn.state, "closed");
  const seen = closes.length;
  await new Promise((r) => setTimeout(r, 150)); // longer than three backoffs
  assert.equal(closes.length, seen, "no attempt after close()");
  await assert.rejects(conn.request("session.list"), (e) => e instanceof RpcError && e.code === CONNECTION_LOST);
});

test("requests wait (bounded) for a connection and reject on close()", async () => {
  const port = await refusedPort();
  const conn = new RpcConnection(`ws://127.0.0.1:${port}/ws`, { backoffFirstMs: 1000 });
  const waiting = [];
  for (let i = 0; i < MAX_QUEUED; i++) waiting.push(conn.request("session.list").catch((e) => e));
  const over = await conn.request("session.list").catch((e) => e);
  assert.ok(over instanceof RpcError && over.code === CONNECTION_LOST && /already wait/.test(over.message));
  conn.close();
  const results = await Promise.all(waiting);
  assert.ok(results.every((e) => e instanceof RpcError && e.code === CONNECTION_LOST));
});

test("a {wait: false} request made while not connected is refused at once, never queued", async () => {
  // What a person typed while dshd (or the bridge) is away must not run later by surprise.
  const port = await refusedPort();
  const conn = new RpcConnection(`ws://127.0.0.1:${port}/ws`, { backoffFirstMs: 1000 });
  const asked = conn.request("tool.run", { sessionId: "s" }, { wait: false }).catch((e) => e);
  const queued = conn._queue.length;
  conn.close(); // settles a queued request too: the code tells which way it went
  assert.equal(queued, 0, "nothing waits to be sent at the next open");
  const refused = await asked;
  assert.ok(refused instanceof RpcError && refused.code === NOT_CONNECTED, String(refused));
});

test("hold() stops the reconnects (a signed-out page); resume() connects again at once", async () => {
  const port = await refusedPort();
  const closes = [];
  const conn = new RpcConnection(`ws://127.0.0.1:${port}/ws`, {
    backoffFirstMs: 10, backoffMaxMs: 20, onClose: (info) => closes.push(info),
  });
  try {
    await until(() => closes.length >= 1, "the first failed attempt");
    conn.hold();
    await new Promise((r) => setTimeout(r, 100)); // several backoffs: at most the attempt under way ends
    const held = closes.length;
    await new Promise((r) => setTimeout(r, 100));
    assert.equal(closes.length, held, "no attempt while held");
    conn.resume();
    await until(() => closes.length > held, "an attempt after resume()");
  } finally {
    conn.close();
  }
});

test("no WebSocket is a clear TypeError", () => {
  const saved = globalThis.WebSocket;
  try {
    globalThis.WebSocket = undefined;
    assert.throws(() => new RpcConnection("ws://127.0.0.1:1/ws"), /no WebSocket/);
  } finally {
    globalThis.WebSocket = saved;
  }
});

// --- the views' ordering rules, with a connection whose timing the test scripts ----------
// (The real thing, dshd through dsh web, is test_js_rpc.py; this pins the orderings a real
// socket only sometimes produces: a notification dispatched before its request's answer.)

import { LaneView, OutputFollower } from "../../../client/web/static/rpc.js";

class ScriptedConn {
  constructor() {
    this.state = "open";
    this.sent = []; // [{method, params, resolve, reject}]
    this.listeners = { open: new Set(), close: new Set(), notification: new Set() };
  }
  on(type, fn) {
    this.listeners[type].add(fn);
    return () => this.listeners[type].delete(fn);
  }
  request(method, params) {
    return new Promise((resolve, reject) => this.sent.push({ method, params, resolve, reject }));
  }
  emit(type, ...args) {
    for (const fn of this.listeners[type]) fn(...args);
  }
  last(method) {
    return this.sent.filter((s) => s.method === method).at(-1);
  }
}

const tick = () => new Promise((r) => setTimeout(r, 0));
const b64 = (s) => Buffer.from(s).toString("base64");

test("OutputFollower: output before the follow answer is kept; overlap cut; resume from the offset", async () => {
  const conn = new ScriptedConn();
  const got = [];
  const gaps = [];
  const f = new OutputFollower(conn, "S", "c-1", {
    onData: (bytes, at) => got.push([at, Buffer.from(bytes).toString()]),
    onGap: (g) => gaps.push(g),
  });
  assert.deepStrictEqual(conn.last("tool.follow").params, { sessionId: "S", callId: "c-1", offset: 0 });
  conn.emit("notification", "output", { followId: "f1", offset: 0, data: b64("hello ") });
  conn.emit("notification", "output", { followId: "other", offset: 0, data: b64("NOT OURS") });
  conn.last("tool.follow").resolve({ followId: "f1" });
  await tick();
  conn.emit("notification", "output", { followId: "f1", offset: 3, data: b64("lo world") }); // overlaps
  conn.emit("notification", "output", { followId: "f1", gap: { from: 14, to: 20 } });
  conn.emit("notification", "output", { followId: "f1", offset: 22, data: b64("!") }); // past: a gap
  assert.deepStrictEqual(got, [[0, "hello "], [6, "world"], [22, "!"]]);
  assert.deepStrictEqual(gaps, [{ from: 14, to: 20 }, { from: 20, to: 22 }]);
  conn.state = "closed";
  conn.emit("close", { code: 1006 });
  conn.emit("notification", "output", { followId: "f1", offset: 23, data: b64("stale") });
  conn.state = "open";
  conn.emit("open", {});
  assert.deepStrictEqual(conn.last("tool.follow").params, { sessionId: "S", callId: "c-1", offset: 23 });
  conn.last("tool.follow").resolve({ followId: "f2" });
  await tick();
  conn.emit("notification", "output", { followId: "f2", offset: 23, data: b64("more") });
  conn.emit("notification", "output", { followId: "f2", offset: 27, eof: true, exitCode: 3 });
  assert.deepStrictEqual(got.at(-1), [23, "more"]);
  assert.equal(f.done, true);
  assert.equal(f.exitCode, 3);
  assert.equal(f.follows, 2);
  conn.emit("open", {});
  assert.equal(conn.sent.filter((s) => s.method === "tool.follow").length, 2, "no follow after eof");
});

test("LaneView: base batch before the subscribe answer; a seq gap resubscribes; every open too", async () => {
  const conn = new ScriptedConn();
  const changes = [];
  const view = LaneView.subscribe(conn, "S", (v) => changes.push(structuredClone(v.value)));
  conn.emit("notification", "stream", { subscriptionId: "sub-1", seq: 0, ops: [["r", { n: "" }]] });
  conn.last("subscribe").resolve({ subscriptionId: "sub-1" });
  await tick();
  conn.emit("notification", "stream", { subscriptionId: "sub-1", seq: 1, ops: [["a", ["n"], "x"]] });
  assert.deepStrictEqual(changes, [{ n: "" }, { n: "x" }]);
  assert.equal(view.live, true);
  conn.emit("notification", "stream", { subscriptionId: "sub-1", seq: 3, ops: [["a", ["n"], "y"]] }); // gap
  assert.equal(view.broken, 1);
  assert.deepStrictEqual(conn.last("unsubscribe").params, { subscriptionId: "sub-1" });
  assert.equal(conn.sent.filter((s) => s.method === "subscribe").length, 2);
  conn.last("subscribe").resolve({ subscriptionId: "sub-2" });
  await tick();
  conn.emit("notification", "stream", { subscriptionId: "sub-2", seq: 0, ops: [["r", { n: "fresh" }]] });
  assert.deepStrictEqual(view.value, { n: "fresh" });
  conn.emit("close", { code: 1006 });
  assert.equal(view.live, false);
  assert.deepStrictEqual(view.value, { n: "fresh" }, "the last value stays shown while reconnecting");
  conn.emit("open", {});
  assert.equal(conn.sent.filter((s) => s.method === "subscribe").length, 3);
  view.close();
});

test("a request over the bridge's 16 MiB bound, or not JSON, is refused alone", async () => {
  // Only what the connection checks before writing: a socket that is open and records sends.
  class Recorder {
    constructor() {
      this.readyState = 1;
      this.sent = [];
      Recorder.last = this;
    }
    send(text) {
      this.sent.push(text);
    }
    close() {}
  }
  const conn = new RpcConnection("ws://unused/ws", { WebSocket: Recorder });
  const ws = Recorder.last;
  ws.onopen();
  const init = JSON.parse(ws.sent[0]);
  assert.equal(init.method, "initialize");
  assert.deepStrictEqual(init.params, { protocolVersion: 1, client: { name: "dsh-web" }, capabilities: { approvals: true } });
  ws.onmessage({ data: JSON.stringify({ jsonrpc: "2.0", id: init.id, result: { protocolVersion: 1 } }) });
  await until(() => conn.state === "open", "open");
  const big = "é".repeat(8 * 1024 * 1024 + 1); // 16 MiB + 2 bytes of UTF-8, 8 Mi UTF-16 units
  await assert.rejects(conn.request("tool.write", { data: big }), (e) => e instanceof RpcError && e.code === -32600);
  await assert.rejects(conn.request("tool.run", { n: 1n }), TypeError);
  assert.equal(ws.sent.length, 1, "neither was written");
  const ok = conn.request("session.list");
  const req = JSON.parse(ws.sent[1]);
  ws.onmessage({ data: JSON.stringify([{ jsonrpc: "2.0", id: req.id, result: { sessions: [] } }]) }); // a batch answer
  assert.deepStrictEqual(await ok, { sessions: [] });
  conn.close();
});

test("a WebSocket that opens and is closed at once (4001: dshd down) keeps backing off; only an answered initialize resets it", async () => {
  const made = [];
  class OpensThenCloses {
    constructor(url, protocols) {
      this.readyState = 0;
      this.protocols = protocols;
      this.sent = [];
      made.push(this);
      setTimeout(() => {
        this.readyState = 1;
        this.onopen?.();
        if (!OpensThenCloses.answer) {
          this.readyState = 3;
          this.onclose?.({ code: 4001, reason: "dshd is not running" });
        }
      }, 0);
    }
    send(text) {
      this.sent.push(text);
      const msg = JSON.parse(text);
      if (OpensThenCloses.answer && msg.method === "initialize") {
        setTimeout(() => this.onmessage?.({ data: JSON.stringify({ jsonrpc: "2.0", id: msg.id, result: { protocolVersion: 1 } }) }), 0);
      }
    }
    close() {}
  }
  OpensThenCloses.answer = false;
  const closes = [];
  let n = 0;
  const conn = new RpcConnection("ws://unused/ws", {
    WebSocket: OpensThenCloses, backoffFirstMs: 5, backoffMaxMs: 40,
    protocols: () => ["dsh.v1", `dsh.token.t${++n}`],
    onClose: (info) => closes.push(info),
  });
  await until(() => closes.length >= 5, "five closes");
  try {
  assert.deepStrictEqual(closes.slice(0, 5).map((c) => c.retryInMs), [5, 10, 20, 40, 40]);
  assert.ok(closes.every((c) => c.code === 4001 && c.reason === "dshd is not running"));
  // the protocols function is read at every connect
  assert.deepStrictEqual(made[0].protocols, ["dsh.v1", "dsh.token.t1"]);
  assert.deepStrictEqual(made[1].protocols, ["dsh.v1", "dsh.token.t2"]);
  OpensThenCloses.answer = true;
  await until(() => conn.state === "open", "open once initialize is answered");
  const ws = made.at(-1);
  ws.readyState = 3;
  ws.onclose({ code: 4000, reason: "dshd closed the connection" });
  assert.equal(closes.at(-1).retryInMs, 5, "an answered initialize reset the delay");
  } finally {
    conn.close(); // a failed assertion must not leave it reconnecting (node would not exit)
  }
});
