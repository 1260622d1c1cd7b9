// notices.js: approvals waiting in sessions other than the one shown, as visible notices.
//
// Theory of operation: the page answers approvals only of the session it shows (it holds that
// session's subscription), so a request in another session would otherwise be a sidebar
// badge nobody notices. SessionList's poll hands every `session.list` answer to update(); when
// a session other than the shown one has pending approvals, one `approval.list` is asked (one
// at a time; a slow answer skips polls instead of piling requests up) and each request of
// another session becomes a notice above the session (data-testid "approval-notice"): which
// session, which command (visibleText: what is approved reads as what runs), and a button
// ("open-approval") that opens that session, where the approval card answers it. Notices of
// the shown session, and of requests no longer listed, are removed.

import { el, reconcile, visibleText } from "./dom.js";

const MAX_NOTICES = 20;

export class ApprovalNotices {
  constructor(container, { request, onOpen }) {
    this.container = container;
    this.request = request;
    this.onOpen = onOpen;
    this.rows = new Map();
    this.asking = false;
    this.approvals = [];
    this.shown = null;
  }

  /** A fresh session list (and the shown session's id): ask approval.list when it may matter. */
  async update(sessions, shown) {
    this.shown = shown;
    const elsewhere = sessions.some((s) => s.sessionId !== shown && s.pendingApprovals > 0);
    if (!elsewhere) return this.render([]);
    this.render(this.approvals); // the shown session may have changed: its notices go now
    if (this.asking) return;
    this.asking = true;
    try {
      const result = await this.request("approval.list", {});
      this.approvals = result.approvals ?? [];
      this.render(this.approvals);
    } catch {
      // dropped connection or refusal: the last notices stay until the next poll
    } finally {
      this.asking = false;
    }
  }

  render(approvals) {
    const others = approvals.filter((a) => a.sessionId !== this.shown).slice(0, MAX_NOTICES);
    const byId = new Map(others.map((a) => [a.approvalId, a]));
    reconcile(this.container, this.rows, others.map((a) => a.approvalId),
      (id) => this.make(byId.get(id)), () => {});
    this.container.hidden = others.length === 0;
  }

  make(a) {
    const name = a.sessionName ?? a.sessionId;
    return el("div", { class: "approval-notice", testid: "approval-notice", role: "alert",
      data: { sessionId: a.sessionId, approvalId: a.approvalId, callId: a.callId } },
      el("span", { class: "notice-text" }, "Session ", el("strong", {}, visibleText(name)),
        ` waits for your approval: ${a.tool ?? "a tool"} asks to run `),
      el("code", { class: "notice-command" }, visibleText(a.summary ?? "")),
      el("button", { type: "button", testid: "open-approval",
        on: { click: () => this.onOpen(a.sessionId) } }, `go to ${visibleText(name)} to answer`));
  }
}
