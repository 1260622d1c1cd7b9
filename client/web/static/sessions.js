// sessions.js: the sessions list (PROTOCOL.md §3.1 session.list), newest first.
//
// Theory of operation: there is no subscription of the list, so SessionList polls
// `session.list` every `intervalMs` (1 s) while the connection is open, one request at a time
// (a slow answer delays the next poll instead of piling requests up), and re-renders the rows
// keyed by session id: name (or id), cwd, running calls, pending approvals. A click selects a
// session (onSelect). Damaged sessions are listed with their reason and cannot be selected.
// Every answer also goes to onUpdate (app.js: the notices of approvals in other sessions).

import { el, reconcile, setChildren, age } from "./dom.js";

const MAX_ROWS = 500;

export class SessionList {
  constructor(container, { request, onSelect, onUpdate = () => {}, intervalMs = 1000 }) {
    this.container = container;
    this.request = request;
    this.onSelect = onSelect;
    this.onUpdate = onUpdate;
    this.intervalMs = intervalMs;
    this.rows = new Map();
    this.sessions = [];
    this.selected = null;
    this.timer = null;
    this.generation = 0; // one poll loop at a time: a stop() ends the loop of its generation
  }

  start() {
    this.stop();
    this.poll(this.generation);
  }

  stop() {
    this.generation += 1;
    clearTimeout(this.timer);
    this.timer = null;
  }

  async poll(generation) {
    if (generation !== this.generation) return;
    try {
      const result = await this.request("session.list", {});
      this.update(result.sessions ?? []);
    } catch (err) {
      // A dropped connection stops the polling (start() again on open); any other error is
      // shown in place of the list and the poll goes on.
      if (err?.code !== -32099) this.container.dataset.error = err?.message ?? String(err);
    }
    if (generation === this.generation) this.timer = setTimeout(() => this.poll(generation), this.intervalMs);
  }

  update(sessions) {
    delete this.container.dataset.error;
    this.sessions = sessions
      .slice()
      .sort((a, b) => (b.createdAt ?? 0) - (a.createdAt ?? 0) || (a.sessionId < b.sessionId ? 1 : -1))
      .slice(0, MAX_ROWS);
    const byId = new Map(this.sessions.map((s) => [s.sessionId, s]));
    reconcile(this.container, this.rows, this.sessions.map((s) => s.sessionId),
      (id) => this.makeRow(id), (id, row) => this.fillRow(row, byId.get(id)));
    this.onUpdate(this.sessions);
  }

  makeRow(id) {
    return el("li", {
      testid: "session-row", class: "session-row", data: { sessionId: id }, tabindex: "0",
      on: {
        click: () => this.select(id),
        keydown: (ev) => { if (ev.key === "Enter") this.select(id); },
      },
    });
  }

  fillRow(row, s) {
    const busy = [];
    if (s.running) busy.push(el("span", { class: "badge running", title: "running calls" }, `${s.running} running`));
    if (s.pendingApprovals) busy.push(el("span", { class: "badge asking", title: "pending approvals" }, `${s.pendingApprovals} asking`));
    row.classList.toggle("selected", s.sessionId === this.selected);
    row.classList.toggle("damaged", Boolean(s.damaged));
    setChildren(row, [
      el("div", { class: "row-head" },
        el("span", { class: "session-name" }, s.name ?? s.title ?? s.sessionId),
        s.updatedAt ? el("span", { class: "age" }, age(s.updatedAt)) : null),
      el("div", { class: "session-cwd", title: s.cwd ?? "" },
        s.damaged ? `damaged: ${s.damaged}`
          : s.unreadable ? `unreadable: ${s.unreadable}` // dshd out of fds: listed by id only
            : `\u200e${s.cwd ?? ""}\u200e`),
      busy.length ? el("div", { class: "badges" }, busy) : null,
    ]);
  }

  select(id) {
    const info = this.sessions.find((s) => s.sessionId === id);
    if (info?.damaged) return;
    this.mark(id);
    this.onSelect(id, info);
  }

  /** Show `id` as the selected row (no onSelect). */
  mark(id) {
    this.selected = id;
    for (const [key, row] of this.rows) row.classList.toggle("selected", key === id);
  }

  newest() {
    return this.sessions.find((s) => !s.damaged)?.sessionId ?? null;
  }
}
