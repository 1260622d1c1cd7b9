"""The lane view of one session: what its subscribers mirror (PROTOCOL.md §3.3, OPS.md).

Theory of operation: the lane is a JSON value (``protocol.lane.LaneView``) held in a
``protocol.Tracker``, published by the session's ``Publisher`` (``dshd.sessions.streams``).
:class:`Lane` is the only writer of that value: the session's settings, the unsettled calls
(``tools``), the pending approvals, the last ``RECENT_MAX`` settled calls (``recent``, newest
first) and the running turn. Its writer methods take the typed values of ``protocol.lane``
where the lane has a struct (a call's entry, an approval request, a recent entry, a turn;
a call's live output, a settings value or a turn field is a plain JSON value), change the
tracker and tell the publisher what kind of change it was (``dshd.sessions.streams``): the
running turn's text is *bulk* (published at the next paced publish, with the calls' output,
which the publisher copies in through :meth:`Lane.tool_output`); everything else is a
*control* change (a rename too: the lane's ``session`` carries the name), published at
once whatever the byte pause says. The turn's ``calls`` (the
current step's calls, ``protocol.lane.TurnCall``) follow the calls' own entries: whenever a
call of the step enters ``tools``, starts running or enters ``recent`` (settled), its
``state`` in ``turn.calls`` changes with it, in the same batch, so a subscriber never needs
to join ``turn.calls`` with ``tools`` and ``recent`` to know where a call is. Where a method says
"published now" (a call leaving the lane, a turn beginning) it publishes before it returns,
so that every subscriber sees that state. The lane is derived: it is rebuilt from
the log when a session is opened (``recent`` from its ``tool/result`` events) and never read
back as the truth.
"""

from __future__ import annotations

from typing import Any, Callable

from protocol.lane import (
    ApprovalRequest, LaneSession, LaneView, RecentEntry, ToolEntry, TurnCall, TurnView, plain,
)
from protocol.tracker import Tracker

from .streams import Publisher

#: Settled calls the lane's ``recent`` keeps (newest first).
RECENT_MAX = 20
#: Most bytes of a call's arguments (their JSON) the lane carries; more is cut (``argsCut``).
LANE_ARGS_BYTES = 4096


def lane_args(encoded: str) -> tuple[object, bool]:
    """What the lane shows of arguments whose JSON is ``encoded``: ``(value, cut)``.

    Up to ``LANE_ARGS_BYTES``: ``(None, False)``, the arguments themselves are shown. Past it
    the first ``LANE_ARGS_BYTES`` bytes of the JSON text, as a string cut at a character
    boundary, and ``cut`` True.
    """
    data = encoded.encode("utf-8")
    if len(data) <= LANE_ARGS_BYTES:
        return None, False
    return data[:LANE_ARGS_BYTES].decode("utf-8", "ignore"), True


class Lane:
    """The lane value of one session and its publisher (module doc)."""

    def __init__(self, session: LaneSession, recent: list[RecentEntry], *,
                 before_flush: Callable[[], None], interval: float, rate: float) -> None:
        view = LaneView(session, {}, {}, recent[:RECENT_MAX], None)
        self.tracker = Tracker(plain(view))
        self.publisher = Publisher(self.tracker, before_flush=before_flush, interval=interval,
                                   rate=rate)

    def mark_dirty(self) -> None:
        """A bulk change (a call's output changed): the next paced publish copies it."""
        self.publisher.mark_dirty()

    def _changed(self) -> None:
        self.publisher.mark_changed()

    def publish_now(self) -> None:
        self.publisher.publish_now()

    # ----------------------------------------------------------------- settings
    def show_settings(self, *, policy: str | None = None, sandbox: str | None = None) -> None:
        if policy is not None:
            self.tracker.set(["session", "approvalPolicy"], policy)
        if sandbox is not None:
            self.tracker.set(["session", "sandbox"], sandbox)
        self._changed()

    def show_name(self, name: str | None) -> None:
        """The session's name (None: it has none): a control change, like the settings."""
        self.tracker.set(["session", "name"], name)
        self._changed()

    # ----------------------------------------------------------------- tools
    def has_tool(self, call_id: str) -> bool:
        return call_id in self.tracker.value["tools"]

    def enter_tool(self, call_id: str, entry: ToolEntry) -> None:
        self.tracker.set(["tools", call_id], plain(entry))
        self._turn_call(call_id, state=entry.state)
        self._changed()

    def tool_running(self, call_id: str) -> None:
        """The call's command starts: its state is ``running`` (if it was not already)."""
        if self.tracker.value["tools"][call_id]["state"] != "running":
            self.tracker.set(["tools", call_id, "state"], "running")
            self._turn_call(call_id, state="running")
            self._changed()

    def drop_tool(self, call_id: str) -> None:
        """Remove a call that never really entered (its start failed)."""
        if self.has_tool(call_id):
            self.tracker.delete(["tools", call_id])
            self._changed()

    def tool_output(self, call_id: str, text: str, truncation: dict,
                    spill_path: str | None) -> None:
        """Copy a running call's output window into ``tools[callId].output`` (the publisher's
        ``before_flush`` does this for every changed capture); ``spill_path`` once it is new."""
        base = ["tools", call_id, "output"]
        self.tracker.set_text(base + ["content", 0, "text"], text)
        self.tracker.set(base + ["truncation"], dict(truncation))
        if spill_path is not None:
            self.tracker.set(base + ["details", "spillPath"], spill_path)

    def copy_output(self, call: Any) -> None:
        """Copy one call's capture (``dshd.sessions.output.Running``) onto the lane when it
        changed since the last copy."""
        cap = call.capture
        if cap is None or cap.version == call.synced_version:
            return
        spill = None
        if cap.spill_path and call.synced_spill != cap.spill_path:
            spill = call.synced_spill = cap.spill_path
        self.tool_output(call.call_id, cap.text, cap.truncation, spill)
        call.synced_version = cap.version

    def settle_tool(self, call_id: str, entry: RecentEntry, call: Any = None) -> None:
        """A call settled: its final output is published now (``call``, the settling
        ``Running``: its output alone is copied; without it every call's), then it leaves
        ``tools`` (and ``approvals``) and enters ``recent``, published now too. Both go at
        once whatever the byte pause says; their bytes count toward it."""
        if call is None:
            self.publisher.publish_now()
        else:
            self.copy_output(call)
            self.publisher.publish_control()
        self.tracker.delete(["tools", call_id])
        for approval_id, request in list(self.tracker.value["approvals"].items()):
            if request.get("callId") == call_id:
                self.tracker.delete(["approvals", approval_id])
        self.enter_recent(entry)
        self.publisher.publish_control()

    def enter_recent(self, entry: RecentEntry) -> None:
        self.tracker.insert(["recent"], 0, plain(entry))
        self._turn_call(entry.call_id, state="settled", exitCode=entry.exit_code,
                        errorCode=entry.error_code)
        excess = len(self.tracker.value["recent"]) - RECENT_MAX
        if excess > 0:
            self.tracker.splice(["recent"], RECENT_MAX, excess, [])
        self._changed()

    # ----------------------------------------------------------------- approvals
    def show_approval(self, approval_id: str, request: ApprovalRequest) -> None:
        self.tracker.set(["approvals", approval_id], plain(request))
        self._changed()

    def hide_approval(self, approval_id: str) -> None:
        if approval_id in self.tracker.value["approvals"]:
            self.tracker.delete(["approvals", approval_id])
            self._changed()

    # ----------------------------------------------------------------- the turn
    def begin_turn(self, view: TurnView) -> None:
        """A turn begins: published now, so every subscriber sees it however short it is."""
        self.tracker.set(["turn"], plain(view))
        self.publisher.publish_control()

    def set_turn(self, view: TurnView | None) -> None:
        """Replace the turn value (a new step; None between turns)."""
        if view is None and self.tracker.value.get("turn") is None:
            return
        self.tracker.set(["turn"], None if view is None else plain(view))
        self._changed()

    def update_turn(self, key: str, value: Any) -> None:
        """Change one key of the running turn (``state``); no turn: nothing."""
        if isinstance(self.tracker.value.get("turn"), dict):
            self.tracker.set(["turn", key], value)
            self._changed()

    def turn_calls(self, calls: list[TurnCall]) -> None:
        """The current step's calls (``turn.calls``, in the answer's order). A call already in
        ``tools`` takes its state (and name) from there (a resumed turn's re-adopted calls);
        from here on the calls' own changes move their states (module doc)."""
        if not isinstance(self.tracker.value.get("turn"), dict):
            return
        tools = self.tracker.value["tools"]
        values = []
        for call in calls:
            value = plain(call)
            entry = tools.get(call.call_id)
            if entry is not None:
                value["state"], value["name"] = entry["state"], entry["name"]
            values.append(value)
        self.tracker.set(["turn", "calls"], values)
        self._changed()

    def _turn_call(self, call_id: str, **fields: Any) -> None:
        """Change the fields of ``call_id``'s entry in ``turn.calls``, if the step has it."""
        turn = self.tracker.value.get("turn")
        if not isinstance(turn, dict):
            return
        for index, call in enumerate(turn.get("calls") or ()):
            if call.get("callId") == call_id:
                for key, value in fields.items():
                    if call.get(key) != value:
                        self.tracker.set(["turn", "calls", index, key], value)
                return

    def turn_text(self, text: str, *, append: bool = False) -> None:
        """Set (or grow, ``a`` ops) the running turn's assistant text."""
        if append:
            self.tracker.append(["turn", "text"], text)
        else:
            self.tracker.set_text(["turn", "text"], text)
        self.mark_dirty()


class TurnLane:
    """The lane's ``turn`` value as the agent loop gets it (``dshd.agent.port.TurnLane``):
    the five turn writers of one :class:`Lane`, and nothing else of it."""

    __slots__ = ("begin_turn", "set_turn", "update_turn", "turn_calls", "turn_text")

    def __init__(self, lane: Lane) -> None:
        self.begin_turn = lane.begin_turn
        self.set_turn = lane.set_turn
        self.update_turn = lane.update_turn
        self.turn_calls = lane.turn_calls
        self.turn_text = lane.turn_text
