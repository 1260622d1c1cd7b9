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
// While not connected the live parts (the sessions and the session, one <fieldset>) are dimmed
// and disabled, so nothing that would send can be pressed or typed into, and the banner says
// why and what to do (start dshd / dsh web again; the page reconnects by itself).
// Sign-in (security.js): the token arrives in the fragment (#token=T) and is kept in
// localStorage only when the bridge confirms its exchange handed it out (POST /signin); the
// connection starts after that check. It is offered as a WebSocket subprotocol at each
// connect; a page without a token, or whose cookie the bridge refuses (HEAD / -> 401), shows
// "signed out: open the URL dsh web printed" (status data-state "signed-out"), the banner
// says which URL and where to find it, and the connection is held (no retry loop) until the
// person comes back to the tab (focus, visibility) or another tab stores a token.
// Approvals of other sessions: ApprovalNotices (notices.js) shows each with its session and
// command and a button that opens that session.

import * as rpc from "./rpc.js";
import { SIGNED_OUT, TOKEN_KEY, readToken, signInHelp, signedOut, takeToken, tokenProtocols } from "./security.js";
import { ApprovalNotices } from "./notices.js";
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

/** The banner's words while away: who is unreachable, what the page does, what to do. */
function awayHelp(info) {
  const dshd = info?.code === 4000 || info?.code === 4001;
  const who = dshd ? `${info.reason || "dshd is not reachable"}: start dshd again`
    : "dsh web is not answering (stopped, or the network dropped): start `dsh web` again";
  return `${who}; this page reconnects by itself. Until then it is dimmed and nothing you ` +
    "type or press is sent (nothing is queued to run later).";
}

class App {
  constructor() {
    this.status = document.querySelector("[data-testid=conn-status]");
    this.banner = document.getElementById("banner");
    this.notes = document.getElementById("notes");
    this.main = document.getElementById("session");
    this.live = document.querySelector("[data-testid=live]");
    this.view = null;
    this.setStatus("connecting", "connecting…");
    // /#token=T off the address bar at once; into localStorage only if the exchange handed it out.
    takeToken().finally(() => this.start());
  }

  start() {
    this.conn = new rpc.RpcConnection(wsUrl(), {
      WebSocket: window.WebSocket,
      protocols: () => tokenProtocols(),
      onOpen: () => this.opened(),
      onClose: (reason) => this.closed(reason),
    });
    this.list = new SessionList(document.querySelector("[data-testid=session-list]"), {
      request: (method, params) => this.conn.request(method, params),
      onSelect: (id) => this.select(id),
      onUpdate: (sessions) => this.notices.update(sessions, this.view?.sessionId ?? null),
    });
    this.notices = new ApprovalNotices(document.querySelector("[data-testid=approval-notices]"), {
      request: (method, params) => this.conn.request(method, params),
      onOpen: (id) => this.select(id),
    });
    // A signed-out page holds its connection; coming back to the tab, or a sign-in in another
    // tab (a token stored), tries again.
    const retry = () => { if (this.status.dataset.state === "signed-out") this.conn.resume(); };
    window.addEventListener("focus", retry);
    document.addEventListener("visibilitychange", () => { if (!document.hidden) retry(); });
    window.addEventListener("storage", (ev) => { if (ev.key === TOKEN_KEY) retry(); });
    window.dshMirror = () => this.view?.mirror() ?? null;
    window.addEventListener("hashchange", () => {
      if (/(^#|&)token=/.test(location.hash)) takeToken(); // checked like at load: a link's is dropped
      const id = selectedFromHash();
      if (id && id !== this.view?.sessionId) this.select(id);
    });
    const first = selectedFromHash();
    if (first) this.select(first);
    this.waitForFirstList();
  }

  /** The status line, the banner (`help`: what a person can do, else the status text) and
   * the live parts: dimmed (CSS on body[data-conn]) and disabled unless open. */
  setStatus(state, text, help = null) {
    this.status.textContent = text;
    this.status.dataset.state = state;
    document.body.dataset.conn = state;
    this.live.disabled = state !== "open";
    this.banner.hidden = state === "open";
    this.banner.textContent = state === "open" ? "" : help ?? text;
  }

  signOut() {
    this.conn.hold(); // no reconnect can help until the person signs in
    this.setStatus("signed-out", SIGNED_OUT, signInHelp());
  }

  opened() {
    this.setStatus("open", "connected");
    this.status.title = "";
    this.list.start();
  }

  /** The WebSocket closed ({code, reason}: 4000/4001 name dshd, 1006 a bridge gone or a
   * refused handshake). Without a stored token, or when `HEAD /` says 401 (the cookie is gone
   * or older than the token), the page is signed out: no reconnect can help, so it says what
   * will and holds the connection (signOut; it tries again when the person comes back). */
  closed(info) {
    this.list.stop();
    // People's words in the text ("dshd is not running" is one); the close code in the title.
    const lost = info?.reason ? `${info.reason}, reconnecting…` : "connection lost, reconnecting…";
    this.status.title = info?.code ? `WebSocket closed ${info.code}${info.reason ? `: ${info.reason}` : ""}` : "";
    if (!readToken()) return this.signOut();
    if (this.status.dataset.state !== "signed-out") this.setStatus("closed", lost, awayHelp(info));
    if (info?.code !== 1006) return;
    signedOut().then((out) => {
      if (this.conn.state === "open") return;
      if (out) this.signOut();
      else if (this.status.dataset.state === "signed-out") {
        this.setStatus("closed", "connection lost, reconnecting…", awayHelp(info));
        this.conn.resume();
      }
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
    if (!this.conn || this.view?.sessionId === id) return;
    this.view?.close();
    this.list.mark(id);
    this.notices.update(this.list.sessions, id);
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
