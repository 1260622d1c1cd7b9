// Mirror a dshd view from its op batches (docs/OPS.md): apply, isBase, Mirror. The JavaScript
// twin of protocol/apply.py, protocol/mirror.py and the value half of protocol/ops.py; the
// wire Decoder and OpError live in codec.js and are re-exported here, so a client imports one
// module.
//
// Theory of operation: a client owns one plain JSON value (objects, arrays, strings, numbers,
// booleans, null) and applies every batch of a stream to it in order. `apply(doc, batch)`
// walks each op's path from the root, checks everything (verb, arity, path syntax, reserved
// segments, target type, ranges, payload types) and changes the containers of `doc` in place;
// only `r` replaces the root, which is why apply returns the (possibly new) root. Values that
// ops insert (`s`, `p` items, `r`) are checked and deep-copied, so the value never shares a
// container with the batch, and the batch is never modified: applying one batch to two
// values is safe. A violation throws OpError with the kind the conformance vectors name; the
// ops before the failing one have been applied, so the value is then suspect (drop it, wait
// for a base batch). Object keys are looked up as own properties only, never through the
// prototype chain, and reserved segments never reach a property access.
//
// Strings count Unicode code points (Python str indices), never UTF-16 units (OPS.md §1):
// `t` drops code points, and a surrogate pair is one char.
//
// As a receiver, apply accepts every finite JSON number (integers beyond 2^53−1 included:
// JavaScript cannot tell them from floats); the `side: "recorder"` vectors are not its job.
//
// `Mirror` is the consumer half of a stream (OPS.md §4): `applyBatch(seq, wireOps)` decodes
// with its own Decoder and applies; a base batch starts over with a fresh decoder and value;
// a delta before any base, a seq gap, a decode or apply error resets it and throws
// MirrorBroken, and the caller subscribes again. Pure and synchronous: no I/O.

import { OpError, Decoder, validateOp, isInteger, show } from "./codec.js";

export {
  OpError, Decoder, validateOp, checkPath, isInteger, OP_ERROR_KINDS, RESERVED, ARITY,
  MAX_TABLE, MAX_SAFE_INT,
} from "./codec.js";

/** True when `batch` is a base batch: its first op's verb is `r` (OPS.md §2). */
export function isBase(batch) {
  return Array.isArray(batch) && batch.length > 0 && Array.isArray(batch[0]) && batch[0][0] === "r";
}

// --- values (OPS.md §1) ------------------------------------------------------------------

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

function wellFormed(s) {
  return typeof s.isWellFormed === "function" ? s.isWellFormed() : !LONE_SURROGATE.test(s);
}

function isPlainObject(x) {
  if (x === null || typeof x !== "object" || Array.isArray(x)) return false;
  const proto = Object.getPrototypeOf(x);
  return proto === Object.prototype || proto === null;
}

/** What is wrong with a scalar (a string), null when it is fine, CONTAINER for array/object. */
const CONTAINER = Symbol("container");
function scalarProblem(v) {
  switch (typeof v) {
    case "string":
      return wellFormed(v) ? null : "string holds a lone surrogate (not encodable as UTF-8)";
    case "boolean":
      return null;
    case "number":
      return Number.isFinite(v) ? null : `number ${v} is not finite`;
    case "object":
      if (v === null) return null;
      if (Array.isArray(v) || isPlainObject(v)) return CONTAINER;
      return `${Object.prototype.toString.call(v)} is not a JSON value`;
    default:
      return `${typeof v} is not one of null, boolean, number, string, array, object`;
  }
}

function setOwn(obj, key, value) {
  if (key === "__proto__") {
    Object.defineProperty(obj, key, { value, writable: true, enumerable: true, configurable: true });
  } else {
    obj[key] = value;
  }
}

function badValue(kind, where, what) {
  const loc = "$" + where.map((k) => `[${show(k)}]`).join("");
  return new OpError(kind, `not a JSON value at ${loc}: ${what}`);
}

/**
 * Check `value` as a JSON value and return a deep copy of it (arrays and objects new, scalars
 * shared). Iterative: a 100,000-deep value is an ordinary value, a cycle an error. Throws
 * OpError(kind).
 */
export function copyJsonValue(value, kind = "type") {
  const problem = scalarProblem(value);
  if (problem === null) return value;
  if (problem !== CONTAINER) throw badValue(kind, [], problem);
  const root = Array.isArray(value) ? [] : {};
  const where = [];
  const active = new Set([value]);
  const stack = [frame(value, root)];
  while (stack.length > 0) {
    const top = stack[stack.length - 1];
    if (top.i === top.keys.length) {
      stack.pop();
      active.delete(top.src);
      where.pop();
      continue;
    }
    const key = top.keys[top.i++];
    const v = top.src[key];
    if (!top.isArray && !wellFormed(key)) throw badValue(kind, where, "object key holds a lone surrogate");
    const p = scalarProblem(v);
    if (p === null) {
      setChild(top, key, v);
      continue;
    }
    if (p !== CONTAINER) throw badValue(kind, [...where, key], p);
    if (active.has(v)) throw badValue(kind, [...where, key], "the value contains itself (a cycle)");
    const child = Array.isArray(v) ? [] : {};
    setChild(top, key, child);
    active.add(v);
    where.push(key);
    stack.push(frame(v, child));
  }
  return root;
}

function frame(src, dst) {
  const isArray = Array.isArray(src);
  return { src, dst, isArray, keys: isArray ? src.map((_, i) => i) : Object.keys(src), i: 0 };
}

function setChild(top, key, v) {
  if (top.isArray) top.dst.push(v);
  else setOwn(top.dst, key, v);
}

// --- code points ---------------------------------------------------------------------------

/** How many UTF-16 units the code point at `i` of `s` takes (a lone surrogate is one). */
function unitsAt(s, i) {
  const c = s.charCodeAt(i);
  if (c < 0xd800 || c > 0xdbff || i + 1 >= s.length) return 1;
  const next = s.charCodeAt(i + 1);
  return next >= 0xdc00 && next <= 0xdfff ? 2 : 1;
}

/** The UTF-16 offset just after the first `n` code points of `s`, or -1 if `s` has fewer. */
function codePointOffset(s, n) {
  let i = 0;
  for (let seen = 0; seen < n; seen++) {
    if (i >= s.length) return -1;
    i += unitsAt(s, i);
  }
  return i;
}

/** The length of `s` in code points. */
export function codePointLength(s) {
  let n = 0;
  for (let i = 0; i < s.length; n++) i += unitsAt(s, i);
  return n;
}

// --- apply (OPS.md §2) ----------------------------------------------------------------------

function kindName(x) {
  if (x === null) return "null";
  if (Array.isArray(x)) return "array";
  return typeof x;
}

function isObjectNode(x) {
  return x !== null && typeof x === "object" && !Array.isArray(x);
}

/** The child of `node` at `seg`; throws `path`, `missing` or `range`. */
function step(node, seg) {
  if (Array.isArray(node)) {
    if (!isInteger(seg)) throw new OpError("path", `key ${show(seg)} used on an array (indexes are integers)`);
    if (seg >= node.length) throw new OpError("range", `index ${seg} out of range for an array of ${node.length}`);
    return node[seg];
  }
  if (isObjectNode(node)) {
    if (typeof seg !== "string") throw new OpError("path", `index ${show(seg)} used on an object (keys are strings)`);
    if (!Object.hasOwn(node, seg)) throw new OpError("missing", `no key ${show(seg)}`);
    return node[seg];
  }
  throw new OpError("path", `cannot step into a ${kindName(node)} with ${show(seg)}`);
}

function parentOf(doc, path) {
  let node = doc;
  for (let i = 0; i < path.length - 1; i++) node = step(node, path[i]);
  return [node, path[path.length - 1]];
}

function resolve(doc, path) {
  let node = doc;
  for (const seg of path) node = step(node, seg);
  return node;
}

function count(x, what) {
  if (!isInteger(x) || x < 0) throw new OpError("type", `${what} must be an integer >= 0, got ${show(x)}`);
  return x;
}

function applySet(doc, path, raw) {
  const value = copyJsonValue(raw, "type");
  const [parent, key] = parentOf(doc, path);
  if (Array.isArray(parent)) {
    if (!isInteger(key)) throw new OpError("path", `key ${show(key)} used on an array (indexes are integers)`);
    if (key > parent.length) {
      throw new OpError("range", `index ${key} > length ${parent.length} (set appends at most at len)`);
    }
    parent[key] = value; // key === length appends
  } else if (isObjectNode(parent)) {
    if (typeof key !== "string") throw new OpError("path", `index ${show(key)} used on an object (keys are strings)`);
    setOwn(parent, key, value);
  } else {
    throw new OpError("path", `cannot set ${show(key)} inside a ${kindName(parent)}`);
  }
}

function applyDelete(doc, path) {
  const [parent, key] = parentOf(doc, path);
  if (Array.isArray(parent)) throw new OpError("type", "'d' deletes object keys; arrays shrink only through 'p'");
  if (!isObjectNode(parent)) throw new OpError("path", `cannot delete ${show(key)} inside a ${kindName(parent)}`);
  if (typeof key !== "string") throw new OpError("path", `index ${show(key)} used on an object (keys are strings)`);
  if (!Object.hasOwn(parent, key)) throw new OpError("missing", `no key ${show(key)} to delete`);
  delete parent[key];
}

function applyAppend(doc, path, text) {
  if (typeof text !== "string") throw new OpError("type", `'a' appends a string, got ${kindName(text)}`);
  copyJsonValue(text, "type"); // no lone surrogates
  const [parent, key] = parentOf(doc, path);
  const cur = step(parent, key);
  if (typeof cur !== "string") throw new OpError("type", `'a' needs a string target, found a ${kindName(cur)}`);
  if (text) parent[key] = cur + text;
}

function applyTruncate(doc, path, raw) {
  const n = count(raw, "'t' count");
  const [parent, key] = parentOf(doc, path);
  const cur = step(parent, key);
  if (typeof cur !== "string") throw new OpError("type", `'t' needs a string target, found a ${kindName(cur)}`);
  const at = codePointOffset(cur, n);
  if (at < 0) throw new OpError("range", `'t' count ${n} > string length ${codePointLength(cur)}`);
  if (n) parent[key] = cur.slice(at);
}

function applySplice(doc, path, rawIndex, rawRemove, rawItems) {
  const index = count(rawIndex, "'p' index");
  const remove = count(rawRemove, "'p' remove count");
  if (!Array.isArray(rawItems)) throw new OpError("type", `'p' items must be an array, got ${kindName(rawItems)}`);
  const items = copyJsonValue(rawItems, "type");
  const target = resolve(doc, path);
  if (!Array.isArray(target)) throw new OpError("type", `'p' needs an array target, found a ${kindName(target)}`);
  const n = target.length;
  if (index > n) throw new OpError("range", `'p' index ${index} > length ${n}`);
  if (remove > n - index) throw new OpError("range", `'p' removes ${remove} from index ${index} of length ${n}`);
  // No spread of `items` into one call: a big splice must not overflow the argument stack.
  const tail = target.splice(index);
  for (const item of items) target.push(item);
  for (let i = remove; i < tail.length; i++) target.push(tail[i]);
}

function applyOne(doc, op) {
  validateOp(op);
  switch (op[0]) {
    case "r":
      return copyJsonValue(op[1], "type");
    case "s":
      applySet(doc, op[1], op[2]);
      break;
    case "d":
      applyDelete(doc, op[1]);
      break;
    case "a":
      applyAppend(doc, op[1], op[2]);
      break;
    case "t":
      applyTruncate(doc, op[1], op[2]);
      break;
    default: // "p"
      applySplice(doc, op[1], op[2], op[3], op[4]);
  }
  return doc;
}

function describe(op) {
  if (!Array.isArray(op) || op.length === 0) return "";
  return op[0] === "r" ? `(${show(op[0])})` : `(${show(op[0])} at ${show(op[1])})`;
}

/**
 * Apply `batch` (an array of Op-form ops) in order to `doc`; return the new root. Containers
 * of `doc` change in place; the return value differs from `doc` only when an `r` replaced the
 * root. `batch` is never modified. Throws OpError naming the failing op's index; the ops
 * before it have been applied.
 */
export function apply(doc, batch) {
  if (!Array.isArray(batch)) throw new OpError("type", `a batch is an array of ops, got ${show(batch)}`);
  for (let i = 0; i < batch.length; i++) {
    try {
      doc = applyOne(doc, batch[i]);
    } catch (err) {
      if (err instanceof OpError) throw new OpError(err.kind, `op ${i} ${describe(batch[i])}: ${err.detail}`);
      throw err;
    }
  }
  return doc;
}

// --- the mirror (OPS.md §4) ---------------------------------------------------------------

/** The mirror cannot follow the stream any more; subscribe again for a base batch. */
export class MirrorBroken extends Error {
  constructor(reason, seq = null) {
    super(reason);
    this.name = "MirrorBroken";
    this.reason = reason;
    this.seq = seq;
  }
}

/**
 * The value of one view, following its batches. `value` is null until the first base batch;
 * `seq` the seq of the last batch applied (null before any); `lastOps` the decoded ops of that
 * batch (Op form), for callers that want to see how the value changed.
 */
export class Mirror {
  constructor() {
    this.reset();
  }

  /** True once a base batch has been applied (and no error since). */
  get ready() {
    return this.seq !== null;
  }

  /** Forget everything; the next batch must be a base batch. */
  reset() {
    this._decoder = null;
    this.value = null;
    this.seq = null;
    this.lastOps = [];
  }

  /** Apply one batch of wire ops. Throws MirrorBroken (and resets) when it cannot. */
  applyBatch(seq, wireOps) {
    let decoder = this._decoder;
    let value = this.value;
    if (isBase(wireOps)) {
      decoder = new Decoder();
      value = null;
    } else if (this.seq === null || decoder === null) {
      this.reset();
      throw new MirrorBroken("delta batch before any base batch", seq);
    } else if (seq !== this.seq + 1) {
      const expected = this.seq + 1;
      this.reset();
      throw new MirrorBroken(`seq gap: expected ${expected}, got ${seq}`, seq);
    }
    let ops;
    try {
      ops = decoder.decode(wireOps);
      value = apply(value, ops);
    } catch (err) {
      this.reset();
      const detail = err instanceof OpError ? err.message : `${err && err.name}: ${err && err.message}`;
      throw new MirrorBroken(`batch ${seq} failed: ${detail}`, seq);
    }
    this._decoder = decoder;
    this.value = value;
    this.seq = seq;
    this.lastOps = ops;
  }

  /** The Python name (protocol/mirror.py `Mirror.feed`). */
  feed(seq, wireOps) {
    this.applyBatch(seq, wireOps);
  }
}
