"""The verdicts of ``dsh fsck`` through dshd (STORAGE.md §5).

Theory of operation: a session is in one of a few states, each a ``Verdict``:

- ``ok``: the log reads clean and opening it appended nothing;
- ``repaired``: opening it for write appended crash closers. ``session.list`` reads logs
  without opening them, so its ``lastSeq`` against the one of ``session.get`` (which opens the
  session, and repairs it) says whether anything was appended; ``repairs_in`` reads the new
  events and names the closers (``protocol.events.closer_label``, the labels of the daemon's
  offline check): ``TOOL_OUTCOME_UNKNOWN`` / ``TOOL_NOT_STARTED`` results,
  approvals decided ``by: repair``, turns ended ``interrupted`` (and, with those, closed steps).
  New events without any closer are live activity: the session is ``ok``;
- ``damaged``: the daemon refuses to open it (a corrupt frame, a missing log, a newer format);
- ``unchecked``: the daemon could not open it for another reason (locked by another process,
  the open-session limit): neither good nor known bad.

``Verdict.failed`` (damaged, unchecked) decides the exit status of ``dsh fsck``. Reading the
logs without a daemon is ``dsh fsck --offline``, which runs ``python -m dshd fsck --offline``
(the daemon's package owns its storage format; this client never reads the files itself).
"""

from __future__ import annotations

from typing import Iterable

import msgspec

from protocol.events import AnyEvent, StepEnd, closer_label, event_type
from protocol.verdicts import Verdict

__all__ = ["Verdict", "repairs_in"]


def repairs_in(events: Iterable[AnyEvent]) -> list[str]:
    """Labels of the crash closers among ``events`` (``session.events``, typed by
    ``protocol.events``), in order; the labels are ``protocol.events.closer_label``'s, the
    ones the daemon's offline check prints.

    A ``step/end`` is a closer only beside other closers: steps also end normally.
    """
    labels: list[str] = []
    steps: list[str] = []
    for event in events:
        if isinstance(event, StepEnd):
            steps.append(f"step {event.data.step_id} closed")
            continue
        label = closer_label(event_type(event), msgspec.to_builtins(event.data))
        if label is not None:
            labels.append(label)
    return labels + steps if labels else []
