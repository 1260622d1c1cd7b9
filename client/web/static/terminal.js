// terminal.js: a PTY call (bash with tty: true) in xterm.js.
//
// Theory of operation: TerminalPanel.open(callId) makes one xterm Terminal (the vendored UMD
// build: window.Terminal, window.FitAddon) in the host element (data-testid "terminal") and
// fills its scrollback by tool.read (readAll) of the call's output so far -- its last 16 MiB,
// all of it for any usual call; xterm keeps the last 10,000 lines -- then an OutputFollower
// from the offset after it: the live bytes, resumed from the next offset after a reconnect
// (none lost, none twice). Keys go to the call's terminal with tool.write (base64),
// one write at a time in order (each answer is the back-pressure); the terminal is fitted to
// its host once it is laid out (a ResizeObserver and the next animation frame; a fit before
// that measures the wrong box) and every size change is a tool.resize (the host's data-cols /
// data-rows say the size sent). A key bar (Esc, Tab, a one-shot Ctrl, arrows) serves touch
// keyboards; style.css shows it on narrow or touch screens. At the call's eof the terminal says so
// and stops sending keys. close() ends the follower and disposes of the terminal. OSC 8
// hyperlinks open only when http(s), without opener or referrer (security.js).

import { el } from "./dom.js";
import { stopFollower, tailStart } from "./calls.js";
import { safeLinkHandler } from "./security.js";

/** The scrollback a terminal starts with: the call's last 16 MiB (xterm keeps 10,000 lines). */
const TERM_TAIL = 16 * 1024 * 1024;

export class TerminalPanel {
  constructor(host, { conn, sessionId, OutputFollower, readAll, b64encode, onError }) {
    this.readAll = readAll;
    this.host = host;
    this.conn = conn;
    this.sessionId = sessionId;
    this.OutputFollower = OutputFollower;
    this.b64encode = b64encode;
    this.onError = onError;
    this.callId = null;
    this.term = null;
    this.fit = null;
    this.follower = null;
    this.writes = Promise.resolve();
    this.ended = false;
    this.onWindowResize = () => this.refit();
  }

  get available() {
    return typeof window.Terminal === "function";
  }

  open(callId) {
    if (this.callId === callId) return;
    this.close();
    if (!this.available) {
      this.onError("xterm.js did not load (static/vendor/xterm): the terminal cannot open");
      return;
    }
    this.callId = callId;
    this.ended = false;
    this.host.hidden = false;
    this.host.dataset.callId = callId;
    const title = el("div", { class: "terminal-title" },
      el("span", {}, `terminal · ${callId}`),
      el("button", { class: "small", on: { click: () => this.close() } }, "close"));
    const screen = el("div", { class: "terminal-screen" });
    this.host.replaceChildren(title, screen, this.keyBar());
    this.term = new window.Terminal({ convertEol: false, scrollback: 10000, fontSize: 13,
      fontFamily: "ui-monospace, Menlo, Consolas, monospace", cursorBlink: true,
      linkHandler: safeLinkHandler() }); // OSC 8 links: http(s) only, noopener,noreferrer
    this.fit = new window.FitAddon.FitAddon();
    this.term.loadAddon(this.fit);
    this.term.open(screen);
    this.term.onData((data) => this.send(this.withCtrl(data)));
    this.term.onResize(({ cols, rows }) => this.resize(cols, rows));
    window.addEventListener("resize", this.onWindowResize);
    // Fit once the screen is laid out and visible (a fit before that measures a box of the
    // wrong size), and again whenever the box changes size; each new size is a tool.resize.
    this.observer = typeof ResizeObserver === "function" ? new ResizeObserver(() => this.refit()) : null;
    this.observer?.observe(screen);
    this.refit();
    this.resize(this.term.cols, this.term.rows);
    requestAnimationFrame(() => this.refit());
    this.backfill(callId).then((offset) => {
      if (this.callId === callId) this.follow(callId, offset);
    });
    this.term.focus();
  }

  /** The scrollback so far by tool.read (its last TERM_TAIL bytes); the offset after it. */
  async backfill(callId) {
    try {
      const start = await tailStart(this.conn, this.sessionId, callId, TERM_TAIL);
      const r = await this.readAll(this.conn, this.sessionId, callId, { offset: start, maxBytes: TERM_TAIL });
      if (this.callId !== callId) return 0;
      if (r.offset > 0) this.term.write(`\x1b[2m[… the first ${r.offset} bytes are not shown]\x1b[0m\r\n`);
      this.term.write(r.data);
      return r.offset + r.data.length;
    } catch {
      return 0; // follow it all instead
    }
  }

  follow(callId, offset) {
    this.follower = new this.OutputFollower(this.conn, this.sessionId, callId, {
      offset,
      onData: (bytes) => this.term?.write(bytes),
      onEof: (exitCode) => {
        this.ended = true;
        this.host.dataset.ended = "true";
        this.refit(); // the panel of an ended call is shorter (style.css)
        this.term?.write(`\r\n\x1b[2m[the call ended${exitCode === undefined || exitCode === null ? "" : `: exit ${exitCode}`}]\x1b[0m\r\n`);
      },
      onError: (err) => this.onError(`terminal ${callId}: ${err?.message ?? err}`),
    });
    this.follower.start();
  }

  refit() {
    try {
      if (this.host.offsetParent !== null) this.fit?.fit();
    } catch {
      // not laid out yet
    }
  }

  /** Keys a phone's keyboard lacks: Esc, Tab, a one-shot Ctrl, the arrows. */
  keyBar() {
    const key = (label, seq, title) => el("button", { class: "small", title, testid: "term-key",
      on: { click: () => { this.send(seq); this.term?.focus(); } } }, label);
    this.ctrlButton = el("button", { class: "small", testid: "term-ctrl", title: "Ctrl with the next key",
      on: { click: () => { this.ctrl = !this.ctrl; this.ctrlButton.classList.toggle("on", this.ctrl); this.term?.focus(); } } }, "Ctrl");
    return el("div", { class: "term-keys" }, key("Esc", "\x1b", "Escape"), key("Tab", "\t", "Tab"),
      this.ctrlButton, key("←", "\x1b[D", "left"), key("↑", "\x1b[A", "up"),
      key("↓", "\x1b[B", "down"), key("→", "\x1b[C", "right"));
  }

  /** A key typed after the bar's Ctrl: its control character (Ctrl-C is \x03). */
  withCtrl(data) {
    if (!this.ctrl || data.length !== 1) return data;
    this.ctrl = false;
    this.ctrlButton?.classList.remove("on");
    const code = data.toUpperCase().charCodeAt(0);
    return code >= 64 && code <= 95 ? String.fromCharCode(code - 64) : data;
  }

  send(data) {
    if (this.ended || !this.callId) return;
    const callId = this.callId;
    const payload = this.b64encode(data);
    this.writes = this.writes.then(() => this.conn.request("tool.write",
      { sessionId: this.sessionId, callId, data: payload })).catch((err) => {
      if (err?.data?.code !== "CALL_SETTLED") this.onError(`tool.write: ${err.message}`);
    });
  }

  resize(cols, rows) {
    this.host.dataset.cols = cols;
    this.host.dataset.rows = rows;
    if (this.ended || !this.callId) return;
    this.conn.request("tool.resize", { sessionId: this.sessionId, callId: this.callId, cols, rows })
      .catch((err) => {
        if (err?.data?.code !== "CALL_SETTLED") this.onError(`tool.resize: ${err.message}`);
      });
  }

  close() {
    stopFollower(this.follower);
    this.follower = null;
    window.removeEventListener("resize", this.onWindowResize);
    this.observer?.disconnect();
    this.observer = null;
    this.term?.dispose();
    this.term = null;
    this.fit = null;
    this.callId = null;
    this.host.hidden = true;
    delete this.host.dataset.callId;
    delete this.host.dataset.ended;
    delete this.host.dataset.cols;
    delete this.host.dataset.rows;
    this.host.replaceChildren();
  }
}
