# dsh — developer entry points. `make run` installs and runs a real command through dshd;
# `make test` runs the test suite. Both create .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
RUNDIR ?= .run
export DSH_SOCKET    ?= $(CURDIR)/$(RUNDIR)/dshd.sock
export DSH_STATE_DIR ?= $(CURDIR)/$(RUNDIR)/state

# Service install (README "systemd"): dshd in a venv of its own, units generated from
# systemd/*.in; see systemd/install.sh. System: PREFIX, UNITDIR, DOCDIR; user: USER_PREFIX,
# USER_UNITDIR, USER_BINDIR.
PREFIX       ?= /opt/dsh
UNITDIR      ?= /etc/systemd/system
DOCDIR       ?= /usr/share/doc/dsh
USER_PREFIX  ?= $(HOME)/.local/share/dsh
USER_UNITDIR ?= $(HOME)/.config/systemd/user
USER_BINDIR  ?= $(HOME)/.local/bin
# Man pages and shell completions (README "Install"): MANDIR, BASH_COMPLETION_DIR,
# ZSH_COMPLETION_DIR, FISH_COMPLETION_DIR (system); USER_MANDIR, USER_*_COMPLETION_DIR (user).
USER_DATA    := $(or $(XDG_DATA_HOME),$(HOME)/.local/share)
MANDIR       ?= /usr/local/share/man
BASH_COMPLETION_DIR ?= /usr/local/share/bash-completion/completions
ZSH_COMPLETION_DIR  ?= /usr/local/share/zsh/site-functions
FISH_COMPLETION_DIR ?= /etc/fish/completions
USER_MANDIR  ?= $(USER_DATA)/man
USER_BASH_COMPLETION_DIR ?= $(USER_DATA)/bash-completion/completions
USER_ZSH_COMPLETION_DIR  ?= $(USER_DATA)/zsh/site-functions
USER_FISH_COMPLETION_DIR ?= $(USER_DATA)/fish/vendor_completions.d
SERVICE_ENV   = PYTHON=$(PYTHON) PREFIX=$(PREFIX) UNITDIR=$(UNITDIR) DOCDIR=$(DOCDIR) \
                USER_PREFIX=$(USER_PREFIX) USER_UNITDIR=$(USER_UNITDIR) USER_BINDIR=$(USER_BINDIR) \
                MANDIR=$(MANDIR) BASH_COMPLETION_DIR=$(BASH_COMPLETION_DIR) \
                ZSH_COMPLETION_DIR=$(ZSH_COMPLETION_DIR) FISH_COMPLETION_DIR=$(FISH_COMPLETION_DIR) \
                USER_MANDIR=$(USER_MANDIR) USER_BASH_COMPLETION_DIR=$(USER_BASH_COMPLETION_DIR) \
                USER_ZSH_COMPLETION_DIR=$(USER_ZSH_COMPLETION_DIR) \
                USER_FISH_COMPLETION_DIR=$(USER_FISH_COMPLETION_DIR)
# How long `make stop` waits for dshd to exit (it settles calls and flushes in < 10 s).
STOP_WAIT    ?= 20

.PHONY: install install-test bytecode run start stop status test bench crash-test clean \
        install-system uninstall-system install-user uninstall-user day vendor-web

$(BIN)/python:
	@$(PYTHON) -m venv $(VENV) || { echo "python3 -m venv failed: install it with 'apt-get install -y python3-venv'"; exit 1; }
	$(BIN)/pip install -q --upgrade pip

# Stamps: reinstall only when pyproject.toml changes (the install is editable).
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	@touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	@touch $@ $(VENV)/.installed

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

# Bytecode of the project's own packages (the editable install leaves none): where
# PYTHONDONTWRITEBYTECODE is set, as on CI machines, every dshd, dsh and call host compiled
# them from source again at each start. compileall redoes only what changed.
bytecode: | $(BIN)/python
	@$(BIN)/python -m compileall -q -j 0 protocol dshd client

# Start dshd in the background (embedded defaults; socket and state under ./.run), unless running.
start: install bytecode
	@mkdir -p $(RUNDIR)
	@if $(BIN)/dsh status >/dev/null 2>&1; then echo "dshd already running at $$DSH_SOCKET"; else \
	  env -u MAKELEVEL -u MAKEFLAGS -u MFLAGS -u MAKE_TERMOUT -u MAKE_TERMERR nohup $(BIN)/dshd --log-format json >>$(RUNDIR)/dshd.log 2>&1 & \
	  for i in $$(seq 1 100); do $(BIN)/dsh status >/dev/null 2>&1 && break; sleep 0.1; done; \
	  $(BIN)/dsh status >/dev/null || { echo "dshd did not start; see $(RUNDIR)/dshd.log"; cat $(RUNDIR)/dshd.log; exit 1; }; \
	  echo "dshd started (socket $$DSH_SOCKET, log $(RUNDIR)/dshd.log)"; fi

# The main job end to end: a real command through dshd, output streamed live.
run: start
	$(BIN)/dsh run -- sh -c 'echo "hello from $$(uname -sr) via dshd"; for i in 1 2 3; do echo "step $$i"; sleep 0.2; done; ls'
	$(BIN)/dsh sessions
	@echo "dshd keeps running; try: DSH_SOCKET=$$DSH_SOCKET $(BIN)/dsh status   (stop it with 'make stop')"

status: install
	$(BIN)/dsh status

# How many call hosts are alive under the state dir (`python -m dshd hosts`): 0 without a state
# dir, "unknown" when the count fails (never 0: `make clean` must not delete running calls' state).
COUNT_HOSTS = { if [ ! -d "$$DSH_STATE_DIR" ]; then echo 0; else \
                $(BIN)/python -m dshd hosts --state-dir "$$DSH_STATE_DIR" --json 2>/dev/null \
                | $(BIN)/python -c 'import json,sys; print(len(json.load(sys.stdin)))' 2>/dev/null \
                || echo unknown; fi; }

# SIGTERM, then wait (bounded) until the process is gone (a zombie counts as gone); fails if it
# is still there. The pid comes from `dsh status`, else (a daemon that does not answer) from
# its held state lock. With on_stop = "detach" (the default) running tool calls keep running in
# their call hosts and the next `make start` re-adopts them: it says how many.
stop:
	@lock="$$DSH_STATE_DIR/dshd.lock"; \
	pid=$$($(BIN)/dsh status --json 2>/dev/null | $(BIN)/python -c 'import json,sys; print(json.load(sys.stdin)["pid"])' 2>/dev/null); \
	if [ -z "$$pid" ] && [ -f "$$lock" ] && ! flock -n "$$lock" true 2>/dev/null; then pid=$$(head -n1 "$$lock"); fi; \
	if [ -z "$$pid" ]; then echo "dshd is not running"; exit 0; fi; \
	kill -TERM $$pid 2>/dev/null || true; \
	alive() { [ -r /proc/$$1/stat ] && [ "$$(sed 's/.*) //' /proc/$$1/stat | cut -c1)" != Z ]; }; \
	for i in $$(seq 1 $$(( $(STOP_WAIT) * 10 ))); do alive $$pid || break; sleep 0.1; done; \
	if alive $$pid; then echo "dshd (pid $$pid) is still running after $(STOP_WAIT) s; see $(RUNDIR)/dshd.log, or kill -9 $$pid"; exit 1; fi; \
	n=$$($(COUNT_HOSTS)); \
	if [ "$$n" = unknown ]; then echo "stopped dshd (pid $$pid); could not count its call hosts ('$(BIN)/python -m dshd hosts --state-dir $$DSH_STATE_DIR' failed): running tool calls may keep running"; \
	elif [ "$$n" -gt 0 ]; then echo "stopped dshd (pid $$pid); $$n tool call(s) keep running in their call hosts: the next 'make start' re-adopts them (list: $(BIN)/python -m dshd hosts; end: make clean CANCEL=1)"; \
	else echo "stopped dshd (pid $$pid)"; fi

test: install-test bytecode
	$(BIN)/python -m pytest -q -n 4 --dist loadfile

bench: install-test bytecode
	$(BIN)/python -m bench

# Kill -9 campaign (STORAGE.md, HOST.md §7): >= 300 SIGKILLs of dshd under load, half of them
# while calls that have run >= 10 s still run (>= 99% must settle with their real exit code,
# none twice, none lost); prints the figures, exits 1 on any violation.
crash-test: install-test
	$(BIN)/python tests/crash/campaign.py --iterations 300

# A scripted day of use (issue 15): many dsh run in several dirs, named sessions, detach and
# attach, approval rules, chat re-join, rm and prune against a real dshd with max_state_bytes;
# prints dsh sessions and du -sh of the state before/after dsh prune; fails on a failed step,
# a step this build lacks, or the state over its bound. MINUTES=1 for a short one.
MINUTES ?= 30
day: install-test
	$(BIN)/python tools/day.py --minutes $(MINUTES) $(DAY_ARGS)

# Stops the daemon first (never deletes its socket and state from under it), and refuses while
# call hosts still run tool calls there (they outlive a stop); CANCEL=1 ends them first.
CANCEL ?=
clean: stop
	@n=$$($(COUNT_HOSTS)); \
	if [ "$$n" = unknown ]; then \
	  echo "make clean: could not count the call hosts under $$DSH_STATE_DIR ('$(BIN)/python -m dshd hosts --state-dir $$DSH_STATE_DIR' failed); nothing was deleted"; exit 1; fi; \
	if [ "$$n" -gt 0 ] && [ "$(CANCEL)" != 1 ]; then \
	  echo "make clean: $$n tool call(s) still run in their call hosts under $$DSH_STATE_DIR; end them with 'make clean CANCEL=1' (or $(BIN)/python -m dshd hosts --cancel), or wait until they finish"; exit 1; fi; \
	if [ "$$n" -gt 0 ]; then $(BIN)/python -m dshd hosts --state-dir "$$DSH_STATE_DIR" --cancel || exit 1; fi
	rm -rf $(RUNDIR) build *.egg-info

# The web page's vendored xterm.js (client/web/static/vendor/xterm/): npm pack of the pinned
# versions in tools/vendor-web.sh; only to move the pins (the result is committed).
vendor-web:
	tools/vendor-web.sh

install-system:
	@$(SERVICE_ENV) systemd/install.sh install-system

uninstall-system:
	@$(SERVICE_ENV) systemd/install.sh uninstall-system

install-user:
	@$(SERVICE_ENV) systemd/install.sh install-user

uninstall-user:
	@$(SERVICE_ENV) systemd/install.sh uninstall-user
