# veritrain: `make demo` runs the bundled example end to end, `make test` runs the test suite.
# Both create .venv when missing and install the pinned environment (CPU PyTorch first, so pip
# never pulls a CUDA build of several GB).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
TORCH  := torch==2.13.0
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: demo test test-slow install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/python pyproject.toml requirements.lock requirements-test.lock
	$(PIP) install $(TORCH)
	$(PIP) install -r requirements.lock -r requirements-test.lock
	$(PIP) install --no-deps -e '.[ui]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/veritrain run

test: install
	$(BIN)/python -m pytest -q -m "not slow"

test-slow: install
	$(BIN)/python -m pytest -q -m slow

clean:
	rm -rf $(VENV) runs .veritrain experiments.md
