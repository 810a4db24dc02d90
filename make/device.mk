# `make device-check`: first contact with a GPU, in under 8 minutes of device time (issue
# 47): host syncs per training step, resume bit-identity on the GPU, free-running step time
# against the bare cuDNN loop at the paper's shapes, TF32 on the heads, memory estimate
# against the measured peak, 1 vs 4 runs sharing the GPU, then `perencode doctor`'s every
# row (tools/device_check.py says what each step proves). Results: DEVICE_CHECK_OUT/
# summary.txt and device-check.json. Without a GPU it runs at tiny shapes on the CPU and
# says which steps need one.
#
#   make device-check                                 the device training would pick (auto)
#   make device-check DEVICE_CHECK_BUDGET=300         a tighter budget (seconds, all steps)
#   make device-check PY=python3 PERENCODE_DEPS=      on a GPU machine without the venv (its
#                                                     torch; pydantic, typer, rich, tomli-w,
#                                                     rapidfuzz and submitit importable)

DEVICE_CHECK_OUT ?= device-check
DEVICE_CHECK_BUDGET ?= 450
DEVICE_CHECK_DEVICE ?= auto

.PHONY: device-check

device-check: $(PERENCODE_DEPS)
	$(PY) tools/device_check.py $(DEVICE_CHECK_OUT) --budget $(DEVICE_CHECK_BUDGET) \
		--device $(DEVICE_CHECK_DEVICE)
