"""dshd: the durable agent-host daemon."""

__version__ = "0.1.0"
