"""Process spawn, output capture and spill for tool calls (EXEC.md §2).

``capture`` is the pure, synchronous window/totals/spill-buffer state of one call's output;
``process`` spawns an already-wrapped argv in its own process group and drives a capture until
the call settles. Sandbox providers (``sandbox*.py``) wrap argv before ``run_command`` sees it.
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
