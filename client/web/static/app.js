// app.js: the page's entry point (issue 16): one RpcConnection to the bridge's /ws, the
// connection banner, the sessions list and the selected session's view.
//
// Theory of operation: RpcConnection (rpc.js) sends initialize (approvals: true) on every
// (re)connect and reconnects forever with backoff. While it is open the status reads
// "connected" and the sessions list polls; when the WebSocket closes (the bridge went away,
// or dshd did: close 4000/4001 with a reason) the banner shows "connection lost,
// reconnecting…" (or the reason: "dshd is not running, reconnecting…"; the close code is in
// the status's title), the list stops polling, and nothing is reloaded: on the next open the list polls
// again, the session's LaneView subscribes again (fresh base batch) and every OutputFollower
// follows again from its next byte offset. The selected session is kept in the URL's hash
// (#session=ID), so a reload shows the same one; without one the newest session is shown.
// window.dshMirror() returns the selected session's lane mirror (tests compare it).
// Sign-in (security.js): the token arrives in the fragment (#token=T), moves to localStorage
// and is offered as a WebSocket subprotocol at each connect; a page without a token, or whose
// cookie the bridge refuses (HEAD / -> 401), shows "signed out: open the URL dsh web printed"
// (status data-state "signed-out") instead of "reconnecting…".

import * as rpc from "./rpc.js";
import { SIGNED_OUT, readToken, signedOut, takeToken, tokenProtocols } from "./security.js";
import { SessionList } from "./sessions.js";
import { SessionView } from "./session.js";
import { el } from "./dom.js";

const MAX_NOTES = 5;

function wsUrl() {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${location.host}/ws`;
}

function selectedFromHash() {
  const m = /session=([A-Za-z0-9_-]{1,64})/.exec(location.hash);
  return m ? m[1] : null;
}

class App {
  constructor() {
    this.status = document.querySelector("[data-testid=conn-status]");
    this.banner = document.getElementById("banner");
    this.notes = document.getElementById("notes");
    this.main = document.getElementById("session");
    this.view = null;
    takeToken(); // /#token=T (the token exchange's redirect) -> localStorage, off the address bar
    this.conn = new rpc.RpcConnection(wsUrl(), {
      WebSocket: window.WebSocket,
      protocols: () => tokenProtocols(),
      onOpen: () => this.opened(),
      onClose: (reason) => this.closed(reason),
    });
    this.list = new SessionList(document.querySelector("[data-testid=session-list]"), {
      request: (method, params) => this.conn.request(method, params),
      onSelect: (id) => this.select(id),
    });
    window.dshMirror = () => this.view?.mirror() ?? null;
    window.addEventListener("hashchange", () => {
      const id = selectedFromHash();
      if (id && id !== this.view?.sessionId) this.select(id);
    });
    this.setStatus("connecting", "connecting…");
    const first = selectedFromHash();
    if (first) this.select(first);
    this.waitForFirstList();
  }

  setStatus(state, text) {
    this.status.textContent = text;
    this.status.dataset.state = state;
    document.body.dataset.conn = state;
    this.banner.hidden = state === "open";
    this.banner.textContent = state === "open" ? "" : text;
  }

  opened() {
    this.setStatus("open", "connected");
    this.status.title = "";
    this.list.start();
  }

  /** The WebSocket closed ({code, reason}: 4000/4001 name dshd, 1006 a bridge gone or a
   * refused handshake). Without a stored token, or when `HEAD /` says 401 (the cookie is gone
   * or older than the token), the page is signed out: no reconnect can help, so it says what
   * will (it keeps trying quietly: a sign-in in another tab stores a fresh token). */
  closed(info) {
    this.list.stop();
    // People's words in the text ("dshd is not running" is one); the close code in the title.
    const lost = info?.reason ? `${info.reason}, reconnecting…` : "connection lost, reconnecting…";
    this.status.title = info?.code ? `WebSocket closed ${info.code}${info.reason ? `: ${info.reason}` : ""}` : "";
    if (!readToken()) return this.setStatus("signed-out", SIGNED_OUT);
    if (this.status.dataset.state !== "signed-out") this.setStatus("closed", lost);
    if (info?.code !== 1006) return;
    signedOut().then((out) => {
      if (this.conn.state === "open") return;
      if (out) this.setStatus("signed-out", SIGNED_OUT);
      else if (this.status.dataset.state === "signed-out") this.setStatus("closed", "connection lost, reconnecting…");
    });
  }

  /** Without a session in the hash, show the newest one as soon as the list has one. */
  waitForFirstList() {
    const tick = () => {
      if (this.view) return;
      const newest = this.list.newest();
      if (newest) this.select(newest);
      else setTimeout(tick, 250);
    };
    tick();
  }

  select(id) {
    if (this.view?.sessionId === id) return;
    this.view?.close();
    this.list.mark(id);
    if (location.hash !== `#session=${id}`) history.replaceState(null, "", `#session=${id}`);
    this.view = new SessionView(this.main, { conn: this.conn, sessionId: id, rpc,
      onError: (text) => this.note(text) });
  }

  note(text) {
    this.notes.prepend(el("div", { class: "note", testid: "note",
      on: { click: (ev) => ev.currentTarget.remove() } }, text));
    while (this.notes.childElementCount > MAX_NOTES) this.notes.lastElementChild.remove();
  }
}

window.dshApp = new App();
