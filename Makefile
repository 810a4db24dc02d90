# perencode: `make quickstart` (demo of the paper's effect) and `make test`.
# Every target installs what it needs into .venv first.

PYTHON ?= python3
VENV ?= .venv
PY ?= $(VENV)/bin/python
# Installed first and pinned: an unpinned torch pulled in by a dependency downloads GBs.
TORCH ?= torch==2.13.0
export OMP_NUM_THREADS ?= 1
# How targets call the CLI; the container targets swap in `docker run ... perencode`.
PERENCODE ?= $(PY) -m perencode
PERENCODE_DEPS ?= install

.PHONY: help install test test-fast lint
.DEFAULT_GOAL := help

help:
	@echo "make quickstart   the paper's headline effect: GPU demo where CUDA is present, else CPU"
	@echo "make test         the test suite (everything; CI runs it)"
	@echo "make test-fast    the tests not marked slow (under a minute)"
	@echo "make lint         ruff"
	@echo "make test-slurm   the sweep tests on a real single-node SLURM cluster (root; apt-get)"
	@echo "make install      create $(VENV) and install perencode into it"
	@echo "make reproduce-all  every paper grid, then figures and verify (GPU; EXECUTOR=slurm)"
	@echo "make test-compat  the tests under Python 3.10 + torch 2.1.1 (the container's stack)"
	@echo "make docker-build / docker-quickstart / docker-reproduce / apptainer-build"

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	@touch $@

install: $(VENV)/.installed

test: install
	$(PY) -m pytest

test-fast: install
	$(PY) -m pytest -m "not slow"

lint: install
	$(PY) -m ruff check perencode tests

-include make/*.mk
