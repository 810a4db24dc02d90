# Reproduction targets; included by the main Makefile, which defines PY, PERENCODE (how the
# CLI is called: `$(PY) -m perencode`, or the container's) and PERENCODE_DEPS (install).
# REPRODUCE.md explains what each grid reproduces, and the reviewer's route on a cluster.
#
#   make quickstart                      quick demo (GPU where present, else CPU), claims report
#   make reproduce-all                   every grid of recipes/paper, then figures and verify
#   make reproduce-all EXECUTOR=slurm SWEEP_ARGS="--partition gpu"
#                                        every grid submitted first (sweep --no-wait), then
#                                        each one waited for and collected
#   make reproduce-all EXECUTOR=slurm SUBMIT_ONLY=1
#                                        submit every grid and leave; the same command
#                                        without SUBMIT_ONLY later collects, draws, verifies
#   make reproduce-all JOBS=8            runs at once with the local executor (GPUs round-robin)
#   make rehearsal [EXECUTOR=slurm]      the same path at CPU size, in minutes (make/rehearsal.mk)

RUNS ?= runs
FIGURES ?= figures
# Runs at once in the quick demo (empty: 2 on the CPU, 6 sharing the GPU).
QUICK_JOBS ?=
EXECUTOR ?= local
DEVICE ?= auto
# One run per GPU by default; 1 without GPUs.
GPU_COUNT := $(shell nvidia-smi -L 2>/dev/null | grep -c '^GPU')
JOBS ?= $(if $(filter-out 0,$(GPU_COUNT)),$(GPU_COUNT),1)
# Arguments of every sweep, and of one grid: SWEEP_ARGS_<grid file stem>, e.g.
# SWEEP_ARGS_fig02_lstm_reverse="--only vocab_size=256,16384".
SWEEP_ARGS ?=
PAPER_GRIDS ?= $(sort $(wildcard recipes/paper/*.toml))
# The prepared WikiText-103 (Fig. 15 / Table 1). Built by `lm-prepare` unless present: from
# LM_SOURCE (a folder with wiki.{train,valid,test}.raw) or, empty, from the Hugging Face Hub
# (needs `datasets`, installed with perencode[hf], and a network: on a cluster whose compute
# nodes are offline, run `make lm-data` on the login node first).
LM_DATA ?= data/wikitext103
LM_SOURCE ?=
LM_PREPARE_ARGS ?=
SWEEP_ARGS_fig15_table1_lstm_wikitext103 += --set 'task.data="$(LM_DATA)"'
VERIFY_ARGS ?=
SUBMIT_ONLY ?=

.PHONY: quickstart reproduce-all lm-data

# The wall time printed at the end includes the install (a fresh clone's first run).
# DEVICE=auto runs the GPU demo at the paper's shapes where a CUDA device is present;
# DEVICE=cpu forces the CPU demo.
quickstart:
	@start=$$(date +%s); \
	$(if $(PERENCODE_DEPS),$(MAKE) --no-print-directory $(PERENCODE_DEPS) &&) \
	$(PERENCODE) quickstart --device $(DEVICE) --runs $(RUNS) --out $(FIGURES) \
		$(if $(QUICK_JOBS),--jobs $(QUICK_JOBS)); status=$$?; \
	took=$$(( $$(date +%s) - start )); \
	echo "make quickstart took $$(( took / 60 )) min $$(( took % 60 )) s (install included)"; \
	exit $$status

lm_prepare = test -f $(LM_DATA)/manifest.json || $(PERENCODE) lm-prepare --out $(LM_DATA) \
	$(if $(LM_SOURCE),--source $(LM_SOURCE)) $(LM_PREPARE_ARGS)

lm-data: $(PERENCODE_DEPS)
	@$(lm_prepare)

# The sweep of one grid: $(call sweep,GRID,EXTRA ARGS).
sweep = $(PERENCODE) sweep $(1) --runs $(RUNS) --executor $(EXECUTOR) --jobs $(JOBS) \
	--device $(DEVICE) $(SWEEP_ARGS) $(SWEEP_ARGS_$(basename $(notdir $(1)))) $(2)

# Grids run in name order, so the Fig. 3 runs exist before Fig. 5 analyses them and the
# Fig. 2/8/11 runs before Fig. 12-14 link to them. On SLURM every grid is submitted first
# (a cell of another grid's run still training waits for that job), then each is collected.
# A failed step does not stop the others (a missing corpus fails Fig. 15's runs only); the
# target fails at the end if any did, or if a claim fails.
reproduce-all: $(PERENCODE_DEPS)
	@status=0; \
	$(lm_prepare) || status=1; \
	$(if $(filter slurm,$(EXECUTOR)),\
	$(foreach grid,$(PAPER_GRIDS),$(call sweep,$(grid),--no-wait) || status=1;)) \
	$(if $(SUBMIT_ONLY),\
	echo "submitted; run the same command without SUBMIT_ONLY to collect the runs"; \
	exit $$status;) \
	$(foreach grid,$(PAPER_GRIDS),$(call sweep,$(grid)) || status=1;) \
	dirs=$$(for grid in $(PAPER_GRIDS); do d=$(RUNS)/$$(basename $$grid .toml); \
		test -d $$d && echo $$d; done); \
	$(PERENCODE) figures $$dirs --out $(FIGURES)/paper || status=1; \
	$(PERENCODE) verify $$dirs --out $(FIGURES)/paper $(VERIFY_ARGS) || status=1; \
	echo "figures and Table 1: $(FIGURES)/paper"; \
	echo "claims report:       $(FIGURES)/paper/verify.md"; \
	exit $$status
