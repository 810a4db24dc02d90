"""The registration: the entry point `perencode.kinds` of this package names this module,
so every perencode process that looks up a model has `model.arch = "mingru"`."""

from perencode.api import ModelKind, register_model
from perencode_minrnn.mingru import MinGRUConfig, build, flops_per_step, jacobians

register_model(ModelKind(
    "mingru", build, label="minGRU", summary="one minGRU layer (Feng et al. 2024), "
    "log-space parallel scan", config=MinGRUConfig, flops_per_step=flops_per_step,
    jacobians=jacobians,
    # Kept for backward per step, in units of H: the gate and candidate pre-activations
    # (2), log a, log b, their cumulative sum, the logcumsumexp and its exponential.
    saved_per_step=7))
