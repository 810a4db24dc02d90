# Containers and the pinned-stack check (issue 7); included by the main Makefile, which defines
# PY (the development venv's python). docs/container.md explains each target.
#
# docker-reproduce and docker-quickstart run the main Makefile's reproduce-all and quickstart
# with every `perencode` call executed in the container: those recipes invoke the CLI as
# $(PERENCODE) with repository-relative paths (the checkout is mounted at /work), and their
# prerequisites that set up the host's .venv are listed in $(PERENCODE_DEPS), emptied here.

DOCKER ?= docker
DOCKER_IMAGE ?= perencode:torch2.1.1
DOCKER_GPUS ?= all
# Run as the host user so that runs/ and figures in the mounted checkout stay the user's files.
DOCKER_USER ?= $(shell id -u):$(shell id -g)
DOCKER_RUN = $(DOCKER) run --rm --init --ipc=host --user $(DOCKER_USER) -e HOME=/tmp \
	-v "$(CURDIR)":/work -w /work

APPTAINER ?= apptainer
APPTAINER_IMAGE ?= perencode.sif

# The image's Python is 3.10; where no 3.10 is installed, 3.11 takes the same pins.
COMPAT_CANDIDATES = python3.10 $(wildcard $(HOME)/.pyenv/versions/3.10*/bin/python3.10) python3.11
COMPAT_PYTHON ?= $(firstword $(foreach p,$(COMPAT_CANDIDATES),$(shell $(p) -c 'print("$(p)")' 2>/dev/null)))
COMPAT_VENV ?= .venv-compat
COMPAT_CONSTRAINTS ?= constraints/py310-torch2.1.1.txt
COMPAT_STAMP = $(COMPAT_VENV)/.installed

.PHONY: docker-build docker-reproduce docker-quickstart apptainer-build test-compat

# The commit goes into the image (label and PERENCODE_GIT_COMMIT, read into each env.json).
GIT_COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)

docker-build:
	$(DOCKER) build --build-arg GIT_COMMIT=$(GIT_COMMIT) -t $(DOCKER_IMAGE) .

docker-reproduce: docker-build
	$(MAKE) reproduce-all PERENCODE_DEPS= \
		PERENCODE='$(DOCKER_RUN) --gpus $(DOCKER_GPUS) $(DOCKER_IMAGE)'

docker-quickstart: docker-build
	$(MAKE) quickstart PERENCODE_DEPS= PERENCODE='$(DOCKER_RUN) $(DOCKER_IMAGE)'

apptainer-build:
	$(APPTAINER) build --build-arg GIT_COMMIT=$(GIT_COMMIT) $(APPTAINER_IMAGE) apptainer.def

# The PyPI build of torch 2.1.1 (CUDA wheels included, about 2.5 GB; it runs on CPU) with the
# container's pins, then the whole test suite. PyPI has no CPU-only build of torch 2.1.1 for
# Linux, and the CUDA build does not import without its nvidia-* wheels: the download is
# the price (about 3 minutes on CI's machine). PIP_CONSTRAINT also pins the editable build's
# setuptools.
$(COMPAT_STAMP): pyproject.toml $(COMPAT_CONSTRAINTS)
	@test -n "$(COMPAT_PYTHON)" || { echo "test-compat: no python3.10 or python3.11 found"; exit 1; }
	rm -rf $(COMPAT_VENV)
	$(COMPAT_PYTHON) -m venv $(COMPAT_VENV)
	PIP_CONSTRAINT=$(abspath $(COMPAT_CONSTRAINTS)) $(COMPAT_VENV)/bin/python -m pip install \
		--constraint $(COMPAT_CONSTRAINTS) torch==2.1.1 -e '.[dev]'
	# timm's scheduler for crosscheck's tests, as `make install` has it (the authors' version).
	$(COMPAT_VENV)/bin/python -m pip install -q --no-deps timm==0.9.12
	# torchtext and torchdata, the pair built for torch 2.1.1, so that crosscheck's language-
	# model group runs whole here (their vocabulary is torchtext's; no wheel pairs with the
	# newer torch of `make install`): --no-deps, or pip would replace the pinned torch.
	$(COMPAT_VENV)/bin/python -m pip install -q --no-deps torchtext==0.16.1 torchdata==0.7.1
	PIP_CONSTRAINT=$(abspath $(COMPAT_CONSTRAINTS)) $(COMPAT_VENV)/bin/python -m pip install \
		-q --constraint $(COMPAT_CONSTRAINTS) requests==2.34.2 tqdm
	touch $@

# E9 selects syntax errors only, which with --target-version include syntax newer than 3.10
# (`except*`, `type X = ...`, PEP 701 f-strings); style is `make lint`'s business.
#
# The tests: every fast one, and of the slow ones (end-to-end sweeps, the same code paths as
# the fast ones at greater length) those marked `compat`, where the torch or Python version
# decides the outcome: bit-identical resume, checkpoints across devices, crosscheck's loop
# against the authors'; and the tests of a second or so that are marked slow only to keep
# make test-fast within its minute (they ran here as fast ones and still do). The whole suite twice did not fit CI's 90 minutes; the rehearsal from
# the wheel below runs every grid end to end on this stack. COMPAT_MARKERS= runs them all.
COMPAT_MARKERS ?= not slow or compat
test-compat: $(COMPAT_STAMP)
	$(COMPAT_VENV)/bin/python -m ruff check --target-version py310 --select E9 perencode tests
	@$(COMPAT_VENV)/bin/python -c 'import sys, torch, numpy; print(f"test-compat: python {sys.version.split()[0]}, torch {torch.__version__}, numpy {numpy.__version__}")'
	$(PYTEST_ENV) $(COMPAT_VENV)/bin/python -m pytest $(PYTEST_PARALLEL) $(if $(COMPAT_MARKERS),-m "$(COMPAT_MARKERS)")
	$(MAKE) --no-print-directory rehearsal-wheel

# The container's install, rehearsed without a container: the package's wheel installed (not
# editable, [hf] included) with the constraints into its own venv, and `make rehearsal` run
# with that venv's `perencode` from an export of the repository that has no .git, as the
# image has none (the commit comes from PERENCODE_GIT_COMMIT, as the image sets it). Both live
# outside the checkout, where no `git rev-parse` can find it.
WHEEL_VENV ?= $(or $(TMPDIR),/tmp)/perencode-venv-wheel
WHEEL_TREE ?= $(or $(TMPDIR),/tmp)/perencode-rehearsal-tree

$(WHEEL_VENV)/.installed: pyproject.toml $(COMPAT_CONSTRAINTS) $(COMPAT_STAMP)
	@test -n "$(COMPAT_PYTHON)" || { echo "rehearsal-wheel: no python3.10 or python3.11 found"; exit 1; }
	rm -rf $(WHEEL_VENV) $(WHEEL_VENV).whl
	$(COMPAT_PYTHON) -m venv $(WHEEL_VENV)
	PIP_CONSTRAINT=$(abspath $(COMPAT_CONSTRAINTS)) $(WHEEL_VENV)/bin/python -m pip install -q \
		--constraint $(COMPAT_CONSTRAINTS) torch==2.1.1 '.[hf]'
	touch $@

# test-compat's two installs (its venv, then the wheel's), without its tests: .ci/run starts
# them in the background, while lint and make test run (mostly downloading and unpacking).
.PHONY: compat-install
compat-install: $(WHEEL_VENV)/.installed

# The wheel itself is rebuilt and reinstalled (without its dependencies) every time.
.PHONY: rehearsal-wheel
rehearsal-wheel: $(WHEEL_VENV)/.installed
	rm -rf $(WHEEL_VENV).whl $(WHEEL_TREE) && mkdir -p $(WHEEL_TREE)
	PIP_CONSTRAINT=$(abspath $(COMPAT_CONSTRAINTS)) $(WHEEL_VENV)/bin/python -m pip wheel \
		--no-deps -q --wheel-dir $(WHEEL_VENV).whl .
	$(WHEEL_VENV)/bin/python -m pip install -q --no-deps --force-reinstall \
		$(WHEEL_VENV).whl/perencode-*.whl
	git archive HEAD | tar -x -C $(WHEEL_TREE)
	rm -rf $(WHEEL_TREE)/perencode $(WHEEL_TREE)/tests  # as in the image: recipes, no sources
	@cd $(WHEEL_TREE) && $(abspath $(WHEEL_VENV))/bin/python -c 'import perencode, sys; assert "site-packages" in perencode.__file__, perencode.__file__; print("rehearsal-wheel:", perencode.__file__)'
	cd $(WHEEL_TREE) && PERENCODE_GIT_COMMIT=$$(git -C $(CURDIR) rev-parse HEAD) \
		$(MAKE) --no-print-directory rehearsal PERENCODE=$(abspath $(WHEEL_VENV))/bin/perencode \
		PERENCODE_DEPS=
	@grep -q "\"git_commit\": \"$$(git rev-parse HEAD)\"" \
		$$(find $(WHEEL_TREE)/rehearsal/runs -name env.json | head -1) && \
		echo "rehearsal-wheel: env.json records the commit from PERENCODE_GIT_COMMIT"
