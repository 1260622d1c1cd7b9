"""lane.js and rpc.js in a real browser: headless Chromium on a page served by a real ``dsh web``.

Theory of operation: the Node tests (test_js.py, test_js_rpc.py) prove the modules under Node;
this proves the same files work as the browser loads them: Chromium opens the tokened URL
(the cookie is set by the 303), then a script in the page imports ``/static/lane.js`` (served
by the bridge, no build step) and runs every conformance vector through it as a receiver
(the vectors are handed in as JSON text; the counts are checked against the file), and
imports ``/static/rpc.js`` and opens an RpcConnection to ``/ws`` with the browser's own
cookie and Origin, initializes and lists sessions. Debian's ``/usr/bin/chromium`` through
``/usr/bin/chromedriver`` (nothing downloaded); skipped only when either is missing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.web.browser_support import chrome, chromium_missing

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "conformance" / "ops-v1.json"
pytestmark = pytest.mark.skipif(chromium_missing() is not None,
                                reason=str(chromium_missing()))

RUN_VECTORS = r"""
const [text, done] = arguments;
const eq = (a, b) => {
  if (a === b) return true;
  if (typeof a !== typeof b || a === null || b === null || typeof a !== "object") return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  const ka = Object.keys(a), kb = Object.keys(b);
  return ka.length === kb.length && ka.every((k) => Object.hasOwn(b, k) && eq(a[k], b[k]));
};
import("/static/lane.js").then((lane) => {
  const v = JSON.parse(text);
  const ran = { apply: 0, encode: 0, bad_wire: 0 }, failed = [];
  const kindOf = (fn) => { try { fn(); } catch (e) { return e instanceof lane.OpError ? e.kind : "not an OpError: " + e; } return null; };
  for (const c of v.apply) {
    if (c.side === "recorder") continue;
    const ops = JSON.parse(JSON.stringify(c.ops));
    const ok = "error" in c ? kindOf(() => lane.apply(structuredClone(c.doc), ops)) === c.error
                            : eq(lane.apply(structuredClone(c.doc), ops), c.expect);
    if (ok && eq(ops, c.ops)) ran.apply++; else failed.push("apply: " + c.name);
  }
  for (const c of v.encode) {
    try {
      const dec = new lane.Decoder();
      let doc = null, ok = true;
      c.wire.forEach((w, i) => { const b = dec.decode(w); ok = ok && eq(b, c.ops[i]); doc = lane.apply(doc, b); });
      if (ok && eq(doc, c.final)) ran.encode++; else failed.push("encode: " + c.name);
    } catch (e) { failed.push("encode: " + c.name + ": " + e); }
  }
  for (const c of v.bad_wire) {
    const dec = new lane.Decoder();
    if (kindOf(() => c.wire.forEach((w) => dec.decode(w))) === c.error) ran.bad_wire++; else failed.push("bad_wire: " + c.name);
  }
  const m = new lane.Mirror();
  m.applyBatch(0, [["r", {t: "a\u{1F600}"}]]);
  m.applyBatch(1, [["t", ["t"], 1], ["a", ["t"], "!"]]);
  done(JSON.stringify({ ran, failed, mirror: m.value }));
}).catch((e) => done(JSON.stringify({ error: String(e) })));
"""

RPC_IN_PAGE = r"""
const done = arguments[0];
Promise.all([import("/static/rpc.js"), import("/static/security.js")]).then(([rpc, sec]) => {
  const conn = new rpc.RpcConnection(`ws://${location.host}/ws`, { protocols: () => sec.tokenProtocols() });
  const t0 = Date.now();
  const poll = async () => {
    if (conn.state !== "open") {
      if (Date.now() - t0 > 20000) return done(JSON.stringify({ error: "not open", lastClose: conn.lastClose }));
      return setTimeout(poll, 50);
    }
    const list = await conn.request("session.list", {});
    const refused = await conn.request("session.get", { sessionId: "nosuchsession" }).catch((e) => e);
    done(JSON.stringify({ server: conn.server, sessions: list.sessions.length,
                          refused: refused instanceof rpc.RpcError ? refused.code : String(refused),
                          b64: rpc.b64encode("✓") }));
    conn.close();
  };
  poll();
}).catch((e) => done(JSON.stringify({ error: String(e) })));
"""


@pytest.fixture
def driver():
    d = chrome()
    d.set_script_timeout(60)
    try:
        yield d
    finally:
        d.quit()


def test_lane_js_and_rpc_js_run_in_chromium(bridge, driver):
    driver.get(bridge.url)  # 303 -> / with the cookie
    assert any(c["name"] == f"dsh-web-{bridge.port}" for c in driver.get_cookies())
    vectors_text = VECTORS.read_text(encoding="utf-8")
    out = json.loads(driver.execute_async_script(RUN_VECTORS, vectors_text))
    assert "error" not in out, out
    vectors = json.loads(vectors_text)
    recorder = sum(1 for c in vectors["apply"] if c.get("side") == "recorder")
    print(f"vectors in Chromium: {out['ran']} (skipped recorder-only: {recorder})")
    assert out["failed"] == []
    assert out["ran"] == {"apply": len(vectors["apply"]) - recorder, "encode": len(vectors["encode"]),
                          "bad_wire": len(vectors["bad_wire"])}
    assert out["mirror"] == {"t": "\U0001F600!"}  # code points, not UTF-16 units

    got = json.loads(driver.execute_async_script(RPC_IN_PAGE))
    assert "error" not in got, got
    assert got["server"]["protocolVersion"] == 1 and got["server"]["capabilities"]["approvals"] is True
    assert got["refused"] == -32004
    assert got["b64"] == "4pyT"
