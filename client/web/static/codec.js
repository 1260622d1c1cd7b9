// The wire layer of the ops vocabulary (docs/OPS.md §1–§3): OpError, the shape of ops and
// paths, and the wire Decoder. The JavaScript twin of protocol/errors.py, the shape half of
// protocol/ops.py and the decoding half of protocol/codec.py.
//
// Theory of operation: an op is a short array whose first element is its verb (OPS.md §2);
// `validateOp` checks its shape only (verb, arity, path syntax, reserved segments), whether it
// fits a document is apply's business (lane.js). On the wire a batch is a WireOp[] with two
// compressions the Decoder undoes: `["#", id, path]` defines path id `id` (0, 1, 2 … in
// order, reset by every `r`), an integer in an op's path position refers to a defined id, and
// a shortened op (one element fewer) reuses the path of the previous op in the same batch.
// `Decoder.decode(wire)` turns one wire batch into Op form (fresh path arrays; payloads are
// shared with the wire, apply copies what it inserts) and is atomic: a batch that throws
// leaves the table as it was. The table is bounded (MAX_TABLE ids).
//
// Every violation throws an OpError whose `kind` is the one the conformance vectors name.
// Pure: no I/O, no globals that change; usable in the browser and under Node.

/** Every kind an OpError may carry (OPS.md §2; `value` is the tracker's, kept for parity). */
export const OP_ERROR_KINDS = Object.freeze([
  "verb", "arity", "path", "reserved", "type", "range", "missing", "ref", "value",
]);

/** Path segments refused in any path, when decoded and when applied (OPS.md §1). */
export const RESERVED = Object.freeze(new Set(["__proto__", "constructor", "prototype"]));

/** Full length of each Op-form verb, verb included (OPS.md §2). */
export const ARITY = Object.freeze({ r: 2, s: 3, d: 2, a: 3, t: 3, p: 5 });

/** Bound on path ids per stream (OPS.md §3). */
export const MAX_TABLE = 65536;

/** Largest index a path may hold (2^53 − 1). */
export const MAX_SAFE_INT = Number.MAX_SAFE_INTEGER;

/** A violation of the ops contract; `kind` is one of OP_ERROR_KINDS, `detail` the sentence. */
export class OpError extends Error {
  constructor(kind, detail) {
    if (!OP_ERROR_KINDS.includes(kind)) {
      throw new Error(`bug: unknown OpError kind ${JSON.stringify(kind)}`);
    }
    super(`${kind}: ${detail}`);
    this.name = "OpError";
    this.kind = kind;
    this.detail = detail;
  }
}

/** A short printable form of any value, for error sentences (never throws). */
export function show(x) {
  try {
    const text = JSON.stringify(x);
    if (text === undefined) return String(x);
    return text.length > 80 ? text.slice(0, 77) + "..." : text;
  } catch {
    return String(x);
  }
}

/** True for a JSON number that is an integer (JavaScript cannot tell 1 from 1.0). */
export function isInteger(x) {
  return typeof x === "number" && Number.isInteger(x);
}

/** True when `verb` is one of the six Op-form verbs. */
export function isVerb(verb) {
  return typeof verb === "string" && Object.hasOwn(ARITY, verb);
}

/**
 * Check the syntax of one path (OPS.md §1): an array of segments, each a string key (not
 * reserved) or an integer index in 0..2^53−1 (a boolean is not an index). The empty path
 * (the root) only with `allowEmpty` (the `p` verb). Throws OpError `path` or `reserved`.
 */
export function checkPath(path, allowEmpty = false) {
  if (!Array.isArray(path)) {
    throw new OpError("path", `a path is an array of segments, got ${show(path)}`);
  }
  if (path.length === 0 && !allowEmpty) {
    throw new OpError("path", "the empty path (the root) is only valid for 'p'");
  }
  for (const seg of path) {
    if (typeof seg === "string") {
      if (RESERVED.has(seg)) {
        throw new OpError("reserved", `segment ${show(seg)} is reserved: ${show(path)}`);
      }
    } else if (isInteger(seg)) {
      if (seg < 0 || seg > MAX_SAFE_INT) {
        throw new OpError("path", `index ${seg} out of 0..2^53-1 in ${show(path)}`);
      }
    } else {
      throw new OpError(
        "path",
        `segment ${show(seg)} is neither a key (string) nor an index (integer) in ${show(path)}`,
      );
    }
  }
}

/**
 * Check the shape of one Op-form op: verb, arity and path (OPS.md §2). Payloads are apply's.
 * Throws OpError `type` (not an array), `arity`, `verb` (`"#"` included), `path`, `reserved`.
 */
export function validateOp(op) {
  if (!Array.isArray(op)) throw new OpError("type", `an op is an array, got ${show(op)}`);
  if (op.length === 0) throw new OpError("arity", "an empty op has no verb");
  const verb = op[0];
  if (!isVerb(verb)) {
    throw new OpError("verb", `unknown verb ${show(verb)} (expected one of r, s, d, a, t, p)`);
  }
  if (op.length !== ARITY[verb]) {
    throw new OpError("arity", `'${verb}' takes ${ARITY[verb]} elements, got ${op.length}`);
  }
  if (verb !== "r") checkPath(op[1], verb === "p");
}

/**
 * Wire batches in, Op-form batches out, for one stream (OPS.md §3). One Decoder per stream
 * and per subscription; a fresh one may start at any base batch.
 */
export class Decoder {
  constructor() {
    this._table = []; // path id -> frozen path array, since the last base
  }

  /** Op form of one wire batch. Throws OpError; then the table is as it was. */
  decode(wire) {
    if (!Array.isArray(wire)) {
      throw new OpError("type", `a batch is an array of wire ops, got ${show(wire)}`);
    }
    const start = this._table.length;
    let result;
    try {
      result = this._decode(wire);
    } catch (err) {
      this._table.length = start; // undo the definitions this batch made before the error
      throw err;
    }
    this._table = result.table;
    return result.out;
  }

  /** Ids defined since the last base (like protocol.codec.Decoder.statistics). */
  statistics() {
    return { table: this._table.length };
  }

  _decode(wire) {
    let table = this._table; // appended in place until an "r" starts a new one
    const out = [];
    let prev = null;
    for (let i = 0; i < wire.length; i++) {
      try {
        const w = wire[i];
        if (!Array.isArray(w)) throw new OpError("type", `a wire op is an array, got ${show(w)}`);
        if (w.length === 0) throw new OpError("arity", "an empty op has no verb");
        const verb = w[0];
        if (verb === "#") {
          defineId(table, w);
          continue;
        }
        if (!isVerb(verb)) throw new OpError("verb", `unknown wire verb ${show(verb)}`);
        if (verb === "r") {
          if (w.length !== 2) throw new OpError("arity", `'r' takes 2 elements, got ${w.length}`);
          table = [];
          prev = null;
          out.push(["r", w[1]]);
          continue;
        }
        const full = ARITY[verb];
        let path;
        let op;
        if (w.length === full) {
          path = resolvePath(table, w[1]);
          op = [verb, path.slice(), ...w.slice(2)];
        } else if (w.length === full - 1) {
          if (prev === null) throw new OpError("ref", "shortened op with no previous op in this batch");
          path = prev;
          op = [verb, path.slice(), ...w.slice(1)];
        } else {
          throw new OpError(
            "arity",
            `'${verb}' takes ${full} elements (${full - 1} shortened), got ${w.length}`,
          );
        }
        validateOp(op); // the empty path for s/d/a/t
        out.push(op);
        prev = path;
      } catch (err) {
        if (err instanceof OpError) throw new OpError(err.kind, `wire op ${i}: ${err.detail}`);
        throw err;
      }
    }
    return { table, out };
  }
}

/** Apply one `["#", id, path]` definition to `table` (mutates it). */
function defineId(table, w) {
  if (w.length !== 3) throw new OpError("arity", `'#' takes 3 elements, got ${w.length}`);
  const [, ident, path] = w;
  if (!isInteger(ident)) throw new OpError("ref", `definition id ${show(ident)} is not an integer`);
  if (ident !== table.length) {
    throw new OpError("ref", `definition id ${ident}, expected ${table.length}`);
  }
  if (ident >= MAX_TABLE) throw new OpError("range", `path table full (${MAX_TABLE} ids)`);
  checkPath(path, true);
  table.push(Object.freeze(path.slice()));
}

/** The path a full-form wire op names: an inline path array or a defined id. */
function resolvePath(table, ref) {
  if (isInteger(ref)) {
    if (ref < 0 || ref >= table.length) {
      throw new OpError("ref", `path ref ${ref} undefined (${table.length} ids)`);
    }
    return table[ref];
  }
  if (Array.isArray(ref)) {
    checkPath(ref, true);
    return Object.freeze(ref.slice());
  }
  throw new OpError("path", `path position holds ${show(ref)}: not an array or an id`);
}
