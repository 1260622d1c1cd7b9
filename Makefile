# dsh — developer entry points. `make run` installs and runs a real command through dshd;
# `make test` runs the test suite. Both create .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
RUNDIR ?= .run
export DSH_SOCKET    ?= $(CURDIR)/$(RUNDIR)/dshd.sock
export DSH_STATE_DIR ?= $(CURDIR)/$(RUNDIR)/state

.PHONY: install install-test run start stop status test bench crash-test clean

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

# Start dshd in the background (embedded defaults; socket and state under ./.run), unless running.
start: install
	@mkdir -p $(RUNDIR)
	@if $(BIN)/dsh status >/dev/null 2>&1; then echo "dshd already running at $$DSH_SOCKET"; else \
	  env -u MAKELEVEL -u MAKEFLAGS -u MFLAGS -u MAKE_TERMOUT -u MAKE_TERMERR nohup $(BIN)/dshd --log-format json >$(RUNDIR)/dshd.log 2>&1 & \
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

stop:
	@pid=$$($(BIN)/dsh status --json 2>/dev/null | $(BIN)/python -c 'import json,sys; print(json.load(sys.stdin)["pid"])' 2>/dev/null); \
	if [ -n "$$pid" ]; then kill -TERM $$pid && echo "stopped dshd (pid $$pid)"; else echo "dshd is not running"; fi

test: install-test
	$(BIN)/python -m pytest -q

bench: install-test
	$(BIN)/python -m bench

# Kill -9 campaign (STORAGE.md): >= 300 SIGKILLs of dshd under load; exits 1 on any violation.
crash-test: install-test
	$(BIN)/python tests/crash/campaign.py --iterations 300

clean:
	rm -rf $(RUNDIR) build *.egg-info
