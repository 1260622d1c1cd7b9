"""The call host: one stdlib-only process per running call (HOST.md, issue 12).

Theory of operation: the daemon starts ``main.py`` as ``python3 -I -S`` for every tool call;
the host owns the command's PTY or pipes, its stdin, the raw output log and the exit record,
and outlives the daemon. Its modules import each other as siblings (the script's directory
is put on ``sys.path``) and as this package (the daemon imports :mod:`dshd.callhost.log`, the
reader). Nothing here imports another dshd module or anything outside the standard library.
"""
