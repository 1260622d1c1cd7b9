// rpc.js against a real dshd through a real `dsh web` (driven by tests/web/test_js_rpc.py;
// not a node:test file). Run: node --experimental-websocket rpc_live.mjs
// Env: DSH_WEB_BASE (http://127.0.0.1:PORT), DSH_WEB_TOKEN, DSH_WEB_CWD (the session's cwd),
// DSH_WEB_MODE ("bridge" or "daemon": which one the test restarts at "ready-for-kill").
//
// What it asserts: the token → cookie exchange (303, HttpOnly); initialize (protocol 1,
// approvals); an error answer is an RpcError with dshd's code; a LaneView gets its base
// batch; phase 1: a pre-approved tool.run shows `running` in the lane's tools, then leaves
// them for recent; its followed bytes (UTF-8 included, no trailing newline) equal readAll's
// and its exit code is 0; phase 2: a call that runs until STOP exists is followed; the bridge
// (or dshd) is restarted by the test; the pending tool.wait rejects (-32099; or, for a dshd
// stopping gracefully, its own -32014 answer); the
// connection reconnects by itself, the view resubscribes (a base batch at seq 0 holding the
// running call), the follower follows again and gets bytes past the drop; at eof every
// chunk started where the last ended, no gap, and the bytes equal readAll's (paged by 256),
// every tick exactly once and in order.
//
// It prints one JSON object per line: {"step": ...} as it goes, {"ok": true, ...figures} at
// the end, or {"ok": false, "error"} (exit 1). The step "ready-for-kill" asks the test to
// SIGKILL the bridge and start it again on the same port; "resumed" says the script has seen
// the drop, the reconnect, a fresh base batch and follow bytes after the reconnect, so the test
// may let the still-running call finish (it creates DSH_WEB_CWD/STOP).
import assert from "node:assert/strict";

import { RpcConnection, LaneView, OutputFollower, readAll, RpcError, CONNECTION_LOST } from "../../../client/web/static/rpc.js";

const BASE = process.env.DSH_WEB_BASE;
const TOKEN = process.env.DSH_WEB_TOKEN;
const CWD = process.env.DSH_WEB_CWD;
const MODE = process.env.DSH_WEB_MODE ?? "bridge"; // what the test restarts: "bridge" | "daemon"
const WAIT_MS = 30000; // liveness bound for each step (generous: 2 busy cores)

const say = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

async function until(predicate, what, ms = WAIT_MS) {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = predicate();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`not within ${ms} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** The token → cookie exchange a browser does when it opens the printed URL. */
async function cookieFor(base, token) {
  const res = await fetch(`${base}/?token=${encodeURIComponent(token)}`, { redirect: "manual" });
  assert.equal(res.status, 303, "GET /?token= answers 303 with the cookie");
  const [setCookie] = res.headers.getSetCookie();
  assert.match(setCookie, /HttpOnly/i);
  return setCookie.split(";")[0];
}

function concat(chunks) {
  const out = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0));
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.length;
  }
  return out;
}

/** A follower that records every chunk and checks each starts where the last ended. */
function follow(conn, sessionId, callId) {
  const rec = { chunks: [], eof: null, gaps: [], errors: [], contiguous: true, end: 0 };
  rec.follower = new OutputFollower(conn, sessionId, callId, {
    onData: (bytes, offset) => {
      if (offset !== rec.end) rec.contiguous = false;
      rec.end = offset + bytes.length;
      rec.chunks.push(bytes.slice());
    },
    onEof: (code) => (rec.eof = { code }),
    onGap: (gap) => rec.gaps.push(gap),
    onError: (err) => rec.errors.push(String(err)),
  });
  return rec;
}

/** Cookie, connection, initialize, session, lane: the context of both phases. */
async function connect() {
  const cookie = await cookieFor(BASE, TOKEN);
  class BridgeWebSocket extends WebSocket {
    constructor(url, protocols) {
      // undici's init: headers (what a browser sends itself) and the subprotocols
      super(url, { headers: { Origin: BASE, Cookie: cookie }, protocols });
    }
  }
  const closes = [];
  const conn = new RpcConnection(BASE.replace(/^http/, "ws") + "/ws", {
    WebSocket: BridgeWebSocket,
    protocols: ["dsh.v1", `dsh.token.${TOKEN}`], // the token, as the page offers it
    onClose: (info) => closes.push(info),
  });
  await until(() => conn.state === "open", "the first initialize");
  assert.equal(conn.server.protocolVersion, 1);
  assert.equal(conn.server.capabilities.approvals, true);
  say({ step: "initialized", state: conn.state });

  // An error answer is an RpcError with the daemon's code.
  const refused = await conn.request("session.get", { sessionId: "nosuchsession" }).catch((e) => e);
  assert.ok(refused instanceof RpcError && refused.code === -32004, `session.get unknown: ${refused}`);

  const { sessionId } = await conn.request("session.create", { cwd: CWD, name: "jsclient" });
  const bases = []; // for each applied base batch: its seq and the connection's open count
  const view = LaneView.subscribe(conn, sessionId, (v) => {
    if (v.mirror.lastOps.length && v.mirror.lastOps[0][0] === "r") bases.push({ seq: v.mirror.seq, opens: conn.opens });
  });
  await until(() => view.live, "the lane's base batch");
  assert.equal(view.value.session.sessionId, sessionId);
  return { conn, closes, sessionId, view, bases };
}

/** A short call goes from tools to recent; its followed bytes equal tool.read's. */
async function phase1({ conn, sessionId, view }) {
  const script = "for i in 1 2 3 4 5; do printf 'line %s \\342\\234\\223\\n' $i; sleep 0.1; done; printf 'no newline'";
  let sawRunning = false;
  const offChange = conn.on("notification", () => {
    const t = view.value && view.value.tools; // the view's own listener ran first
    if (t && Object.values(t).some((c) => c.state === "running")) sawRunning = true;
  });
  const run = await conn.request("tool.run", {
    sessionId, name: "bash", arguments: { command: script }, approved: true,
  });
  const rec = follow(conn, sessionId, run.callId);
  await until(() => rec.eof, "eof of the first call");
  await until(() => view.value.recent.some((r) => r.callId === run.callId), "the first call in recent");
  offChange();
  assert.ok(sawRunning, "the call was seen in the lane's tools while it ran");
  assert.ok(!(run.callId in view.value.tools), "a settled call left tools");
  const all = await readAll(conn, sessionId, run.callId);
  const got = concat(rec.chunks);
  assert.ok(all.eof && !all.more);
  assert.deepStrictEqual(got, all.data, "followed bytes equal tool.read's");
  assert.equal(new TextDecoder().decode(got), "line 1 ✓\nline 2 ✓\nline 3 ✓\nline 4 ✓\nline 5 ✓\nno newline");
  assert.equal(rec.eof.code, 0);
  const result = await conn.request("tool.wait", { sessionId, callId: run.callId });
  assert.equal(result.exitCode ?? result.details.exitCode, 0);
  say({ step: "phase1", bytes: got.length, callId: run.callId });
}

/** A call that runs until the test creates STOP; the bridge dies and comes back mid-follow. */
async function phase2({ conn, closes, sessionId, view, bases }) {
  const script = "i=0; while [ ! -e STOP ]; do i=$((i+1)); printf 'tick %06d\\n' $i; sleep 0.02; done; printf 'stopped after %d\\n' $i";
  const run = await conn.request("tool.run", {
    sessionId, name: "bash", arguments: { command: script }, approved: true,
  });
  const rec = follow(conn, sessionId, run.callId);
  await until(() => rec.end > 200, "output of the second call");
  await until(() => view.value.tools[run.callId] && view.value.tools[run.callId].state === "running", "the second call running in the lane");
  const lostWait = conn.request("tool.wait", { sessionId, callId: run.callId }).then(() => null, (err) => err);
  const opensBefore = conn.opens;
  const basesBefore = bases.length;
  say({ step: "ready-for-kill", offset: rec.end });

  await until(() => closes.length >= 1, "the drop (close event)");
  const dropped = await lostWait;
  // The bridge vanishing drops the answer: -32099. A graceful dshd stop answers its waits
  // first (-32014 "ask again", PROTOCOL.md §1 Service), then closes.
  const expected = MODE === "daemon" ? [CONNECTION_LOST, -32014] : [CONNECTION_LOST];
  assert.ok(dropped instanceof RpcError && expected.includes(dropped.code), `pending tool.wait rejected: ${dropped}`);
  const offsetAtDrop = rec.follower.offset;
  await until(() => conn.opens > opensBefore && conn.state === "open", "the reconnect");
  await until(() => bases.length > basesBefore && view.live, "a fresh base batch after the reconnect");
  assert.equal(bases[bases.length - 1].seq, 0, "the new subscription starts at seq 0 with a base batch");
  assert.ok(run.callId in view.value.tools, "the running call is in the rebuilt lane");
  await until(() => rec.follower.follows >= 2 && rec.end > offsetAtDrop + 100, "follow bytes after the reconnect");
  say({ step: "resumed", offsetAtDrop, end: rec.end });

  await until(() => rec.eof, "eof of the second call", 60000);
  await until(() => view.value.recent.some((r) => r.callId === run.callId), "the second call in recent");
  const all = await readAll(conn, sessionId, run.callId, { limit: 256 }); // many pages
  assert.ok(all.eof && !all.more && all.offset === 0 && all.endOffset === all.data.length);
  const got = concat(rec.chunks);
  assert.ok(rec.contiguous, "every chunk started where the last ended");
  assert.deepStrictEqual(rec.gaps, []);
  assert.equal(got.length, all.data.length, "no byte lost or doubled (length)");
  assert.deepStrictEqual(got, all.data, "no byte lost or doubled (content)");
  const text = new TextDecoder().decode(got);
  const ticks = text.match(/^tick \d{6}$/gm);
  const last = Number(/stopped after (\d+)/.exec(text)[1]);
  assert.equal(ticks.length, last, "every tick once, in order");
  ticks.forEach((t, i) => assert.equal(t, `tick ${String(i + 1).padStart(6, "0")}`));
  return { follows: rec.follower.follows, bytes: got.length, offsetAtDrop, ticks: last, readAllPages: Math.ceil(all.data.length / 256) };
}

async function main() {
  const ctx = await connect();
  await phase1(ctx);
  const figures = await phase2(ctx);
  say({ ok: true, opens: ctx.conn.opens, closes: ctx.closes, subscriptions: ctx.view.subscriptions, ...figures });
  ctx.view.close();
  ctx.conn.close();
}

main().then(
  () => process.exit(0),
  (err) => {
    say({ ok: false, error: String(err && err.stack ? err.stack : err) });
    process.exit(1);
  },
);
