// Every conformance vector of conformance/ops-v1.json through client/web/static/lane.js
// (conformance/README.md "Running them"), as a receiver: apply cases except
// `side: "recorder"`, encode cases (wire → Decoder → the Op-form batch → apply → final),
// bad_wire cases (one Decoder must refuse with the named kind). The last test counts the
// cases that ran to the end against the file, so a vector silently skipped fails the run.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

import { apply, Decoder, OpError, isBase } from "../../../client/web/static/lane.js";

const VECTORS_URL = new URL("../../../conformance/ops-v1.json", import.meta.url);
const VECTORS = JSON.parse(readFileSync(VECTORS_URL, "utf8"));
const KINDS = new Set(["verb", "arity", "path", "reserved", "type", "range", "missing", "ref"]);
const ran = { apply: 0, encode: 0, bad_wire: 0 };

const clone = (x) => structuredClone(x);

function deepFreeze(x) {
  if (x !== null && typeof x === "object") {
    for (const v of Object.values(x)) deepFreeze(v);
    Object.freeze(x);
  }
  return x;
}

function expectKind(kind, fn, name) {
  assert.throws(fn, (err) => {
    assert.ok(err instanceof OpError, `${name}: expected an OpError, got ${err}`);
    assert.equal(err.kind, kind, `${name}: ${err.message}`);
    return true;
  });
}

test("the vectors are there", () => {
  assert.equal(VECTORS.version, 1);
  assert.ok(VECTORS.apply.length >= 50);
  assert.ok(VECTORS.encode.length >= 5);
  assert.ok(VECTORS.bad_wire.length >= 10);
  for (const c of [...VECTORS.apply, ...VECTORS.bad_wire]) {
    if ("error" in c) assert.ok(KINDS.has(c.error), `${c.name}: kind ${c.error}`);
  }
});

for (const c of VECTORS.apply) {
  if (c.side === "recorder") continue; // a receiver accepts every finite number (OPS.md §1)
  test(`apply: ${c.name}`, () => {
    const pristine = clone(c.ops);
    const ops = deepFreeze(clone(c.ops)); // apply must not modify its batch: frozen, it cannot
    if ("error" in c) {
      expectKind(c.error, () => apply(clone(c.doc), ops), c.name);
    } else {
      const result = apply(clone(c.doc), ops);
      assert.deepStrictEqual(result, c.expect);
      // After a JSON round trip too (what a client reads off the socket).
      const again = apply(JSON.parse(JSON.stringify(c.doc)), JSON.parse(JSON.stringify(c.ops)));
      assert.deepStrictEqual(again, c.expect);
    }
    assert.deepStrictEqual(ops, pristine, "apply must not modify the batch");
    ran.apply++;
  });
}

for (const c of VECTORS.encode) {
  test(`encode: ${c.name}`, () => {
    assert.equal(c.ops.length, c.wire.length);
    assert.ok(isBase(c.wire[0]) && isBase(c.ops[0]), "the first batch is a base batch");
    const dec = new Decoder();
    let doc = null;
    c.wire.forEach((wire, i) => {
      const frozen = deepFreeze(clone(wire));
      const batch = dec.decode(frozen);
      assert.deepStrictEqual(batch, c.ops[i], `batch ${i} decodes to the Op form`);
      doc = apply(doc, batch);
    });
    assert.deepStrictEqual(doc, c.final);
    // A fresh decoder started at any base batch reaches the same final (OPS.md §3).
    c.wire.forEach((wire, start) => {
      if (!isBase(wire)) return;
      const fresh = new Decoder();
      let value = null;
      for (const w of c.wire.slice(start)) value = apply(value, fresh.decode(clone(w)));
      assert.deepStrictEqual(value, c.final, `fresh decoder from base batch ${start}`);
    });
    ran.encode++;
  });
}

for (const c of VECTORS.bad_wire) {
  test(`bad_wire: ${c.name}`, () => {
    const dec = new Decoder();
    expectKind(c.error, () => {
      for (const wire of c.wire) dec.decode(clone(wire));
    }, c.name);
    ran.bad_wire++;
  });
}

test("every vector ran (none silently skipped)", (t) => {
  const recorderOnly = VECTORS.apply.filter((c) => c.side === "recorder").length;
  const expected = {
    apply: VECTORS.apply.length - recorderOnly,
    encode: VECTORS.encode.length,
    bad_wire: VECTORS.bad_wire.length,
  };
  t.diagnostic(
    `vectors ran: apply ${ran.apply}, encode ${ran.encode}, bad_wire ${ran.bad_wire}` +
      ` (skipped recorder-only: ${recorderOnly})`,
  );
  assert.deepStrictEqual(ran, expected);
});
