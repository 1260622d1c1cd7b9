// The page's SGR renderer (client/web/static/ansi.js), its pure half: parseAnsi and applySgr.
import { test } from "node:test";
import assert from "node:assert/strict";
import { parseAnsi, applySgr } from "../../../client/web/static/ansi.js";

const fresh = () => ({ fg: null, bg: null, bold: false, dim: false, italic: false, underline: false, inverse: false });
const texts = (r) => r.runs.map((x) => x.text).join("");

test("plain text is one run, unstyled", () => {
  const r = parseAnsi("hello\nworld\n", fresh());
  assert.equal(texts(r), "hello\nworld\n");
  assert.equal(r.runs.length, 1);
  assert.equal(r.runs[0].style.fg, null);
  assert.equal(r.pending, "");
});

test("SGR colours split the runs and reset", () => {
  const r = parseAnsi("a\x1b[31mred\x1b[0m b\x1b[1;92mbright\x1b[m", fresh());
  assert.deepEqual(r.runs.map((x) => [x.text, x.style.fg, x.style.bold]),
    [["a", null, false], ["red", 1, false], [" b", null, false], ["bright", 10, true]]);
});

test("256 and true colours, background, inverse", () => {
  const s = fresh();
  applySgr(s, [38, 5, 208, 48, 2, 1, 2, 3, 7]);
  assert.equal(s.fg, 208);
  assert.equal(s.bg, "rgb(1,2,3)");
  assert.equal(s.inverse, true);
  applySgr(s, [39, 49, 27]);
  assert.deepEqual(s, { ...fresh() });
});

test("other escapes and controls are dropped; newline and tab kept", () => {
  const r = parseAnsi("\x1b]0;title\x07x\x1b[2K\x1b[1A\ry\tz\x07\x1b(B!\n", fresh());
  assert.equal(texts(r), "xy\tz!\n");
});

test("an escape split across chunks waits for the next chunk", () => {
  const style = fresh();
  const a = parseAnsi("one \x1b[3", style);
  assert.equal(texts(a), "one ");
  assert.equal(a.pending, "\x1b[3");
  const b = parseAnsi(a.pending + "2mgreen", style);
  assert.equal(texts(b), "green");
  assert.equal(b.runs[0].style.fg, 2);
});

test("an unfinished escape longer than the bound is dropped, not kept forever", () => {
  const r = parseAnsi("x\x1b]" + "a".repeat(1000), fresh());
  assert.equal(texts(r), "x");
  assert.equal(r.pending, "");
});

test("a carriage return is a {cr} run; \\r\\n a newline; a final \\r waits", () => {
  const r = parseAnsi("one\rtwo\r\nthree\r", fresh());
  assert.deepEqual(r.runs.map((x) => (x.cr ? "<cr>" : x.text)), ["one", "<cr>", "two\nthree"]);
  assert.equal(r.pending, "\r");
});
