# A real single-node SLURM cluster for the `slurm` tests (issue 14); included by the main
# Makefile. tools/slurm-cluster installs the packages if missing (Debian/Ubuntu, root) and
# starts munged, MariaDB, slurmdbd, slurmctld and slurmd in $(SLURM_DIR).
#
#   make test-slurm     start the cluster, run the tests marked `slurm`, stop it (also when a
#                       test fails); the tests fail rather than skip if no cluster answers
#   make rehearsal-slurm  the same for `make rehearsal EXECUTOR=slurm` (the reviewer's path
#                       on a real scheduler); a cluster already running is used and kept

SLURM_DIR ?= /tmp/perencode-slurm

.PHONY: test-slurm rehearsal-slurm slurm-start slurm-stop

slurm-start:
	PERENCODE_SLURM_DIR=$(SLURM_DIR) tools/slurm-cluster start

slurm-stop:
	PERENCODE_SLURM_DIR=$(SLURM_DIR) tools/slurm-cluster stop

# $(call with_cluster,COMMAND): COMMAND with SLURM_CONF pointing at the cluster, which is
# started first and stopped after (also when COMMAND fails) unless one was already running.
with_cluster = started=0; status=0; \
	if ! PERENCODE_SLURM_DIR=$(SLURM_DIR) tools/slurm-cluster status >/dev/null 2>&1; then \
		started=1; PERENCODE_SLURM_DIR=$(SLURM_DIR) tools/slurm-cluster start || status=$$?; \
	fi; \
	if [ $$status -eq 0 ]; then \
		SLURM_CONF=$(SLURM_DIR)/etc/slurm.conf $(1) || status=$$?; \
	fi; \
	if [ $$started -eq 1 ]; then PERENCODE_SLURM_DIR=$(SLURM_DIR) tools/slurm-cluster stop; fi; \
	exit $$status

test-slurm: install
	@$(call with_cluster,PERENCODE_REQUIRE_SLURM=1 $(PY) -m pytest -m slurm -p no:cacheprovider --durations=0)

rehearsal-slurm: install
	@$(call with_cluster,$(MAKE) --no-print-directory rehearsal EXECUTOR=slurm)
