# `make rehearsal`: the reviewer's whole path at CPU size (issue 20); included by the main
# Makefile. It runs the reproduce-all target itself (lm-prepare, every grid of
# recipes/paper, figures, verify) on a small corpus it writes, with every grid shrunk by
# --set/--only; then verifies the rehearsal's own claims (perencode/claims/rehearsal.toml:
# the paper's tests at the effects tiny runs show) and checks that every paper claim was
# reported, every figure drawn, and every verdict path decided (`perencode rehearsal check`).
#
#   make rehearsal                     local executor, 2 runs at once
#   make rehearsal GRIDS=plan          the grids `perencode plan --budget H --write plan`
#                                      wrote, at the same tiny sizes, with all their cells
#                                      and seeds, verified with --plan plan/plan.json
#   make rehearsal EXECUTOR=slurm      on a SLURM cluster (CI: tools/slurm-cluster), every
#                                      grid submitted before any is waited for
#   make rehearsal PERENCODE=/path/to/perencode PERENCODE_DEPS=
#                                      with another install (make test-compat: a wheel)

REHEARSAL_DIR ?= rehearsal
REHEARSAL_JOBS ?= 2
# A folder of grid files written by `perencode plan --write` (empty: recipes/paper).
GRIDS ?=
# Tiny widths, 4 iterations, 2 checkpoints, sequences of 4 tokens; and 8 held-out
# sequences for the grids whose tasks have a held-out count (a grid's --set must reach one
# of its cells: the dual-frequency and language-model tasks have other test sets).
REHEARSAL_SET = --set model.hidden_size=8 --set model.embed_size=8 --set task.length=4 \
	--set train.iterations=4 --set train.batch_size=4 \
	--set train.checkpoint_every=2 --set train.log_every=2 --set train.eval_batch_size=64 \
	--set optim.warmup=1
# Two seeds; three for the dual-frequency runs (Fig. 3, and Fig. 5's analyses of them): the
# by-band accuracies of tiny runs are constant (0), and an exact test of a constant cell of
# a metric in [0, 1] decides at the rehearsal claims' level from three runs on. A plan's
# grids keep the seeds the plan chose.
REHEARSAL_SEEDS = $(if $(GRIDS),,--only seed=111,222)
REHEARSAL_SEEDS_DUAL = $(if $(GRIDS),,--only seed=111,222,333)
# SLURM at CPU size: no GPU, one core, short limits, a quick look at the queue.
REHEARSAL_SLURM = --gpus-per-job 0 --cpus-per-job 1 --time-min 10 --slurm poll_s=2
# Grid by grid (by the name of its file in recipes/paper; a plan's fig02_x-2.toml takes
# fig02_x's): the S4D's state, the variable lengths, the dual-frequency test set, the
# corpus's vocabulary and paragraph length (REHEARSAL_SIZE_*), and, for the paper's grids,
# fewer vocabulary sizes (REHEARSAL_ONLY_*: the two ends). Fig. 5 takes exactly Fig. 3's
# settings, Fig. 12-14 those of Fig. 2/8/11: their cells are the same runs, linked.
REHEARSAL_HELD_OUT = --set task.held_out=8 $(REHEARSAL_SEEDS)
REHEARSAL_S4D = --set model.d_state=4
REHEARSAL_DUAL = --set task.held_out_per_cell=2 $(REHEARSAL_SEEDS_DUAL)
# The S4D's stability analysis puts its target at t = 23: its runs need 24 steps.
REHEARSAL_S4D_DUAL = $(REHEARSAL_DUAL) $(REHEARSAL_S4D) --set task.length=24
REHEARSAL_SIZE_fig02_gru_reverse = $(REHEARSAL_HELD_OUT)
REHEARSAL_SIZE_fig02_lstm_reverse = $(REHEARSAL_HELD_OUT)
REHEARSAL_SIZE_fig02_s4d_reverse = $(REHEARSAL_S4D) $(REHEARSAL_HELD_OUT)
REHEARSAL_SIZE_fig03_gru_dual_frequency = $(REHEARSAL_DUAL)
REHEARSAL_SIZE_fig03_lstm_dual_frequency = $(REHEARSAL_DUAL)
REHEARSAL_SIZE_fig03_s4d_dual_frequency = $(REHEARSAL_S4D_DUAL)
REHEARSAL_SIZE_fig05_gru_stability = $(REHEARSAL_DUAL)
REHEARSAL_SIZE_fig05_lstm_stability = $(REHEARSAL_DUAL)
REHEARSAL_SIZE_fig05_s4d_stability = $(REHEARSAL_S4D_DUAL)
REHEARSAL_SIZE_fig07_lstm_reverse_add = $(REHEARSAL_HELD_OUT)
REHEARSAL_SIZE_fig08_gru_sort = $(REHEARSAL_HELD_OUT)
REHEARSAL_SIZE_fig08_lstm_sort = $(REHEARSAL_HELD_OUT)
REHEARSAL_SIZE_fig10_lstm_predecessor = $(REHEARSAL_HELD_OUT)
REHEARSAL_SIZE_fig11_lstm_variable_length = --set task.min_length=2 $(REHEARSAL_HELD_OUT)
REHEARSAL_SIZE_fig12_lstm_double_vanilla = $(REHEARSAL_HELD_OUT)
REHEARSAL_SIZE_fig13_lstm_pe_variants = $(REHEARSAL_HELD_OUT)
REHEARSAL_SIZE_fig14_lstm_pe_variants_variable_length = --set task.min_length=2 \
	$(REHEARSAL_HELD_OUT)
REHEARSAL_SIZE_fig15_table1_lstm_wikitext103 = --set task.vocab_size=96 --set task.length=16 \
	$(REHEARSAL_SEEDS) --set 'task.data=\"$(REHEARSAL_DIR)/wikitext103\"'
REHEARSAL_ONLY_fig02_gru_reverse = --only vocab_size=32,256
REHEARSAL_ONLY_fig02_lstm_reverse = --only vocab_size=256,16384
REHEARSAL_ONLY_fig02_s4d_reverse = --only vocab_size=256,16384
REHEARSAL_ONLY_fig07_lstm_reverse_add = --only vocab_size=896,1088
REHEARSAL_ONLY_fig08_gru_sort = --only vocab_size=32,256
REHEARSAL_ONLY_fig08_lstm_sort = --only vocab_size=256,16384
REHEARSAL_ONLY_fig10_lstm_predecessor = --only vocab_size=512,1024

REHEARSAL_GRID_FILES = $(if $(GRIDS),$(sort $(wildcard $(GRIDS)/*.toml)),$(PAPER_GRIDS))
# The paper grid a file stands for: its name up to a '-' (a plan writes fig02_x-1.toml).
rehearsal_source = $(firstword $(subst -, ,$(basename $(notdir $(1)))))
REHEARSAL_GRIDS = $(foreach grid,$(REHEARSAL_GRID_FILES),\
	SWEEP_ARGS_$(basename $(notdir $(grid)))="$(REHEARSAL_SIZE_$(call rehearsal_source,$(grid))) \
	$(if $(GRIDS),,$(REHEARSAL_ONLY_$(call rehearsal_source,$(grid))))")
REHEARSAL_PLAN = $(if $(GRIDS),--plan $(GRIDS)/plan.json)

.PHONY: rehearsal

rehearsal: $(PERENCODE_DEPS)
	@start=$$(date +%s); rm -rf $(REHEARSAL_DIR); \
	$(if $(GRIDS),test -f $(GRIDS)/plan.json || { echo "GRIDS=$(GRIDS): no plan.json \
		there (write one with perencode plan --budget HOURS --write $(GRIDS))"; exit 2; }; ) \
	$(PERENCODE) rehearsal corpus $(REHEARSAL_DIR)/wikitext-raw && \
	$(MAKE) --no-print-directory reproduce-all PERENCODE_DEPS= \
		PAPER_GRIDS="$(REHEARSAL_GRID_FILES)" \
		RUNS=$(REHEARSAL_DIR)/runs FIGURES=$(REHEARSAL_DIR)/figures \
		LM_DATA=$(REHEARSAL_DIR)/wikitext103 LM_SOURCE=$(REHEARSAL_DIR)/wikitext-raw \
		LM_PREPARE_ARGS="--vocab-size 96 --max-tokens 16 --threads 1 --no-progress" \
		JOBS=$(REHEARSAL_JOBS) DEVICE=cpu VERIFY_ARGS="--report-only $(REHEARSAL_PLAN)" \
		SWEEP_ARGS="$(SWEEP_ARGS) $(REHEARSAL_SET) --no-progress \
			$(if $(filter slurm,$(EXECUTOR)),$(REHEARSAL_SLURM))" \
		$(REHEARSAL_GRIDS) && \
	$(PERENCODE) verify $(REHEARSAL_DIR)/runs --claims rehearsal --report-only \
		--out $(REHEARSAL_DIR)/figures/rehearsal && \
	$(PERENCODE) rehearsal check $(REHEARSAL_DIR)/figures/paper \
		--verdicts $(REHEARSAL_DIR)/figures/rehearsal/verify.json $(REHEARSAL_PLAN); \
	status=$$?; took=$$(( $$(date +%s) - start )); \
	echo "make rehearsal ($(EXECUTOR)$(if $(GRIDS), GRIDS=$(GRIDS))) took $$(( took / 60 )) min $$(( took % 60 )) s"; \
	exit $$status
