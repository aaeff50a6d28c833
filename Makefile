# veritrain: `make demo` runs the bundled example end to end, `make test` runs the test suite.
# Both create .venv when missing and install the pinned environment (CPU PyTorch first, so pip
# never pulls a CUDA build of several GB). `make demo` installs only the runtime and the ui extra
# (requirements.lock); `make test` adds the test tools (requirements-test.lock: pytest, Playwright,
# Ray, the real-data fixtures).
PYTHON  ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
TORCH   := torch==2.13.0
# --no-compile: no bytecode for the thousands of modules never imported (half of the install's CPU time);
# Python compiles what a command imports, once, on first use
INSTALL := $(BIN)/python -m pip --disable-pip-version-check -q install --no-compile

.PHONY: demo test test-slow install install-test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/python pyproject.toml requirements.lock
	$(INSTALL) $(TORCH)
	$(INSTALL) -r requirements.lock
	$(INSTALL) --no-deps -e '.[ui]'
	touch $@

# the runtime pins go along, so the test tools never move a runtime package off its pin
$(VENV)/.installed-test: $(VENV)/.installed requirements.lock requirements-test.lock
	$(INSTALL) -r requirements.lock -r requirements-test.lock
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

demo: install
	$(BIN)/veritrain run

test: install-test
	$(BIN)/python -m pytest -q -m "not slow"

test-slow: install-test
	$(BIN)/python -m pytest -q -m slow

clean:
	rm -rf $(VENV) runs .veritrain experiments.md
