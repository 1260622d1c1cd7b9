// security.js under node --test: the token's way from the URL fragment into storage and the
// WebSocket's subprotocols, the signed-out check, and the terminal's OSC 8 link handler.
import { test } from "node:test";
import assert from "node:assert/strict";

import {
  splitFragment, takeToken, readToken, tokenProtocols, signedOut, linkAllowed, safeLinkHandler,
  TOKEN_KEY,
} from "../../../client/web/static/security.js";

class Store {
  constructor() { this.items = new Map(); }
  getItem(k) { return this.items.has(k) ? this.items.get(k) : null; }
  setItem(k, v) { this.items.set(k, String(v)); }
}

const TOKEN = "fGx-Abc_defGHIJKLmnopqrstuvwxyz0123456789ABC";

const exchanged = async () => ({ status: 204 }); // POST /signin: the exchange's marker was there

test("the fragment's token goes into storage and out of the address bar", async () => {
  const store = new Store();
  const replaced = [];
  const hist = { replaceState: (_s, _t, url) => replaced.push(url) };
  const loc = { pathname: "/", search: "", hash: `#token=${TOKEN}&session=s1` };
  assert.equal(await takeToken(loc, hist, store, exchanged), true);
  assert.equal(store.getItem(TOKEN_KEY), TOKEN);
  assert.deepStrictEqual(replaced, ["/#session=s1"]);
  assert.equal(readToken(store), TOKEN);
  assert.deepStrictEqual(tokenProtocols(TOKEN), ["dsh.v1", `dsh.token.${TOKEN}`]);
  assert.deepStrictEqual(tokenProtocols(null), ["dsh.v1"]);
  assert.equal(await takeToken({ pathname: "/", search: "", hash: "#session=s1" }, hist, store, exchanged), false);
  assert.equal(replaced.length, 1, "no token: the address bar is left alone");
  assert.deepStrictEqual(splitFragment(`#token=${TOKEN}`), { token: TOKEN, rest: "" });
});

test("a token of other characters is dropped from the address bar but not stored", async () => {
  const store = new Store();
  const replaced = [];
  const hist = { replaceState: (_s, _t, url) => replaced.push(url) };
  assert.equal(await takeToken({ pathname: "/", search: "", hash: "#token=a%20b<script>" }, hist, store, exchanged), false);
  assert.deepStrictEqual(replaced, ["/"]);
  assert.equal(store.getItem(TOKEN_KEY), null);
});

test("a foreign page's /#token=JUNK is dropped from the address bar and the good token kept", async () => {
  const store = new Store();
  store.setItem(TOKEN_KEY, TOKEN);
  const replaced = [];
  const hist = { replaceState: (_s, _t, url) => replaced.push(url) };
  const asked = [];
  const refused = async (url, init) => { asked.push([url, init.method, init.headers["X-Dsh-Token"]]); return { status: 403 }; };
  const junk = "JUNKjunkJUNKjunkJUNKjunk0123456789";
  const loc = { pathname: "/", search: "", hash: `#token=${junk}&session=s2` };
  assert.equal(await takeToken(loc, hist, store, refused), false);
  assert.deepStrictEqual(asked, [["/signin", "POST", junk]]);
  assert.deepStrictEqual(replaced, ["/#session=s2"]);
  assert.equal(store.getItem(TOKEN_KEY), TOKEN);
  assert.equal(readToken(store), TOKEN);
  const unreachable = async () => { throw new TypeError("failed to fetch"); };
  assert.equal(await takeToken({ ...loc }, hist, store, unreachable), false);
  assert.equal(store.getItem(TOKEN_KEY), TOKEN);
});

test("signed out: no token, or HEAD / answers 401; a bridge away is not signed out", async () => {
  assert.equal(await signedOut({ token: null, fetchFn: async () => ({ status: 200 }) }), true);
  assert.equal(await signedOut({ token: TOKEN, fetchFn: async () => ({ status: 401 }) }), true);
  assert.equal(await signedOut({ token: TOKEN, fetchFn: async () => ({ status: 200 }) }), false);
  assert.equal(await signedOut({ token: TOKEN, fetchFn: async () => { throw new TypeError("failed to fetch"); } }), false);
});

test("OSC 8 links: only http(s) open, with noopener,noreferrer; javascript: and others never", () => {
  const opened = [];
  const handler = safeLinkHandler((...args) => opened.push(args));
  let prevented = 0;
  const event = { preventDefault: () => prevented++ };
  for (const bad of ["javascript:alert(1)", "JAVASCRIPT:alert(1)", " javascript:alert(1)",
    "data:text/html,<script>alert(1)</script>", "file:///etc/passwd", "vbscript:x", "not a url", ""]) {
    handler.activate(event, bad);
    assert.equal(linkAllowed(bad), false, bad);
  }
  assert.deepStrictEqual(opened, []);
  handler.activate(event, "https://example.org/a?b");
  handler.activate(event, "http://127.0.0.1:9/");
  assert.deepStrictEqual(opened, [["https://example.org/a?b", "_blank", "noopener,noreferrer"],
    ["http://127.0.0.1:9/", "_blank", "noopener,noreferrer"]]);
  assert.equal(prevented, 10);
  assert.equal(handler.allowNonHttpProtocols, false);
});
