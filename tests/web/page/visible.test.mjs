// What the page shows of a command a person approves (client/web/static/dom.js visibleText):
// a right-to-left override (U+202E) made ": \u202e ; touch SPOOFED # ohce" read as an `echo`
// in the approval card (an outside attacker's finding); invisible and control characters must
// show as escapes, as `dsh approvals` shows them.
import { test } from "node:test";
import assert from "node:assert/strict";
import { visibleText, commandOf } from "../../../client/web/static/dom.js";

test("bidi overrides and isolates show as escapes", () => {
  assert.equal(visibleText(": \u202e ; touch x # ohce"), ": \\u202e ; touch x # ohce");
  for (const c of ["\u202a", "\u202b", "\u202c", "\u202d", "\u2066", "\u2067", "\u2068", "\u2069",
                   "\u200e", "\u200f", "\u061c"]) {
    assert.ok(!visibleText(`a${c}b`).includes(c), `U+${c.codePointAt(0).toString(16)}`);
  }
});

test("zero-width and control characters show as escapes; newlines and tabs stay", () => {
  assert.equal(visibleText("rm\u200b -rf"), "rm\\u200b -rf");
  assert.equal(visibleText("a\u0007b\u001bc\u007fd"), "a\\u0007b\\u001bc\\u007fd");
  assert.equal(visibleText("line1\nline2\tx"), "line1\nline2\tx");
  assert.equal(visibleText("ünïcödé 漢字 😀"), "ünïcödé 漢字 😀");
});

test("line and paragraph separators and the blank Hangul fillers show as escapes", () => {
  for (const c of ["\u2028", "\u2029", "\u115f", "\u1160", "\u3164", "\uffa0"]) {
    assert.equal(visibleText(`a${c}b`), `a\\u${c.codePointAt(0).toString(16).padStart(4, "0")}b`);
  }
});

test("commandOf makes a call's command visible too", () => {
  assert.equal(commandOf({ command: "echo \u202eabc" }), "echo \\u202eabc");
});
