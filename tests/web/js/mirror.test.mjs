// lane.js beyond the vectors: what a JavaScript receiver must get right that the vectors
// cannot pin (the prototype chain, big splices, lone surrogates), the Decoder's atomicity
// and bound, and Mirror's seq/base/reset rules (protocol/mirror.py's twin).
import { test } from "node:test";
import assert from "node:assert/strict";

import {
  apply, Decoder, Mirror, MirrorBroken, OpError, isBase, copyJsonValue, codePointLength, MAX_TABLE,
} from "../../../client/web/static/lane.js";

function kindOf(fn) {
  try {
    fn();
  } catch (err) {
    assert.ok(err instanceof OpError, `expected an OpError, got ${err}`);
    return err.kind;
  }
  assert.fail("expected an OpError, nothing was thrown");
}

test("keys of Object.prototype are missing, not found through the chain", () => {
  for (const key of ["toString", "hasOwnProperty", "valueOf", "__defineGetter__"]) {
    assert.equal(kindOf(() => apply({}, [["a", [key], "x"]])), "missing", key);
    assert.equal(kindOf(() => apply({}, [["d", [key]]])), "missing", key);
    assert.equal(kindOf(() => apply({}, [["s", [key, "x"], 1]])), "missing", key);
  }
  assert.deepStrictEqual(apply({}, [["s", ["toString"], 1]]), { toString: 1 });
});

test("a __proto__ key inside a value stays an own key and never touches a prototype", () => {
  const batch = JSON.parse('[["s", ["k"], {"__proto__": {"polluted": true}}]]');
  const doc = apply({}, batch);
  assert.ok(Object.hasOwn(doc.k, "__proto__"));
  assert.equal(Object.getPrototypeOf(doc.k), Object.prototype);
  assert.equal({}.polluted, undefined);
  assert.equal(doc.k.polluted, undefined);
});

test("inserted values are copies: changing the doc leaves the batch alone", () => {
  const batch = [["s", ["k"], { list: [1] }], ["p", ["l"], 0, 0, [{ x: 1 }]]];
  const doc = apply({ l: [] }, batch);
  doc.k.list.push(2);
  doc.l[0].x = 9;
  assert.deepStrictEqual(batch, [["s", ["k"], { list: [1] }], ["p", ["l"], 0, 0, [{ x: 1 }]]]);
  const root = [["r", { a: [] }]];
  apply(null, root).a.push(1);
  assert.deepStrictEqual(root, [["r", { a: [] }]]);
});

test("a splice of 300,000 items does not overflow the argument stack", () => {
  const items = Array.from({ length: 300000 }, (_, i) => i);
  const doc = apply({ l: ["a", "b", "c"] }, [["p", ["l"], 1, 1, items]]);
  assert.equal(doc.l.length, 300002);
  assert.equal(doc.l[0], "a");
  assert.equal(doc.l[1], 0);
  assert.equal(doc.l[300001], "c");
});

test("a deep value is copied without recursion; a cycle is a type error", () => {
  let deep = [];
  for (let i = 0; i < 100000; i++) deep = [deep];
  const doc = apply(null, [["r", deep]]);
  assert.notEqual(doc, deep);
  const cyclic = { a: [] };
  cyclic.a.push(cyclic);
  assert.equal(kindOf(() => apply({}, [["s", ["x"], cyclic]])), "type");
});

test("non-JSON values are type errors; big finite numbers are accepted (a receiver)", () => {
  for (const bad of [NaN, Infinity, undefined, () => 1, new Date(0), new Map(), 1n, "\ud800x"]) {
    assert.equal(kindOf(() => apply({}, [["s", ["x"], bad]])), "type", String(bad));
  }
  assert.equal(kindOf(() => apply({ t: "" }, [["a", ["t"], "\udc00"]])), "type");
  assert.deepStrictEqual(apply({}, [["s", ["x"], 2 ** 60]]), { x: 2 ** 60 });
});

test("code points: t past the string counts code points in its sentence", () => {
  assert.equal(codePointLength("a\u{1F600}b"), 3);
  assert.equal(kindOf(() => apply({ t: "\u{1F600}" }, [["t", ["t"], 2]])), "range");
  assert.deepStrictEqual(apply({ t: "\u{1F600}" }, [["t", ["t"], 1]]), { t: "" });
});

test("a decoder error leaves its table as it was (atomic per batch)", () => {
  const dec = new Decoder();
  dec.decode([["r", { a: "", b: "" }]]);
  assert.equal(kindOf(() => dec.decode([["#", 0, ["a"]], ["a", 0, "x"], ["zz"]])), "verb");
  assert.equal(dec.statistics().table, 0);
  assert.deepStrictEqual(dec.decode([["#", 0, ["b"]], ["a", 0, "y"]]), [["a", ["b"], "y"]]);
});

test("the decoder's path table is bounded", () => {
  const dec = new Decoder();
  const wire = [["r", {}]];
  for (let i = 0; i < MAX_TABLE; i++) wire.push(["#", i, ["k"]]);
  dec.decode(wire);
  assert.equal(dec.statistics().table, MAX_TABLE);
  assert.equal(kindOf(() => dec.decode([["#", MAX_TABLE, ["k"]]])), "range");
});

test("isBase is exactly: the first op's verb is r", () => {
  assert.equal(isBase([["r", 1]]), true);
  assert.equal(isBase([["s", ["a"], 1], ["r", 1]]), false);
  assert.equal(isBase([]), false);
  assert.equal(isBase("r"), false);
});

test("Mirror follows base and deltas, and breaks on a seq gap, then heals on a base", () => {
  const m = new Mirror();
  assert.equal(m.ready, false);
  m.applyBatch(0, [["r", { out: "" }]]);
  m.applyBatch(1, [["a", ["out"], "a"]]);
  m.applyBatch(2, [["#", 0, ["out"]], ["a", 0, "b"]]);
  assert.deepStrictEqual(m.value, { out: "ab" });
  assert.deepStrictEqual(m.lastOps, [["a", ["out"], "b"]]);
  assert.throws(() => m.applyBatch(4, [["a", 0, "c"]]), (e) => e instanceof MirrorBroken && /seq gap/.test(e.reason) && e.seq === 4);
  assert.equal(m.ready, false);
  assert.equal(m.value, null);
  m.applyBatch(7, [["r", { out: "x" }]]);
  m.applyBatch(8, [["a", ["out"], "y"]]);
  assert.deepStrictEqual(m.value, { out: "xy" });
});

test("Mirror breaks on a delta before any base, a decode error and an apply error", () => {
  const m = new Mirror();
  assert.throws(() => m.applyBatch(3, [["a", ["out"], "x"]]), (e) => e instanceof MirrorBroken && /before any base/.test(e.reason));
  m.applyBatch(0, [["r", { out: "" }]]);
  assert.throws(() => m.applyBatch(1, [["a", 5, "x"]]), (e) => e instanceof MirrorBroken && /ref/.test(e.reason));
  assert.equal(m.ready, false);
  m.applyBatch(0, [["r", { out: "" }]]);
  assert.throws(() => m.applyBatch(1, [["t", ["out"], 3]]), (e) => e instanceof MirrorBroken && /range/.test(e.reason));
  assert.equal(m.value, null);
  assert.throws(() => m.applyBatch(0, "nonsense"), (e) => e instanceof MirrorBroken);
});

test("copyJsonValue keeps strings and numbers, copies containers", () => {
  const v = { a: [1, "x", null, true, { b: 2.5 }] };
  const c = copyJsonValue(v);
  assert.deepStrictEqual(c, v);
  assert.notEqual(c.a, v.a);
  assert.notEqual(c.a[4], v.a[4]);
});
