"""Process spawn, output capture and spill for tool calls (EXEC.md §2).

``capture`` is the pure, synchronous window/totals/spill-buffer state of one call's output (and
its spill file's writer, ``SpillSink``); ``process`` drives an already-wrapped argv in its own
process group (``spawn`` starts it, ``procs`` finds and signals its processes) and a capture
until the call settles. Sandbox providers (``sandbox*.py``, ``confine``, ``workspace``,
``tmp_budget``, ``self_test``; the Landlock launcher ``landlock_exec`` with ``landlock_seccomp``)
wrap argv before ``run_command`` sees it; ``sandbox.probe`` picks one.
"""

from dshd.execution.capture import OutputCapture, ShellOutputLimits, SpillSink
from dshd.execution.process import ExecOutcome, bash_argv, run_command

__all__ = [
    "ExecOutcome",
    "OutputCapture",
    "ShellOutputLimits",
    "SpillSink",
    "bash_argv",
    "run_command",
]
