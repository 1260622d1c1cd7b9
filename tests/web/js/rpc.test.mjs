// rpc.js without a daemon: base64, and RpcConnection's reconnect schedule and bounds against
// a real refused TCP port (nothing listens on it). The daemon-backed behaviour (initialize,
// requests, LaneView, OutputFollower, a bridge restart) is tests/web/test_js_rpc.py's.
// Needs node --experimental-websocket (test_js.py passes it).
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:net";

import {
  RpcConnection, RpcError, b64encode, b64decode, CONNECTION_LOST, MAX_QUEUED,
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

test("no WebSocket is a clear TypeError", () => {
  const saved = globalThis.WebSocket;
  try {
    globalThis.WebSocket = undefined;
    assert.throws(() => new RpcConnection("ws://127.0.0.1:1/ws"), /no WebSocket/);
  } finally {
    globalThis.WebSocket = saved;
  }
});
