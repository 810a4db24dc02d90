# Reproduction targets (issue 6); included by the main Makefile, which defines PY,
# PERENCODE (how the CLI is called: `$(PY) -m perencode`, or the container's) and
# PERENCODE_DEPS (install). REPRODUCE.md explains what each grid reproduces.
#
#   make quickstart                      quick demo (GPU where present, else CPU), claims report
#   make reproduce-all                   every grid of recipes/paper, then figures and verify
#   make reproduce-all EXECUTOR=slurm SWEEP_ARGS="--partition gpu"
#   make reproduce-all JOBS=8            runs at once with the local executor (GPUs round-robin)

RUNS ?= runs
FIGURES ?= figures
# Runs at once in the quick demo (empty: 2 on the CPU, 6 sharing the GPU).
QUICK_JOBS ?=
EXECUTOR ?= local
DEVICE ?= auto
# One run per GPU by default; 1 without GPUs.
GPU_COUNT := $(shell nvidia-smi -L 2>/dev/null | grep -c '^GPU')
JOBS ?= $(if $(filter-out 0,$(GPU_COUNT)),$(GPU_COUNT),1)
SWEEP_ARGS ?=
PAPER_GRIDS ?= $(sort $(wildcard recipes/paper/*.toml))
LM_DATA ?= data/wikitext103

.PHONY: quickstart reproduce-all

# The wall time printed at the end includes the install (a fresh clone's first run).
# DEVICE=auto runs the GPU demo at the paper's shapes where a CUDA device is present;
# DEVICE=cpu forces the CPU demo.
quickstart:
	@start=$$(date +%s); \
	$(if $(PERENCODE_DEPS),$(MAKE) --no-print-directory $(PERENCODE_DEPS) &&) \
	$(PERENCODE) quickstart --device $(DEVICE) --out $(RUNS) --figures $(FIGURES) \
		$(if $(QUICK_JOBS),--jobs $(QUICK_JOBS)); status=$$?; \
	took=$$(( $$(date +%s) - start )); \
	echo "make quickstart took $$(( took / 60 )) min $$(( took % 60 )) s (install included)"; \
	exit $$status

# Grids run in name order, so the Fig. 3 runs exist before Fig. 5 analyses them and the
# Fig. 2/8/11 runs before Fig. 12-14 link to them. A failed grid does not stop the others;
# the target fails at the end if any did, or if a claim fails.
reproduce-all: $(PERENCODE_DEPS)
	@test -e $(LM_DATA) || $(PERENCODE) lm-prepare --out $(LM_DATA)
	@status=0; \
	for grid in $(PAPER_GRIDS); do \
		$(PERENCODE) sweep $$grid --out $(RUNS) --executor $(EXECUTOR) --jobs $(JOBS) \
			--device $(DEVICE) $(SWEEP_ARGS) || status=1; \
	done; \
	dirs=$$(for grid in $(PAPER_GRIDS); do d=$(RUNS)/$$(basename $$grid .toml); \
		test -d $$d && echo $$d; done); \
	$(PERENCODE) figures $$dirs --out $(FIGURES)/paper || status=1; \
	$(PERENCODE) verify $$dirs --claims data/paper_claims.toml --out $(FIGURES)/paper \
		|| status=1; \
	echo "figures and Table 1: $(FIGURES)/paper"; \
	echo "claims report:       $(FIGURES)/paper/verify.md"; \
	exit $$status
