// calls.js: a session's running calls with their live output, and its recent results.
//
// Theory of operation: CallsView.update(lane) is called with every new lane value. Each call
// in the lane's `tools` gets one element (data-testid "call", data-call-id, data-state) with
// its command, state, a cancel button and its output; each entry of `recent` one element
// (data-testid "recent-result") with the exit code or error code and the same output. The
// output does not come from the lane's cleaned window but from the raw channel: one
// OutputFollower (rpc.js) per call, from TAIL_BYTES before the call's end when the page first
// sees it (a `tool.read` of no bytes says where the end is; 0 for any usual call), which
// resumes from the next byte offset after a reconnect (no byte lost, none twice), rendered
// by an AnsiView (colours as styled spans, data-testid "call-output"). When a call settles
// its output element moves from the running call to its recent result, so what was seen
// stays, and opens at its end (a box that follows its bottom is scrolled there once its row
// is in the document: scrolling a detached element does nothing). A call known only from `recent` (settled before the page looked) is followed the
// same way: a settled call's follow delivers its retained bytes, then eof. Outputs of calls
// that left both lists are dropped and their followers stopped: at most tools + 20 recent
// followers, each view bounded (ansi.js).

import { el, reconcile, commandOf, age } from "./dom.js";
import { AnsiView } from "./ansi.js";

const OUTPUT_CHARS = 262144;
/** A call's output is followed from at most this many bytes before its end (the view keeps
 * OUTPUT_CHARS characters anyway): a call that printed a gigabyte does not stream it all. */
const TAIL_BYTES = 262144;
/** A follower this many bytes behind the call's end skips ahead to its last TAIL_BYTES. */
const SKIP_BYTES = 1048576;
/** How many of the newest events a recent result's command is looked for in. */
const COMMAND_EVENTS = 500;

export class CallsView {
  constructor({ running, recent }, { conn, sessionId, OutputFollower, onTerminal, onError }) {
    this.runningBox = running;
    this.recentBox = recent;
    this.conn = conn;
    this.sessionId = sessionId;
    this.OutputFollower = OutputFollower;
    this.onTerminal = onTerminal;
    this.onError = onError;
    this.outputs = new Map(); // callId -> {pre, view, follower, command, tty, eof, exitCode}
    this.callRows = new Map();
    this.recentRows = new Map();
    this.commands = new Map(); // callId -> command, remembered for the recent results
    this.asked = new Set(); // calls whose command was looked up in session.events
    this.moved = new Set(); // outputs put into a (maybe detached) row during this update
    this.ticker = setInterval(() => this.tick(), 1000);
  }

  update(lane) {
    const tools = lane?.tools ?? {};
    const recent = lane?.recent ?? [];
    const running = Object.entries(tools)
      .sort(([a, x], [b, y]) => (y.startedAt ?? 0) - (x.startedAt ?? 0) || (a < b ? 1 : -1));
    for (const [id, call] of running) {
      this.commands.set(id, commandOf(call.args));
      if (call.state === "running") {
        const out = this.ensureOutput(id, call);
        this.skipAhead(out, call.output?.truncation?.totalBytes ?? 0);
      }
    }
    reconcile(this.runningBox, this.callRows, running.map(([id]) => id),
      (id) => this.makeCall(id), (id, node) => this.fillCall(node, id, tools[id]));
    const recentIds = recent.map((r) => r.callId).filter((id) => !(id in tools));
    const byId = new Map(recent.map((r) => [r.callId, r]));
    for (const id of recentIds) {
      const known = this.outputs.has(id);
      const out = this.ensureOutput(id, null);
      if (known) this.settleOutput(out);
      if (!this.commands.get(id)) this.fetchCommand(id);
    }
    reconcile(this.recentBox, this.recentRows, recentIds,
      (id) => this.makeRecent(id), (id, node) => this.fillRecent(node, id, byId.get(id)));
    const keep = new Set([...running.map(([id]) => id), ...recentIds]);
    for (const [id, out] of this.outputs) {
      if (!keep.has(id)) {
        out.closed = true;
        stopFollower(out.follower);
        this.outputs.delete(id);
        this.commands.delete(id);
      }
    }
    // A box moved (a call that settled) or made anew starts at its top: once its row is in
    // the document, put the ones that follow their bottom at the end (the exit, the last lines).
    for (const out of this.moved) if (out.view.stick) out.view.toBottom();
    this.moved.clear();
    this.runningBox.classList.toggle("empty", running.length === 0);
    this.recentBox.classList.toggle("empty", recentIds.length === 0);
  }

  ensureOutput(id, call) {
    if (this.outputs.has(id)) return this.outputs.get(id);
    const pre = el("pre", { testid: "call-output", class: "call-output" });
    const out = { id, pre, view: new AnsiView(pre, { maxChars: OUTPUT_CHARS }), follower: null,
      tty: Boolean(call?.args?.tty), eof: false, exitCode: null, skipping: false };
    this.outputs.set(id, out);
    tailStart(this.conn, this.sessionId, id, TAIL_BYTES).then((start) => {
      if (out.closed) return;
      if (start > 0) pre.dataset.skipped = `… the first ${start} bytes are not shown (the full output: dsh attach, tool.read)`;
      this.follow(out, start);
    });
    return out;
  }

  follow(out, offset) {
    const follower = new this.OutputFollower(this.conn, this.sessionId, out.id, {
      offset,
      onData: (bytes) => { if (out.follower === follower) out.view.write(bytes); },
      onEof: (exitCode) => {
        if (out.follower !== follower) return;
        out.eof = true;
        out.exitCode = exitCode ?? null;
      },
      onError: (err) => { out.pre.dataset.error = err?.message ?? String(err); },
      start: false,
    });
    out.follower = follower;
    follower.start();
  }

  /** The follower is far behind the call's end (`end`: the lane's totalBytes, or tool.read's
   * endOffset once it settled): stop it, so a flood does not fill the page's connection (the
   * lane's updates would queue behind it), and say so. While the call still floods (its end
   * moved by SKIP_BYTES or more since the last lane update) nothing is followed; once it slows
   * down, or settles, the follower starts again from TAIL_BYTES before the end, after a note
   * of the bytes skipped. The page never falls behind a flood. */
  skipAhead(out, end, settled = false) {
    if (out.eof || out.closed) return;
    if (out.flooding) {
      const moved = end - out.floodEnd;
      out.floodEnd = end;
      if (settled || moved < SKIP_BYTES) this.resume(out, end);
      return;
    }
    const follower = out.follower;
    if (!follower || end - follower.offset <= SKIP_BYTES) return;
    stopFollower(follower);
    out.follower = null;
    out.flooding = true;
    out.floodEnd = end;
    out.skipFrom = follower.offset;
    out.view.discardQueued();
    if (settled) this.resume(out, end);
  }

  resume(out, end) {
    out.flooding = false;
    const from = Math.max(out.skipFrom, end - TAIL_BYTES);
    out.skipped = (out.skipped ?? 0) + (from - out.skipFrom);
    // In an attribute shown above the box (style.css), not in the text the window trims.
    out.pre.dataset.skipped = `… ${out.skipped} bytes skipped (the full output: dsh attach, tool.read)`;
    this.follow(out, from);
  }

  /** A call just settled: if its follower is far behind (or stopped by a flood), skip to its
   * last bytes. */
  async settleOutput(out) {
    if (out.settling || out.eof || (!out.follower && !out.flooding)) return;
    out.settling = true;
    try {
      const r = await this.conn.request("tool.read", { sessionId: this.sessionId, callId: out.id, offset: 0, limit: 0 });
      this.skipAhead(out, r.endOffset ?? 0, true);
    } catch { /* the follower reports what it meets */ }
  }

  makeCall(id) {
    const cancel = el("button", {
      testid: "cancel-call", class: "danger small", title: "tool.cancel",
      on: { click: () => this.cancel(id, cancel) },
    }, "cancel");
    const term = el("button", {
      class: "small", testid: "open-terminal", title: "open this terminal call",
      on: { click: () => this.onTerminal(id) },
    }, "terminal");
    return el("div", { testid: "call", class: "call", data: { callId: id } },
      el("div", { class: "call-head" },
        el("code", { class: "call-command" }),
        el("span", { class: "call-state" }),
        term, cancel),
      el("div", { class: "call-body" }));
  }

  fillCall(node, id, call) {
    node.dataset.state = call.state;
    node.querySelector(".call-command").textContent = commandOf(call.args);
    node.querySelector(".call-state").textContent =
      call.state === "running" ? `running · ${age(call.startedAt)}` : "waits for your approval";
    node.querySelector(".call-state").dataset.startedAt = call.startedAt ?? "";
    node.querySelector("[data-testid=open-terminal]").hidden = !(call.args?.tty);
    const body = node.querySelector(".call-body");
    const out = this.outputs.get(id);
    if (out && out.pre.parentNode !== body) {
      body.append(out.pre);
      this.moved.add(out);
    }
  }

  makeRecent(id) {
    return el("div", { testid: "recent-result", class: "recent-result", data: { callId: id } },
      el("div", { class: "call-head" },
        el("code", { class: "call-command" }),
        el("span", { class: "call-exit" })),
      el("div", { class: "call-body" }));
  }

  fillRecent(node, id, entry) {
    const failed = entry.isError || (entry.exitCode !== null && entry.exitCode !== 0);
    node.classList.toggle("failed", Boolean(failed));
    node.dataset.exitCode = entry.exitCode ?? "";
    node.dataset.errorCode = entry.errorCode ?? "";
    node.querySelector(".call-command").textContent = this.commands.get(id) || `${entry.name} ${id}`;
    node.querySelector(".call-exit").textContent =
      entry.errorCode ? entry.errorCode : entry.exitCode === null ? "" : `exit ${entry.exitCode}`;
    const body = node.querySelector(".call-body");
    const out = this.outputs.get(id);
    if (out && out.pre.parentNode !== body) {
      body.append(out.pre);
      this.moved.add(out);
    }
  }

  /** Tick the "running · N s" of every running call (output or not). */
  tick() {
    for (const state of this.runningBox.querySelectorAll(".call-state[data-started-at]")) {
      const started = Number(state.dataset.startedAt);
      if (started && state.closest("[data-state=running]")) state.textContent = `running · ${age(started)}`;
    }
  }

  /** The command of a call the lane's recent names without args (one started from the CLI
   * before the page saw it): its tool/call event, from the last COMMAND_EVENTS events, once. */
  async fetchCommand(id) {
    if (this.asked.has(id)) return;
    this.asked.add(id);
    if (this.asked.size > 256) this.asked.delete(this.asked.values().next().value);
    try {
      const head = await this.conn.request("session.events", { sessionId: this.sessionId, limit: 0 });
      const page = await this.conn.request("session.events", { sessionId: this.sessionId,
        afterSeq: Math.max(-1, head.lastSeq - COMMAND_EVENTS), limit: COMMAND_EVENTS });
      const ev = page.events.find((e) => e.type === "tool/call" && (e.data?.callId ?? e.callId) === id);
      let args = ev?.data?.arguments ?? ev?.data?.args;
      if (typeof args === "string") try { args = JSON.parse(args); } catch { /* a cut string */ }
      if (!args || !this.outputs.has(id)) return;
      this.commands.set(id, commandOf(args));
      const node = this.recentRows.get(id);
      if (node) node.querySelector(".call-command").textContent = this.commands.get(id);
    } catch { /* the id stays shown */ }
  }

  async cancel(id, button) {
    button.disabled = true;
    try {
      await this.conn.request("tool.cancel", { sessionId: this.sessionId, callId: id }, { wait: false });
    } catch (err) {
      this.onError(`cancel ${id}: ${err.message}`);
      button.disabled = false;
    }
  }

  close() {
    clearInterval(this.ticker);
    for (const out of this.outputs.values()) {
      out.closed = true;
      stopFollower(out.follower);
    }
    this.outputs.clear();
    this.runningBox.replaceChildren();
    this.recentBox.replaceChildren();
    this.callRows.clear();
    this.recentRows.clear();
  }
}

/** Where to follow a call's output from to get its last `maxBytes` bytes: a `tool.read` of no
 * bytes answers its retained range [firstOffset, endOffset). On any failure: 0 (the follower
 * then reports what it meets). */
export async function tailStart(conn, sessionId, callId, maxBytes) {
  try {
    const r = await conn.request("tool.read", { sessionId, callId, offset: 0, limit: 0 });
    return Math.max(r.firstOffset ?? 0, (r.endOffset ?? 0) - maxBytes);
  } catch (err) {
    const first = err?.data?.firstOffset;
    if (typeof first !== "number") return 0;
    try {
      const r = await conn.request("tool.read", { sessionId, callId, offset: first, limit: 0 });
      return Math.max(r.firstOffset ?? first, (r.endOffset ?? first) - maxBytes);
    } catch {
      return first;
    }
  }
}

export function stopFollower(follower) {
  follower?.stop();
}
