// calls.js: a session's running calls with their live output, and its recent results.
//
// Theory of operation: CallsView.update(lane) is called with every new lane value. Each call
// in the lane's `tools` gets one element (data-testid "call", data-call-id, data-state) with
// its command, state, a cancel button and its output; each entry of `recent` one element
// (data-testid "recent-result") with the exit code or error code and the same output. The
// output does not come from the lane's cleaned window but from the raw channel: one
// OutputFollower (rpc.js) per call, from offset 0, which resumes from the next byte offset
// after a reconnect (no byte lost, none twice), rendered by an AnsiView (colours as styled
// spans, data-testid "call-output"). When a call settles its output element moves from the
// running call to its recent result, so what was seen stays. A call known only from `recent`
// (settled before the page looked) is followed from 0 too: a settled call's follow delivers
// its retained bytes, then eof. Outputs of calls that left both lists are dropped and their
// followers stopped: at most tools + 20 recent followers, each view bounded (ansi.js).

import { el, reconcile, commandOf, age } from "./dom.js";
import { AnsiView } from "./ansi.js";

const OUTPUT_CHARS = 262144;

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
  }

  update(lane) {
    const tools = lane?.tools ?? {};
    const recent = lane?.recent ?? [];
    const running = Object.entries(tools)
      .sort(([a, x], [b, y]) => (y.startedAt ?? 0) - (x.startedAt ?? 0) || (a < b ? 1 : -1));
    for (const [id, call] of running) {
      this.commands.set(id, commandOf(call.args));
      if (call.state === "running") this.ensureOutput(id, call);
    }
    reconcile(this.runningBox, this.callRows, running.map(([id]) => id),
      (id) => this.makeCall(id), (id, node) => this.fillCall(node, id, tools[id]));
    const recentIds = recent.map((r) => r.callId).filter((id) => !(id in tools));
    const byId = new Map(recent.map((r) => [r.callId, r]));
    for (const id of recentIds) this.ensureOutput(id, null);
    reconcile(this.recentBox, this.recentRows, recentIds,
      (id) => this.makeRecent(id), (id, node) => this.fillRecent(node, id, byId.get(id)));
    const keep = new Set([...running.map(([id]) => id), ...recentIds]);
    for (const [id, out] of this.outputs) {
      if (!keep.has(id)) {
        stopFollower(out.follower);
        this.outputs.delete(id);
        this.commands.delete(id);
      }
    }
    this.runningBox.classList.toggle("empty", running.length === 0);
    this.recentBox.classList.toggle("empty", recentIds.length === 0);
  }

  ensureOutput(id, call) {
    if (this.outputs.has(id)) return this.outputs.get(id);
    const pre = el("pre", { testid: "call-output", class: "call-output" });
    const out = { pre, view: new AnsiView(pre, { maxChars: OUTPUT_CHARS }), follower: null,
      tty: Boolean(call?.args?.tty), eof: false, exitCode: null };
    this.outputs.set(id, out);
    try {
      out.follower = new this.OutputFollower(this.conn, this.sessionId, id, {
        onData: (bytes) => out.view.write(bytes),
        onEof: (exitCode) => {
          out.eof = true;
          out.exitCode = exitCode ?? null;
        },
        onError: (err) => { pre.dataset.error = err?.message ?? String(err); },
      });
      out.follower.start();
    } catch (err) {
      pre.dataset.error = err?.message ?? String(err);
    }
    return out;
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
      call.state === "running" ? `running · ${age(call.startedAt)}` : "waiting for approval";
    node.querySelector("[data-testid=open-terminal]").hidden = !(call.args?.tty);
    const body = node.querySelector(".call-body");
    const out = this.outputs.get(id);
    if (out && out.pre.parentNode !== body) body.append(out.pre);
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
    if (out && out.pre.parentNode !== body) body.append(out.pre);
  }

  async cancel(id, button) {
    button.disabled = true;
    try {
      await this.conn.request("tool.cancel", { sessionId: this.sessionId, callId: id });
    } catch (err) {
      this.onError(`cancel ${id}: ${err.message}`);
      button.disabled = false;
    }
  }

  close() {
    for (const out of this.outputs.values()) stopFollower(out.follower);
    this.outputs.clear();
    this.runningBox.replaceChildren();
    this.recentBox.replaceChildren();
    this.callRows.clear();
    this.recentRows.clear();
  }
}

export function stopFollower(follower) {
  follower?.stop();
}
