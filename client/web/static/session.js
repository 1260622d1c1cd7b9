// session.js: the selected session's view: its approvals, running calls, recent results,
// command box, terminal and chat, all driven by one LaneView (rpc.js) of the session.
//
// Theory of operation: SessionView subscribes with LaneView, which rebuilds the mirror from a
// fresh base batch on every (re)connect and on a broken mirror; every change re-renders the
// keyed parts (approvals, calls, chat) from the lane's value. The connection is an approval
// answerer (initialize capabilities.approvals), so while the page holds the subscription
// dshd waits for its answer; each approval (data-testid "approval") shows the exact command
// and three buttons: allow once, allow for this session (an exact rule), reject. The command
// box runs `tool.run bash {command}` with `approved: true`: the person typed it; while the
// page is not connected it is refused at once ("dshd is not reachable; nothing was run") and
// never queued, as are a decision, a turn and a cancel ({wait: false}): nothing a person asked
// for runs later by surprise (the TUI's rule). `mirror()`
// is what window.dshMirror() returns: a copy of the lane value.

import { el, reconcile, age, visibleText } from "./dom.js";
import { CallsView } from "./calls.js";
import { TerminalPanel } from "./terminal.js";
import { ChatPanel } from "./chat.js";

/** What a person reads when a command is refused because the page is not connected. */
export const NOT_RUN = "dshd is not reachable; nothing was run";

export class SessionView {
  constructor(root, { conn, sessionId, rpc, onError }) {
    this.root = root;
    this.conn = conn;
    this.sessionId = sessionId;
    this.rpc = rpc;
    this.onError = onError;
    this.value = null;
    this.approvalRows = new Map();
    this.autoOpened = new Set();
    this.build();
    const common = { conn, sessionId, OutputFollower: rpc.OutputFollower, onError };
    this.calls = new CallsView({ running: this.runningBox, recent: this.recentBox },
      { ...common, onTerminal: (id) => this.terminal.open(id) });
    this.terminal = new TerminalPanel(this.terminalBox, { ...common, readAll: rpc.readAll,
      b64encode: rpc.b64encode });
    this.chat = new ChatPanel(this.chatBox, { conn, sessionId, onError });
    this.lane = rpc.LaneView.subscribe(conn, sessionId, (view) => this.render(view.value), {
      onError: (err) => onError(`subscribe ${sessionId}: ${err.message}`),
    });
  }

  build() {
    this.title = el("h2", { class: "session-title" });
    this.meta = el("div", { class: "session-meta" });
    this.approvalsBox = el("div", { class: "approvals", testid: "approvals" });
    this.runningBox = el("div", { class: "calls", testid: "calls" });
    this.recentBox = el("div", { class: "recent", testid: "recent" });
    this.terminalBox = el("div", { class: "terminal", testid: "terminal", hidden: true });
    this.chatBox = el("div", { class: "chat", testid: "chat" });
    this.commandInput = el("input", { testid: "command-input", type: "text", autocomplete: "off",
      spellcheck: "false", placeholder: "a shell command, run at once (you typed it)" });
    this.ttyBox = el("input", { type: "checkbox", testid: "command-tty" });
    const form = el("form", { class: "command-box", on: { submit: (ev) => { ev.preventDefault(); this.run(); } } },
      el("span", { class: "prompt" }, "$"), this.commandInput,
      el("label", { class: "tty", title: "run it in a terminal (tty)" }, this.ttyBox, "tty"),
      el("button", { testid: "command-submit", type: "submit" }, "run"));
    this.root.replaceChildren(
      el("header", { class: "session-header" }, this.title, this.meta),
      this.approvalsBox,
      el("section", { class: "panel" }, el("h3", {}, "Running"), this.runningBox, form),
      this.terminalBox,
      el("section", { class: "panel" }, el("h3", {}, "Chat"), this.chatBox),
      el("section", { class: "panel" }, el("h3", {}, "Recent results"), this.recentBox));
  }

  render(value) {
    this.value = value;
    if (!value) return;
    const s = value.session ?? {};
    this.title.textContent = s.name ?? s.title ?? s.sessionId ?? this.sessionId;
    this.meta.replaceChildren(
      el("code", { class: "cwd" }, s.cwd ?? ""),
      el("span", { class: "badge" }, `approval: ${s.approvalPolicy ?? "?"}`),
      el("span", { class: "badge" }, `sandbox: ${s.sandbox ?? "?"}`),
      el("span", { class: "session-id" }, this.sessionId));
    this.renderApprovals(value.approvals ?? {});
    this.calls.update(value);
    this.chat.update(value.turn ?? null, value.tools ?? {});
    this.autoOpenTerminal(value.tools ?? {});
  }

  renderApprovals(approvals) {
    const ids = Object.keys(approvals).sort((a, b) => (approvals[a].askedAt ?? 0) - (approvals[b].askedAt ?? 0));
    reconcile(this.approvalsBox, this.approvalRows, ids, (id) => this.makeApproval(id, approvals[id]), () => {});
    this.approvalsBox.classList.toggle("empty", ids.length === 0);
  }

  makeApproval(id, entry) {
    const decide = (decision) => async (ev) => {
      for (const b of row.querySelectorAll("button")) b.disabled = true;
      try {
        await this.conn.request("approval.decide", { sessionId: this.sessionId, approvalId: id, decision }, { wait: false });
      } catch (err) {
        this.onError(`approval.decide: ${err.message}`);
        if (err?.code !== -32011) for (const b of row.querySelectorAll("button")) b.disabled = false;
      }
      ev.target.blur();
    };
    const row = el("div", { testid: "approval", class: "approval", data: { approvalId: id, callId: entry.callId } },
      el("div", { class: "approval-head" },
        el("strong", {}, `${entry.tool} asks to run`), el("span", { class: "age" }, age(entry.askedAt))),
      el("pre", { class: "approval-summary" }, visibleText(entry.summary)),
      el("div", { class: "approval-buttons" },
        el("button", { testid: "approve-once", on: { click: decide("allow-once") } }, "allow once"),
        el("button", { testid: "approve-session", title: "allow this exact command for the rest of the session (an exact rule; other commands still ask)",
          on: { click: decide("allow-for-session") } }, "allow this command for the session"),
        el("button", { testid: "reject", class: "danger", on: { click: decide("reject") } }, "reject")));
    return row;
  }

  autoOpenTerminal(tools) {
    if (this.terminal.callId && tools[this.terminal.callId]) return;
    const tty = Object.entries(tools)
      .filter(([id, c]) => c.state === "running" && c.args?.tty && !this.autoOpened.has(id))
      .sort(([, a], [, b]) => (b.startedAt ?? 0) - (a.startedAt ?? 0));
    if (!tty.length) return;
    this.autoOpened.add(tty[0][0]);
    this.terminal.open(tty[0][0]);
  }

  async run() {
    const command = this.commandInput.value;
    if (!command.trim()) return;
    const args = { command };
    if (this.ttyBox.checked) Object.assign(args, { tty: true, cols: 80, rows: 24 });
    try {
      await this.conn.request("tool.run", { sessionId: this.sessionId, name: "bash", arguments: args, approved: true },
        { wait: false });
      this.commandInput.value = "";
    } catch (err) {
      // Refused at once while away (the command stays in the box): nothing runs later by surprise.
      this.onError(err?.code === this.rpc.NOT_CONNECTED ? NOT_RUN : `tool.run: ${err.message}`);
    }
  }

  mirror() {
    return this.value === null ? null : JSON.parse(JSON.stringify(this.value));
  }

  close() {
    this.lane.close();
    this.calls.close();
    this.terminal.close();
  }
}
