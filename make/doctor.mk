# `make doctor`: `perencode doctor` on this machine (issue 29); included by the main
# Makefile. On a GPU node it checks, in about two minutes, that training there computes
# what it computes on the CPU, resumes across devices, fits the memory preflight estimates
# and runs near a bare cuDNN loop; elsewhere it runs the CPU checks only.
#
#   make doctor                          the device training would pick (auto)
#   make doctor DOCTOR_DEVICE=cuda:1     another GPU
#   make doctor PERENCODE='apptainer exec --nv perencode.sif perencode' PERENCODE_DEPS=
#                                        inside the container the jobs will use

DOCTOR_DEVICE ?= auto
# Where the speed check caches its timings: the runs root `sweep --dry-run` reads.
DOCTOR_RUNS ?= runs

.PHONY: doctor

doctor: $(PERENCODE_DEPS)
	$(PERENCODE) doctor --device $(DOCTOR_DEVICE) --runs $(DOCTOR_RUNS)
