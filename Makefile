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

.PHONY: help install test test-fast lint durations
.DEFAULT_GOAL := help

help:
	@echo "make quickstart   the paper's headline effect: GPU demo where CUDA is present, else CPU"
	@echo "make test         the test suite (everything; CI runs it): about 1,082 s of CPU,"
	@echo "                  10 min wall on a 2-core AMD EPYC, load 1.0 (tools/durations.py)"
	@echo "make test-fast    the tests not marked slow: a smoke check of every command, about"
	@echo "                  107 s of CPU, 58 s wall on a 2-core AMD EPYC, load 2.0 (tools/durations.py)"
	@echo "make lint         ruff, and mypy on the package and its tests (pyproject.toml [tool.mypy])"
	@echo "make test-slurm   the sweep tests on a real single-node SLURM cluster (root; apt-get)"
	@echo "make install      create $(VENV) and install perencode into it"
	@echo "make reproduce-all  every paper grid, then figures and verify (GPU; EXECUTOR=slurm)"
	@echo "make test-compat  the fast tests and the version-sensitive slow ones under Python 3.10 +"
	@echo "                  torch 2.1.1 (the container's stack), then make rehearsal from a wheel"
	@echo "                  install without a checkout (COMPAT_MARKERS= for every test)"
	@echo "make rehearsal    make reproduce-all at CPU size, 8-17 min on 2 cores (EXECUTOR=slurm too)"
	@echo "make doctor       on a GPU node before any submit: is training right and fast there?"
	@echo "make durations    measure the durations the docs quote (NAMES=\"doctor test\"; default all)"
	@echo "                  and write them into the docs (tools/durations.py, docs/durations.json)"
	@echo "make device-check first contact with a GPU: syncs, resume, speed, memory (< 8 min)"
	@echo "make docker-build / docker-quickstart / docker-reproduce / apptainer-build"

# torch 2.1.1 (the paper's) supports NumPy 1 only: it installs with the container's pins.
TORCH_CONSTRAINTS = $(if $(filter torch==2.1.1,$(TORCH)),--constraint constraints/py310-torch2.1.1.txt)
# One stamp per TORCH: `make install TORCH=torch==2.1.1` over an existing .venv replaces its
# torch (and re-resolves the rest under the pins) instead of finding the venv up to date.
INSTALL_STAMP = $(VENV)/.installed-$(subst =,,$(subst <,,$(subst >,,$(TORCH))))

$(INSTALL_STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@want=$$(echo '$(TORCH)' | sed -n 's/^torch==//p'); \
	have=$$($(PY) -c "import torch; print(torch.__version__.split('+')[0])" 2>/dev/null); \
	if [ -z "$$have" ] || { [ -n "$$want" ] && [ "$$have" != "$$want" ]; }; then \
		echo "installing $(TORCH) (found: $${have:-none})"; \
		$(PY) -m pip install -q $(TORCH_CONSTRAINTS) "$(TORCH)"; fi
	$(PY) -m pip install -q $(TORCH_CONSTRAINTS) -e ".[dev,hf]"
	# `crosscheck` compares the schedule with timm 0.9.12 (the authors' version); its scheduler
	# imports without torchvision, whose PyPI wheel does not load beside the pinned torch.
	$(PY) -m pip install -q --no-deps timm==0.9.12
	@rm -f $(VENV)/.installed-*
	@touch $@

install: $(INSTALL_STAMP)

# The suite runs on a worker per core (pytest-xdist; TEST_WORKERS=0 runs it in one process):
# each worker starts with its share of the tests in file order and takes from the others'
# when it runs out, so a module's tests mostly stay together and its fixtures are built once.
TEST_WORKERS ?= auto
PYTEST_PARALLEL = $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist worksteal)
# The suite keeps Python's bytecode (__pycache__, ignored by git) even where the shell says
# PYTHONDONTWRITEBYTECODE, as many containers do: without it every pytest worker rewrites
# every test module's asserts again and every `perencode` process the tests start compiles
# the package again (about 6 s and 0.6 s of CPU each).
PYTEST_ENV = PYTHONDONTWRITEBYTECODE=

test: install
	$(PYTEST_ENV) $(PY) -m pytest $(PYTEST_PARALLEL)

test-fast: install
	$(PYTEST_ENV) $(PY) -m pytest $(PYTEST_PARALLEL) -m "not slow"

lint: install
	$(PY) -m ruff check perencode tests
	$(PY) -m mypy

# The durations the docs quote, measured here and written into the docs (tools/durations.py).
NAMES ?= all
durations: install
	$(PY) tools/durations.py measure $(NAMES)

-include make/*.mk
