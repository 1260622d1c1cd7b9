"""Tool call execution: output capture, the call host's daemon side, sandboxes (EXEC.md §2-§3).

``capture`` is the pure, synchronous window/totals state of one call's output, fed from the
call host's log; ``hosted`` starts a call host (:mod:`dshd.callhost`) for an already-wrapped
argv, talks to it over its control socket and runs the call to an ``ExecOutcome``; ``spawn``
holds the command's script (``BashScript``), its identity (``RunAs``) and the spawn sentences.
Sandbox providers (``sandbox*.py``, ``confine``, ``workspace``, ``tmp_budget``, ``self_test``;
the Landlock launcher ``landlock_exec`` with ``landlock_seccomp``) wrap argv before
``run_hosted`` sees it; ``sandbox.probe`` picks one.
"""

from dshd.execution.capture import OutputCapture, ShellOutputLimits
from dshd.execution.spawn import bash_argv

__all__ = [
    "OutputCapture",
    "ShellOutputLimits",
    "bash_argv",
]
