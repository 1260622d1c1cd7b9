// chat.js: the session's chat with its model (PROTOCOL.md §3.5).
//
// Theory of operation: the transcript has two sources. The log is the truth of what was said:
// ChatPanel reads `session.events` (from at most HISTORY events back on open, then from the
// last seq it read) and keeps one entry per `message/user` and one per `message/assistant`
// (keyed by turnId/stepId), with the step's tool calls inline (their command from the
// event's arguments, their exit code from the `tool/result`). The lane's `turn` is the live
// part: update() writes the running step's streaming `text` (data-testid "chat-text") and
// `turn.calls` states into the entry of the same key, made at the end when the log has none
// yet. The log is read again whenever the turn starts, changes step or ends, and after a
// send or a steer, so the last step's text, which the lane drops at the turn's end, is
// always shown. Entries stand in log (seq) order whatever the order they were learnt in;
// a step the lane shows before the log has it stays last until its event is read. A steer
// the daemon accepted shows "queued: …" (data-testid "chat-queued") until its message/user
// is in the log. Reads run one at a time; a read asked meanwhile runs after. The transcript
// keeps MAX_ENTRIES entries. Send starts a turn, steer queues input for the running turn's
// next step, cancel ends the turn.

import { el, commandOf, visibleText } from "./dom.js";

const MAX_ENTRIES = 200;
const HISTORY = 2000;
const PAGE = 1000;
const MAX_QUEUED = 20;

export class ChatPanel {
  constructor(box, { conn, sessionId, onError }) {
    this.conn = conn;
    this.sessionId = sessionId;
    this.onError = onError;
    this.entries = new Map(); // key -> element
    this.results = new Map(); // callId -> {exitCode, errorCode}
    this.afterSeq = null;
    this.reading = null;
    this.again = false;
    this.turnKey = undefined; // the first update reads the log
    this.log = el("div", { class: "chat-log", testid: "chat-log" });
    this.input = el("textarea", { testid: "chat-input", rows: "2", placeholder: "Ask the model…",
      on: { keydown: (ev) => { if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); this.sendOrSteer(); } } } });
    this.send = el("button", { testid: "chat-send", on: { click: () => this.start() } }, "send");
    this.steer = el("button", { testid: "chat-steer", title: "queue this for the turn's next step",
      on: { click: () => this.steerTurn() } }, "steer");
    this.cancel = el("button", { testid: "chat-cancel", class: "danger",
      on: { click: () => this.cancelTurn() } }, "cancel turn");
    this.state = el("span", { class: "turn-state", testid: "turn-state" });
    box.replaceChildren(this.log,
      el("div", { class: "chat-controls" }, this.input,
        el("div", { class: "chat-buttons" }, this.send, this.steer, this.cancel, this.state)));
    this.turn = null;
    this.update(null);
  }

  /** The lane's turn changed (or anything else: cheap when the turn did not). */
  update(turn, tools = {}) {
    this.turn = turn;
    const running = Boolean(turn);
    this.steer.disabled = !running;
    this.cancel.disabled = !running;
    this.send.disabled = running;
    this.state.textContent = running ? `turn ${turn.state}${turn.step ? ` · step ${turn.step}` : ""}` : "";
    const key = turn ? `${turn.turnId}/${turn.stepId}` : null;
    if (!turn) for (const n of this.log.querySelectorAll("[data-queued]")) n.remove(); // no turn takes them now
    if (key !== this.turnKey) {
      this.turnKey = key;
      this.refresh();
    }
    if (!turn || !turn.stepId) return;
    const entry = this.assistant(`${turn.turnId}/${turn.stepId}`);
    if (!entry.dataset.logged) entry.querySelector(".chat-text").textContent = turn.text ?? "";
    this.renderCalls(entry, (turn.calls ?? []).map((c) => ({
      callId: c.callId, name: c.name, state: c.state, exitCode: c.exitCode, errorCode: c.errorCode,
      command: tools[c.callId] ? commandOf(tools[c.callId].args) : entry.commands?.get(c.callId),
    })));
  }

  assistant(key) {
    let entry = this.entries.get(key);
    if (!entry) {
      entry = el("div", { class: "chat-entry assistant", data: { key } },
        el("div", { class: "chat-text", testid: "chat-text" }),
        el("ul", { class: "chat-calls" }));
      entry.commands = new Map();
      this.entries.set(key, entry);
      this.place(entry, Infinity); // live, not in the log yet: after everything logged
    }
    return entry;
  }

  renderCalls(entry, calls) {
    entry.querySelector(".chat-calls").replaceChildren(...calls.map((c) => {
      const done = this.results.get(c.callId);
      const state = done ? "settled" : c.state ?? "proposed";
      const exit = done ?? c;
      const failed = state === "settled" && (exit.errorCode || (exit.exitCode ?? 0) !== 0);
      return el("li", { class: `chat-call ${state}${failed ? " failed" : ""}`, testid: "chat-call", data: { callId: c.callId, state } },
        el("code", {}, c.command ?? `${c.name ?? "tool"} ${c.callId}`),
        el("span", { class: "call-state" }, state === "settled"
          ? (exit.errorCode ?? (exit.exitCode === null || exit.exitCode === undefined ? "settled" : `exit ${exit.exitCode}`))
          : state));
    }));
  }

  /** Read the log's new events (one read at a time; one more after it when asked meanwhile). */
  refresh() {
    if (this.reading) {
      this.again = true;
      return this.reading;
    }
    this.reading = this.readEvents().catch((err) => {
      if (err?.code !== -32099) this.onError(`session.events: ${err.message}`);
    }).finally(() => {
      this.reading = null;
      if (this.again) {
        this.again = false;
        this.refresh();
      }
    });
    return this.reading;
  }

  async readEvents() {
    const sessionId = this.sessionId;
    if (this.afterSeq === null) {
      const head = await this.conn.request("session.events", { sessionId, limit: 0 });
      this.afterSeq = Math.max(-1, head.lastSeq - HISTORY);
    }
    for (;;) {
      const page = await this.conn.request("session.events", { sessionId, afterSeq: this.afterSeq, limit: PAGE });
      for (const event of page.events) this.take(event);
      if (page.events.length) this.afterSeq = page.events[page.events.length - 1].seq;
      if (!page.events.length || this.afterSeq >= page.lastSeq) break;
    }
  }

  take(event) {
    const d = event.data ?? {};
    if (event.type === "message/user") {
      const key = `u${event.seq}`;
      if (this.entries.has(key)) return;
      const entry = el("div", { class: `chat-entry user${d.steer ? " steer" : ""}`, testid: "chat-user" },
        d.steer ? `(steer) ${d.text}` : d.text);
      this.entries.set(key, entry);
      this.place(entry, event.seq);
      if (d.steer) this.unqueue(d.text);
    } else if (event.type === "message/assistant") {
      const entry = this.assistant(d.turnId && d.stepId ? `${d.turnId}/${d.stepId}` : `a${event.seq}`);
      entry.dataset.logged = "true";
      if (Number(entry.dataset.seq) > event.seq) this.place(entry, event.seq);
      entry.querySelector(".chat-text").textContent = d.text ?? "";
      const calls = (d.toolCalls ?? []).map((c) => {
        const command = argumentsCommand(c.arguments);
        if (command) entry.commands.set(c.callId, command);
        return { callId: c.callId, name: c.name, command };
      });
      entry.calls = calls;
      this.renderCalls(entry, calls);
    } else if (event.type === "tool/result" && d.callId) {
      this.results.set(d.callId, { exitCode: d.exitCode ?? d.details?.exitCode ?? null, errorCode: d.errorCode ?? null });
      for (const entry of this.entries.values()) {
        if (entry.calls?.some((c) => c.callId === d.callId)) this.renderCalls(entry, entry.calls);
      }
    } else if (event.type === "turn/end" && d.reason && d.reason !== "completed") {
      const entry = el("div", { class: "chat-entry chat-note", testid: "chat-note" }, `turn ${d.reason}${d.message ? `: ${d.message}` : ""}`);
      this.entries.set(`e${event.seq}`, entry);
      this.place(entry, event.seq);
    }
  }

  /** Put an entry at its place in log (seq) order; entries not logged yet (Infinity) stay last,
   * and the queued steers after them. */
  place(node, seq) {
    node.dataset.seq = String(seq);
    const stick = this.log.scrollTop + this.log.clientHeight >= this.log.scrollHeight - 20;
    const after = [...this.log.children].find((n) => n !== node && (n.dataset.queued || Number(n.dataset.seq) > seq));
    this.log.insertBefore(node, after ?? null);
    while (this.log.childElementCount > MAX_ENTRIES) {
      const first = this.log.firstElementChild;
      for (const [k, v] of this.entries) if (v === first) this.entries.delete(k);
      first.remove();
    }
    if (stick) this.log.scrollTop = this.log.scrollHeight;
  }

  sendOrSteer() {
    if (this.turn) this.steerTurn();
    else this.start();
  }

  async start() {
    const input = this.input.value.trim();
    if (!input) return;
    this.send.disabled = true;
    try {
      await this.conn.request("turn.start", { sessionId: this.sessionId, input }, { wait: false });
      this.input.value = "";
      this.refresh();
    } catch (err) {
      this.onError(`turn.start: ${err.message}`);
      this.send.disabled = Boolean(this.turn);
    }
  }

  async steerTurn() {
    const input = this.input.value.trim();
    if (!input) return;
    try {
      await this.conn.request("turn.steer", { sessionId: this.sessionId, input }, { wait: false });
      this.input.value = "";
      this.queue(input);
      this.refresh();
    } catch (err) {
      this.onError(`turn.steer: ${err.message}`);
    }
  }

  /** A steer accepted but not in the log yet (it is taken at the next step boundary). */
  queue(text) {
    const node = el("div", { class: "chat-entry chat-note queued", testid: "chat-queued",
      data: { queued: "true" } }, `queued: ${text}`);
    node.steerText = text;
    this.log.append(node);
    const queued = this.log.querySelectorAll("[data-queued]");
    if (queued.length > MAX_QUEUED) queued[0].remove();
  }

  unqueue(text) {
    const node = [...this.log.querySelectorAll("[data-queued]")].find((n) => n.steerText === text);
    node?.remove();
  }

  async cancelTurn() {
    try {
      await this.conn.request("turn.cancel", { sessionId: this.sessionId }, { wait: false });
    } catch (err) {
      this.onError(`turn.cancel: ${err.message}`);
    }
  }
}

function argumentsCommand(raw) {
  try {
    const args = typeof raw === "string" ? JSON.parse(raw) : raw;
    return args && typeof args.command === "string" ? visibleText(args.command) : null;
  } catch {
    return null;
  }
}
