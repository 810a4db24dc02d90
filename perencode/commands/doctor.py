"""`perencode doctor`: before a GPU-hour is spent, is this package right and fast on this device?

Every check is one row: check, measured, expected, verdict (pass, FAIL, info, or "not run:
why"). A check that raises becomes one FAIL row naming the exception, never a traceback.

- stack: torch, CUDA, cuDNN, driver, device, TF32 and cuDNN settings as training uses them
  (perencode sets none: torch's defaults), beside what the paper's runs used;
- equivalence: a few training steps of each registered model (a plugin's too), vanilla and
  PE, from the same weights and batches on the device and on the CPU (`equivalence`);
- determinism: the same steps twice on one device, bit-identical or not (`determinism`);
- resume across devices: a run checkpointed on one device finishes on the other, through
  `perencode train` and its run directory (`resume_across`);
- memory: perencode.training.planning's estimate against the measured peak (`memory_ratio`);
- speed: `bench --baseline` at the paper's Fig. 2 GRU shape, and each paper grid's
  device-hours extrapolated from it (the `sweep --estimate` cache is filled on the way).

The comparisons are functions of two devices, so the tests run them CPU against CPU.
Without a CUDA device the device checks are "not run" and the CPU ones still run.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import io
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from perencode.common import defaults
from perencode.common.console import console
from perencode.common.device import device_model, host_syncs, kernel_support
from perencode.common.files import atomic_write_text
from perencode.common.processes import perencode_command
from perencode.config import registry
from perencode.config.grid import load_grid, repository_root
from perencode.config.recipe import (
    EncodingConfig,
    ModelConfig,
    Recipe,
    TrainConfig,
    load_recipe,
    validate,
)
from perencode.kinds.models import SequenceModel
from perencode.kinds.tasks import Batch
from perencode.store import checkpoints, runs
from perencode.store.environment import cpu_capability, cpu_model, gpu_driver
from perencode.training import planning
from perencode.training.planning import Estimates, device_label
from perencode.training.session import CHUNK_LOGITS, Session

PASS, FAIL, INFO = "pass", "FAIL", "info"
NO_DEVICE = "not run: no CUDA device"

# What says that this node was meant to have a GPU: SLURM's GPU allocation (a job with
# --gpus / --gres=gpu sets these; Apptainer passes the host's environment through) or
# devices made visible by name. Values meaning no device: an empty list, -1, and the
# NoDevFiles some sites set for jobs without GPUs.
GPU_VARIABLES = ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "SLURM_GPUS", "SLURM_GPUS_ON_NODE",
                 "SLURM_GPUS_PER_NODE", "SLURM_GPUS_PER_TASK", "CUDA_VISIBLE_DEVICES")
NO_GPU_VALUES = ("", "-1", "nodevfiles")
# The variables that hold a count ("2", "a100:2", "gpu:1"): a count of 0 is no GPU, where
# CUDA_VISIBLE_DEVICES=0 and SLURM_JOB_GPUS=0 name GPU number 0.
GPU_COUNTS = ("SLURM_GPUS", "SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE", "SLURM_GPUS_PER_TASK")


def gpu_expected(environ: Mapping[str, str] | None = None) -> str | None:
    """The variable and value saying this node was meant to have a GPU ('SLURM_JOB_GPUS=0'),
    or None."""
    environ = os.environ if environ is None else environ
    for name in GPU_VARIABLES:
        value = environ.get(name)
        if value is None or value.strip().lower() in NO_GPU_VALUES:
            continue
        if name in GPU_COUNTS and value.strip().split(":")[-1] in ("0", ""):
            continue
        return f"{name}={value}"
    return None


def gpu_expected_check(device: torch.device, environ: Mapping[str, str] | None = None,
                       available: bool | None = None) -> list[Finding]:
    """A FAIL row when the environment says a GPU was allocated or made visible and no CUDA
    device is usable (a container started without --nv, a job on the login node, a
    CPU-only torch): the device checks would otherwise only read "not run" and the doctor
    would exit 0. A pass row when one is expected and used; nothing when none is expected.
    (`--device cuda` without a CUDA device stops earlier, in resolve_device.)"""
    expected = gpu_expected(environ)
    if expected is None:
        return []
    available = torch.cuda.is_available() if available is None else available
    name = "GPU expected here"
    if device.type == "cuda" and available:
        return [Finding(name, f"{expected}; using {device}", "a usable CUDA device", PASS)]
    if available:  # --device cpu chosen on a GPU node: the user's choice
        return [Finding(name, f"{expected}; --device {device}", "a usable CUDA device", INFO)]
    build = ("torch is a CPU-only build (torch.version.cuda is None)"
             if torch.version.cuda is None else "torch sees no CUDA device")
    return [Finding(name, f"{expected}, but {build}", "a usable CUDA device (in a container: "
                    "apptainer exec --nv, docker run --gpus all)", FAIL)]

# What the paper's runs used: the authors' conda environment (pytorch 2.1.1, CUDA 12.1,
# cuDNN 8.9.2), fp32 on one A100 80GB per run, torch's TF32 defaults (their code sets
# none), and cudnn.deterministic = True, cudnn.benchmark = False (their training template
# sets both). docs/paper-facts.md#training-settings.
PAPER_TORCH = "2.1.1"
PAPER_CUDA = "12.1 / cuDNN 8.9.2"
PAPER_DEVICE = "NVIDIA A100 80GB (one per run, fp32 cuDNN RNN)"
PAPER_TF32 = "cuDNN on, matmul off (torch 2.1.1 defaults)"
PAPER_CUDNN = "deterministic on, benchmark off"

# The model of the single-model checks (determinism, resume, memory): the recipe's
# defaults, the paper's GRU with sinusoidal PE.
BASE_ARCH, BASE_ENCODING = ModelConfig.named({}), EncodingConfig.named({})
# Tolerance on `parameter_difference` after EQUIVALENCE_STEPS Adam steps, by the precision
# the device's products run in. Adam moves each weight by about lr times the sign of its
# gradient, so weights whose gradient is within rounding of zero step apart by up to 2 lr
# on two devices. Calibrated on the CPU at EQUIVALENCE_SIZE: fp32 against fp64 ends 0.5e-5
# to 1.3e-4 apart over the six models; bf16 products (autocast, 8x TF32's rounding)
# against fp32 about 0.03. A device path that computes something else (a wrong encoding, a
# mask on the wrong device) ends apart by about the update itself (~1).
TOLERANCE = {"fp32": 1e-2, "tf32": 1e-1}
EQUIVALENCE_STEPS = 5
# Small enough that the CPU side of six models takes seconds; wide enough for cuDNN's
# kernels to be the ones training uses (hidden 64, batch 32). A model's own options are
# its registration's `tiny` ones.
EQUIVALENCE_SIZE = {"vocab_size": 64, "length": 16, "hidden_size": 64, "embed_size": 64,
                    "batch_size": 32}
# The shapes of the CPU checks (determinism, resume, memory): seconds on one core.
CPU_SIZE = {"vocab_size": 16, "length": 8, "hidden_size": 16, "embed_size": 16,
            "batch_size": 8}
# Memory on the CPU: a shape whose activations (~100 MB) stand well above the allocator's
# noise in the peak resident set, and still train in a second or two.
CPU_MEMORY_SIZE = {"vocab_size": 256, "length": 64, "hidden_size": 128, "embed_size": 128,
                   "batch_size": 128}
# The measured peak over the estimate, by device type. The estimate counts the tensors a
# step keeps (cuDNN's saved state for the RNNs, perencode.training.planning), not the allocator's
# slack: on CUDA the two should agree within a factor of 2. The CPU's RNN kernels keep
# more per step for the backward pass than cuDNN (1.8x the estimate for the GRU at
# CPU_MEMORY_SIZE on an x86-64 Linux machine), hence the wider CPU range.
MEMORY_RATIO = {"cuda": (0.5, 2.0), "cpu": (0.5, 3.0)}
# The real step may cost up to this much more than the bare loop of the same shapes
# before something is wrong: it adds the held-out rejection of each batch and the task's
# batch layout; a step on the wrong device or a host sync per step costs far more.
SPEED_RATIO = 2.0
# The Fig. 2 GRU cell at K = 256 with PE (the grid's base recipe).
FIG2_GRU = "recipes/gru_vocab256.toml"
PAPER_GRIDS = "recipes/paper"
# The memory checks on a GPU: the largest synthetic recipe of each model kind by
# perencode.training.planning's estimate (the K = 16,384 LSTM peaks at its held-out evaluation,
# about 9.5 GiB). The language model's (24.5 GiB) needs its prepared data: not checked here.
DEVICE_MEMORY = (FIG2_GRU, "recipes/lstm_vocab16384.toml", "recipes/s4d_dualfreq_vocab2048.toml")


@dataclass
class Finding:
    """One row of the doctor's table: what was measured against what is expected."""

    name: str
    measured: str
    expected: str
    verdict: str

    @property
    def failed(self) -> bool:
        return self.verdict == FAIL


def one_line(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def guarded(name: str, fn: Callable[[], list[Finding]]) -> list[Finding]:
    """The rows of `fn`, or one FAIL row naming what it raised. What the check's own runs
    print (train's "RUN: resuming from iteration 2 of 4", a library's warning) is not the
    doctor's output: its rows say how the check went."""
    try:
        with console.capture(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn()
    except Exception as exc:  # a doctor reports every failure as a row; none escapes
        return [Finding(name, one_line(exc), "no error", FAIL)]


# --- recipes and batches --------------------------------------------------------------


def small_recipe(arch: str, encoding: str, size: dict, **train: int | str) -> Recipe:
    """A recipe of the paper's settings on the default task (reverse) at the widths of
    `size`, with the model's own `tiny` options (its registration's)."""
    model = {"arch": arch, "hidden_size": size["hidden_size"], "embed_size": size["embed_size"],
             **registry.get("model", arch).tiny}
    data = {"task": {"vocab_size": size["vocab_size"], "length": size["length"],
                     "held_out": 32},
            "model": model,
            "encoding": {"kind": encoding},
            "train": {"batch_size": size["batch_size"], "seed": 111, **train}}
    return validate(data, "perencode doctor")


def batch_to(batch: Batch, device: torch.device) -> Batch:
    moved: dict[str, Any] = {f.name: (None if (v := getattr(batch, f.name)) is None
                                      else v.to(device)) for f in dataclasses.fields(batch)}
    return Batch(**moved)


def cpu_start(recipe: Recipe, steps: int) -> tuple[SequenceModel, list[Batch]]:
    """The recipe's model as training initialises it and its first `steps` training
    batches, on the CPU."""
    session = Session(recipe, torch.device("cpu"))
    return session.model, [session.batch() for _ in range(steps)]


def trained_parameters(model: SequenceModel, recipe: Recipe, batches: list[Batch],
                       device: torch.device) -> dict[str, torch.Tensor]:
    """A copy of `model` on `device` after one training step per batch at the recipe's
    peak learning rate (the warm-up's first steps are nearly 0 and would compare nothing);
    the parameters on the CPU."""
    session = Session(recipe, device, copy.deepcopy(model).to(device))
    session.iteration = recipe.optim.warmup  # the schedule's peak comes after the warm-up
    for batch in batches:
        session.step(batch_to(batch, device))
    return {name: p.detach().to("cpu", torch.float64)
            for name, p in session.model.named_parameters()}


def parameter_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor],
                         start: dict[str, torch.Tensor]) -> float:
    """How far two trainings of the same start ended apart, relative to how far they moved:
    ||a - b|| / ||b - start|| over all parameters (0 for identical; ~1 for unrelated
    updates)."""
    apart = math.sqrt(sum(float((a[n] - b[n]).pow(2).sum()) for n in b))
    moved = math.sqrt(sum(float((b[n] - start[n]).pow(2).sum()) for n in b))
    return apart / moved if moved > 0 else (0.0 if apart == 0 else math.inf)


def _start(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().to(torch.float64) for n, p in model.named_parameters()}


def tf32_in_effect(device: torch.device, arch: str) -> bool:
    """Whether the products of `arch` on `device` run in TF32 with the current settings:
    an Ampere or newer GPU, and the flag of the switch the model's registration names
    (cuDNN's for the RNNs, which cuDNN runs; cuBLAS's for the S4D's linear layers)."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 8:
        return False
    switch = registry.get("model", arch).tf32
    return bool((torch.backends.cudnn if switch == "cudnn" else
                 torch.backends.cuda.matmul).allow_tf32)


def equivalence_models() -> list[tuple[str, str]]:
    """(arch, encoding) of the equivalence checks: every registered model (a plugin's as a
    built-in), vanilla (the encoding that adds nothing) and with the recipe's default PE."""
    vanilla = next(n for n, k in registry.registry("encoding").items() if not k.adds_input)
    return [(arch, encoding) for arch in registry.names("model")
            for encoding in (vanilla, BASE_ENCODING)]


# --- the checks' logic (two devices; the tests run them CPU against CPU) ---------------


def equivalence(recipe: Recipe, device: torch.device, reference: torch.device,
                steps: int = EQUIVALENCE_STEPS,
                perturb: Callable[[dict[str, torch.Tensor]], None] | None = None) -> float:
    """`parameter_difference` of `steps` training steps on `device` against `reference`,
    from the same initial weights and batches. `perturb` edits the `device` side's result
    (the tests' broken device)."""
    model, batches = cpu_start(recipe, steps)
    ours = trained_parameters(model, recipe, batches, device)
    theirs = trained_parameters(model, recipe, batches, reference)
    if perturb is not None:
        perturb(ours)
    return parameter_difference(ours, theirs, _start(model))


def determinism(recipe: Recipe, device: torch.device, steps: int = EQUIVALENCE_STEPS
                ) -> tuple[bool, float]:
    """The same steps twice on `device`: (bit-identical?, largest absolute difference)."""
    model, batches = cpu_start(recipe, steps)
    first = trained_parameters(model, recipe, batches, device)
    second = trained_parameters(model, recipe, batches, device)
    same = all(torch.equal(first[n], second[n]) for n in first)
    return same, max(float((first[n] - second[n]).abs().max()) for n in first)


def run_command(args: list[str]) -> str:
    """`perencode ARGS` run as a command, in a child process (the verbs the doctor checks
    are other commands: it runs them as a user does); its standard output. One that fails
    raises with its last line."""
    done = subprocess.run([*perencode_command(), *args], capture_output=True, text=True,
                          timeout=3600)
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise RuntimeError(f"perencode {args[0]} exited {done.returncode}: {last}")
    return done.stdout


def train_child(recipe: Recipe, run_dir: Path, device: torch.device) -> None:
    """`perencode train` of `recipe` into `run_dir` on `device`, in a child process."""
    path = run_dir.with_name(run_dir.name + ".toml")
    atomic_write_text(path, recipe.to_toml())
    run_command(["train", str(path), "--run-dir", str(run_dir), "--device", str(device),
                 "--no-progress"])


def bench_child(recipe: Recipe, device: torch.device, folder: Path, *options: str) -> dict:
    """`perencode bench` of `recipe` on `device` with `options`, in a child process: its
    final JSON line (seconds_per_iteration, ...)."""
    path = Path(folder) / "bench.toml"
    atomic_write_text(path, recipe.to_toml())
    out = run_command(["bench", str(path), "--device", str(device), *options])
    return json.loads(out.strip().splitlines()[-1])


def resume_across(recipe: Recipe, first: torch.device, second: torch.device,
                  folder: Path) -> dict:
    """A run trained on `first`, cut back to its middle checkpoint (as a run killed after
    it), then resumed by `perencode train` on `second` (each in a process of its own, as a
    requeued job is). Returns what happened: the iteration it resumed from (0: it started
    over), the devices of its two starts, the final checkpoint's iteration, the logged
    steps, and (CPU to CPU only, where the batches come from the same stream and the
    kernels repeat exactly; CUDA to CUDA, a requeued job on its GPU, where cuDNN's
    deterministic mode should make them repeat) whether it ended bit-identical to the
    uninterrupted run."""
    iterations = recipe.train.iterations
    middle = recipe.train.checkpoint_every
    run = runs.Run(Path(folder) / f"{first.type}-to-{second.type}")
    train_child(recipe, run.dir, first)
    uninterrupted = checkpoints.load(run.checkpoint_path(iterations))["model"]
    for step, path in run.checkpoints():
        if step > middle:
            path.unlink()
    # As a killed run leaves it: no result, no recorded state, no end time (a run recorded
    # finished is never trained again, whatever file is missing: perencode.store.runs).
    for name in ("eval.json", runs.STATUS_NAME):
        (run.dir / name).unlink(missing_ok=True)
    env = runs.env_record(run.dir)
    if env is not None:
        runs.write_env(run.dir, env.model_copy(update={"end_time": None}))
    # Checkpoints are replaced atomically (a new file): the middle one keeps its inode only
    # if training went on from it rather than starting over.
    kept = run.checkpoint_path(middle).stat().st_ino
    train_child(recipe, run.dir, second)
    env = runs.env_record(run.dir)
    starts = [start.model_dump() for start in env.starts] if env else []
    final = checkpoints.load(run.checkpoint_path(iterations))
    rows = run.metrics()
    resumed = run.checkpoint_path(middle).stat().st_ino == kept
    result = {"resumed_from": middle if resumed else 0, "starts": [s["device"] for s in starts],
              "final_iteration": final["iteration"],
              "metrics_steps": [r.step for r in rows],
              "finite": all(bool(torch.isfinite(t).all()) for t in final["model"].values()),
              "identical": None}
    if first.type == second.type:  # across device types the kernels round apart
        result["identical"] = all(torch.equal(final["model"][n], uninterrupted[n])
                                  for n in uninterrupted)
    return result


def resume_ok(result: dict, recipe: Recipe) -> bool:
    """Resumed from the middle checkpoint, finished, finite, and bit-identical where the
    devices are of one type."""
    n, every = recipe.train.iterations, recipe.train.log_every
    logged = [k for k in range(1, n + 1) if k % every == 0 or k == n]
    return (result["resumed_from"] == recipe.train.checkpoint_every
            and len(result["starts"]) == 2
            and result["final_iteration"] == recipe.train.iterations
            and result["metrics_steps"] == logged
            and result["finite"] and result["identical"] is not False)


def memory_workload(recipe: Recipe, device: torch.device) -> None:
    """What a run holds at once: the model, Adam's state, two training steps and the
    held-out evaluation (the two phases perencode.training.planning estimates)."""

    session = Session(recipe, device)
    for _ in range(2):
        session.step()
    session.evaluate()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measured_peak(recipe: Recipe, device: torch.device) -> int:
    """Peak bytes `memory_workload` takes. CUDA: torch's allocator peak
    (max_memory_allocated; the context and the allocator's cache are not counted, as the
    estimate does not count them). CPU: the peak resident set of a fresh Python process
    (`_resident`) over its size after imports, since torch keeps no allocation statistics
    on the CPU and this process's own peak is already set by whatever ran before."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        memory_workload(recipe, device)
        return torch.cuda.max_memory_allocated(device) - before
    # glibc then maps every allocation above 64 KiB on its own and unmaps it when freed, so
    # the resident set follows the live tensors instead of a heap that keeps what was
    # freed (whose peak varied 0.3x to 2.2x between identical runs without it).
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    child = subprocess.run([sys.executable, "-c",
                            "from perencode.commands.doctor import _peak_child; "
                            "_peak_child()"], input=json.dumps(recipe.to_dict()),
                           capture_output=True, text=True, timeout=600, env=env)
    if child.returncode != 0:
        lines = child.stderr.strip().splitlines() or ["no output"]
        raise RuntimeError(f"memory probe exited {child.returncode}: {lines[-1]}")
    return int(child.stdout.split()[-1])


def _resident() -> tuple[int, int]:
    """(resident bytes now, peak resident bytes) of this process. Linux: VmRSS and VmHWM,
    whose peak starts afresh at exec; ru_maxrss elsewhere, for both, though it carries
    the peak of the process that started this one."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak = peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB
        return peak, peak


def _peak_child() -> None:
    """`measured_peak`'s CPU probe: reads a recipe dict on stdin, prints the bytes."""
    torch.set_num_threads(1)
    recipe = validate(json.loads(sys.stdin.read()), "perencode doctor")
    before, _ = _resident()
    memory_workload(recipe, torch.device("cpu"))
    print(_resident()[1] - before)


def memory_ratio(recipe: Recipe, device: torch.device) -> tuple[int, int, float]:
    """(estimated bytes, measured peak bytes, measured / estimated)."""
    estimate = planning.estimate(recipe, CHUNK_LOGITS).total
    peak = measured_peak(recipe, device)
    return estimate, peak, peak / estimate


# --- the rows ---------------------------------------------------------------------------


def _mib(n: float) -> str:
    return f"{n / (1 << 20):,.0f} MiB" if n >= 1 << 20 else f"{n / 1024:,.1f} KiB"


def omp_threads_check(value: str | None) -> list[Finding]:
    """OMP_NUM_THREADS as OpenMP reads it: a positive count, or a comma-separated list of
    them (one per nesting level). Anything else is ignored by the runtime, which then
    starts a thread per core: on a shared login node, the limit the user meant is lost."""
    if value is None:
        return []
    levels = value.strip().split(",")
    if all(level.strip().isdigit() and int(level) > 0 for level in levels):
        return [Finding("OMP_NUM_THREADS", value, "a positive integer", PASS)]
    return [Finding("OMP_NUM_THREADS", repr(value), "a positive integer (OpenMP ignores this "
                    f"value and uses all {os.cpu_count()} cores): export OMP_NUM_THREADS=N "
                    "or unset it", FAIL)]


def cpu_row() -> Finding:
    """The CPU and the vector ISA torch's kernels use on it (env.json records both): CPU
    digits repeat on the same model and ISA, not across them."""
    isa = cpu_capability() or "unknown (torch < 2.2 does not say)"
    return Finding("CPU", f"{cpu_model() or 'unknown'}; torch's vector ISA {isa}",
                   "-", INFO)


def stack_checks(device: torch.device, skipped: str = NO_DEVICE) -> list[Finding]:
    cudnn = torch.backends.cudnn
    version = torch.__version__.split("+")[0]
    rows = [Finding("torch", torch.__version__, f"{PAPER_TORCH} (the paper's runs)",
                    PASS if version == PAPER_TORCH else INFO), cpu_row()]
    if device.type != "cuda":
        rows.append(Finding("CUDA, cuDNN, driver, device", "-", PAPER_CUDA + "; " + PAPER_DEVICE,
                            skipped))
        rows.append(Finding("kernels for this GPU", "-", "the GPU's architecture among torch's "
                            "(torch.cuda.get_arch_list)", skipped))
        threads = torch.get_num_threads()
        rows.append(Finding("threads", f"{threads} torch thread{'s' * (threads != 1)} on the "
                            "CPU", "-", INFO))
        return rows + omp_threads_check(os.environ.get("OMP_NUM_THREADS"))
    props = torch.cuda.get_device_properties(device)
    major, minor = torch.cuda.get_device_capability(device)
    unsupported = kernel_support(device)
    deterministic = TrainConfig().deterministic
    tf32 = (f"cuDNN {'on' if cudnn.allow_tf32 else 'off'}, matmul "
            f"{'on' if torch.backends.cuda.matmul.allow_tf32 else 'off'}")
    tf32 += "" if major >= 8 else f" (no effect: compute capability {major}.{minor} < 8.0)"
    rows += [
        Finding("CUDA / cuDNN", f"{torch.version.cuda} / cuDNN {cudnn.version()}", PAPER_CUDA,
                INFO),
        Finding("driver", gpu_driver() or "unknown (no nvidia-smi)", "-", INFO),
        Finding("device", f"{props.name}, {props.total_memory / (1 << 30):.0f} GiB, "
                f"sm_{major}{minor}", PAPER_DEVICE, INFO),
        Finding("TF32 (as training runs)", tf32, PAPER_TF32, INFO),
        Finding("kernels for this GPU", unsupported or f"sm_{major}{minor} among "
                f"{', '.join(torch.cuda.get_arch_list())}", "the GPU's architecture among "
                "torch's", FAIL if unsupported else PASS),
        # train.deterministic sets cuDNN's mode as each session starts (its default here).
        Finding("cuDNN (as training runs)",
                f"{'enabled' if cudnn.enabled else 'DISABLED'}, deterministic "
                f"{'on' if deterministic else 'off'} (train.deterministic), benchmark "
                f"{'on' if cudnn.benchmark else 'off'}", PAPER_CUDNN,
                INFO if cudnn.enabled else FAIL),
    ]
    return rows + omp_threads_check(os.environ.get("OMP_NUM_THREADS"))


def equivalence_checks(device: torch.device, reference: torch.device,
                       size: dict = EQUIVALENCE_SIZE) -> list[Finding]:
    rows = []
    for arch, encoding in equivalence_models():
        pe = "PE" if registry.get("encoding", encoding).adds_input else "vanilla"
        name = f"equivalence {arch} {pe}"

        def row(arch=arch, encoding=encoding, name=name):
            recipe = small_recipe(arch, encoding, size)
            precision = "tf32" if tf32_in_effect(device, arch) else "fp32"
            tolerance = TOLERANCE[precision]
            diff = equivalence(recipe, device, reference)
            return [Finding(name, f"{diff:.2e} apart after {EQUIVALENCE_STEPS} steps "
                            f"({device} vs {reference})",
                            f"< {tolerance:g} ({precision})",
                            PASS if diff < tolerance else FAIL)]
        rows += guarded(name, row)
    return rows


@contextlib.contextmanager
def deterministic_settings():
    """torch's deterministic algorithms and cuDNN's deterministic mode (with the cuBLAS
    workspace setting they require on CUDA), restored afterwards."""
    saved = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
             torch.backends.cudnn.benchmark, os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[1:3]
        if saved[3] is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)


def determinism_check(device: torch.device, size: dict) -> list[Finding]:
    name = f"determinism ({device.type}, {registry.label('model', BASE_ARCH)} PE, twice)"
    recipe = small_recipe(BASE_ARCH, BASE_ENCODING, size)
    same, largest = determinism(recipe, device)
    if same:
        return [Finding(name, "bit-identical", "bit-identical", PASS)]
    if device.type == "cpu":  # resume's bit-identity on the CPU rests on this
        return [Finding(name, f"differs by {largest:.2e}", "bit-identical on the CPU", FAIL)]
    # Not a failure: the paper's runs were not bit-reproducible on the GPU either. Which
    # settings make them so is measured, not assumed.
    try:
        with deterministic_settings():
            strict, _ = determinism(recipe, device)
        fix = ("bit-identical with torch.use_deterministic_algorithms(True), "
               "cudnn.deterministic and CUBLAS_WORKSPACE_CONFIG=:4096:8" if strict else
               "still differs with deterministic algorithms on")
    except RuntimeError as exc:
        fix = f"deterministic algorithms refused: {one_line(exc)}"
    return [Finding(name, f"differs by up to {largest:.2e} as training runs; {fix}",
                    "bit-identical (training sets cuDNN's deterministic mode: "
                    "train.deterministic)", INFO)]


def resume_check(recipe: Recipe, first: torch.device, second: torch.device) -> list[Finding]:
    name = f"resume {first.type} -> {second.type}"
    with tempfile.TemporaryDirectory(prefix="perencode-doctor-") as folder:
        result = resume_across(recipe, first, second, Path(folder))
    measured = (f"resumed at {result['resumed_from']}, finished at "
                f"{result['final_iteration']} on {result['starts'][-1]}")
    expected = f"finishes at {recipe.train.iterations}, finite"
    if result["identical"] is not None:
        measured += ", bit-identical" if result["identical"] else ", NOT bit-identical"
        expected += ", bit-identical to the uninterrupted run"
    return [Finding(name, measured, expected, PASS if resume_ok(result, recipe) else FAIL)]


def memory_check(recipe: Recipe, device: torch.device, label: str) -> list[Finding]:
    estimate, peak, ratio = memory_ratio(recipe, device)
    low, high = MEMORY_RATIO[device.type]
    return [Finding(f"memory ({label})", f"peak {_mib(peak)} / estimate {_mib(estimate)} "
                    f"= {ratio:.2f}", f"{low:g} to {high:g}",
                    PASS if low <= ratio <= high else FAIL)]


# Host-device synchronisations a training step of the Fig. 2 GRU may ask for: the
# held-out check of its batch (`nonzero` in perencode.kinds.tasks.base.Exclusion.members) and,
# read from torch's CUDA code, the embedding's backward pass (which counts its segments on
# the host). A checkpoint restored with Adam's `step` counters on the GPU added one per
# parameter tensor, read back at every step (checkpoints.cpu_step_counters).
EXPECTED_SYNCS = 2
NO_SYNCS_ON_CPU = "not run: no CUDA device (on the CPU the host runs the kernels itself)"


def sync_checks(device: torch.device, recipe: Recipe) -> list[Finding]:
    """Host syncs per `Session.step` (perencode.common.device.host_syncs), of a fresh session and
    of one resumed from its checkpoint mapped onto the device, as `perencode train`
    resumes (runs.Run.resume(device))."""
    fresh = Session(recipe, device)
    counted = host_syncs(fresh.step, device)
    buffer = io.BytesIO()
    torch.save(fresh.state(), buffer)
    buffer.seek(0)
    resumed = Session(recipe, device)
    resumed.load("doctor", torch.load(buffer, map_location=device, weights_only=True))
    after = host_syncs(resumed.step, device)
    assert counted is not None and after is not None  # a CUDA device
    where = sorted({*counted[1], *after[1]})
    m = recipe.model
    return [Finding(f"host syncs per step ({m.arch.upper()} H={m.hidden_size} "
                    f"B={recipe.train.batch_size})",
                    f"{counted[0]:g} fresh, {after[0]:g} after a resume"
                    + (f" (at {', '.join(where)})" if where else ""),
                    f"<= {EXPECTED_SYNCS}, a resume adding none",
                    PASS if counted[0] <= EXPECTED_SYNCS and after[0] <= counted[0] else FAIL)]


def speed_checks(device: torch.device, recipe: Recipe, grids: list[Path], runs_root: Path,
                 grid_overrides: list[str] | None = None, iterations: int = 20
                 ) -> list[Finding]:
    """`bench --baseline` of `recipe` (the Fig. 2 GRU, K = 256), then the device-hours of
    each grid from the `sweep --estimate` cache under `runs_root`, which this fills: the
    recipe's shape from that bench, an architecture not yet measured from its grid's first
    cell (3 iterations, as `--estimate` times it); the other shapes extrapolated by FLOPs
    (perencode.training.planning). A cell shared by two grids counts in each. Each bench runs in
    a child process, as `sweep --estimate`'s do."""
    with tempfile.TemporaryDirectory(prefix="perencode-doctor-") as folder:
        return _speed_checks(device, recipe, grids, runs_root, grid_overrides, iterations,
                             Path(folder))


def _speed_checks(device: torch.device, recipe: Recipe, grids: list[Path], runs_root: Path,
                  grid_overrides: list[str] | None, iterations: int, folder: Path
                  ) -> list[Finding]:
    label = device_label(device, torch.get_num_threads())
    m, t = recipe.model, recipe.task
    result = bench_child(recipe, device, folder, "--iterations", str(iterations), "--warmup",
                         "5", "--baseline")
    cache = Estimates(runs_root)
    cache.put(label, recipe, result["seconds_per_iteration"])
    ours, bare = result["seconds_per_iteration"], result["bare_seconds_per_iteration"]
    rows = [Finding(f"speed: {m.arch.upper()} step (E={m.embed_size} H={m.hidden_size} "
                    f"L={t.length} B={recipe.train.batch_size} K={t.vocab_size})",
                    f"{ours * 1e3:.1f} ms vs bare loop {bare * 1e3:.1f} ms free-running "
                    f"(x{result['ratio_to_bare']:.2f})",
                    f"<= x{SPEED_RATIO:g} the bare loop",
                    PASS if result["ratio_to_bare"] <= SPEED_RATIO else FAIL)]
    for path in grids:
        def hours(path=path):
            cells = load_grid(path, grid_overrides).cells
            if cache.seconds(label, cells[0].recipe)[0] is None:
                timed = bench_child(cells[0].recipe, device, folder, "--iterations", "3",
                                    "--warmup", "1")
                cache.put(label, cells[0].recipe, timed["seconds_per_iteration"])
            total, extrapolated = 0.0, 0
            for cell in cells:
                seconds, measured = cache.seconds(label, cell.recipe)
                assert seconds is not None  # cells[0] is measured: the others extrapolate
                total += cell.recipe.train.iterations * seconds / 3600
                extrapolated += not measured
            how = f"{extrapolated} of {len(cells)} by FLOPs" if extrapolated else "measured"
            return [Finding(f"device-hours {path.stem}", f"{total:,.1f} h ({how})",
                            f"{len(cells)} runs on {label}", INFO)]
        rows += guarded(f"device-hours {path.stem}", hours)
    rows.append(Finding("--estimate cache", str(cache.path), "filled for `sweep --dry-run`", INFO))
    return rows


def run_checks(device: torch.device, root: Path, runs_root: Path,
               say: Callable[[str], None] = lambda line: None) -> list[Finding]:
    """Every check, the CPU ones always, the device ones where `device` is CUDA."""
    cpu = torch.device("cpu")
    cuda = device.type == "cuda"
    skipped = NO_DEVICE if not torch.cuda.is_available() else f"not run: --device {device}"
    rows = gpu_expected_check(device)
    rows += guarded("stack", lambda: stack_checks(device, skipped))
    say("equivalence with the CPU")
    if cuda:
        rows += equivalence_checks(device, cpu)
    else:
        rows.append(Finding(f"equivalence ({len(equivalence_models())} models)", "-",
                            "device vs CPU within tolerance", skipped))
    say("determinism")
    rows += guarded("determinism (CPU)", lambda: determinism_check(cpu, CPU_SIZE))
    if cuda:
        rows += guarded("determinism (device)",
                        lambda: determinism_check(device, EQUIVALENCE_SIZE))
    say("resume")
    resume = small_recipe(BASE_ARCH, BASE_ENCODING, CPU_SIZE, iterations=4, checkpoint_every=2,
                          log_every=1, keep_checkpoints="all")
    # cuda -> cuda is a SLURM job requeued on another GPU; the others a run moved.
    pairs = [(cpu, cpu)] + ([(device, device), (cpu, device), (device, cpu)] if cuda else [])
    for a, b in pairs:
        rows += guarded(f"resume {a.type} -> {b.type}",
                        functools.partial(resume_check, resume, a, b))
    if cuda:
        # One GPU model here; Session.load says in one line when a checkpoint's is another.
        rows.append(Finding("resume on another GPU model", f"this one: {device_model(device)}",
                            "a note that the batches after it differ (CUDA's draws depend "
                            "on the multiprocessor count)", INFO))
    if not cuda:
        rows.append(Finding("resume cpu <-> cuda", "-", "resumes on the other device",
                            skipped))
    say("memory")
    rows += guarded("memory (CPU)", lambda: memory_check(
        small_recipe(BASE_ARCH, BASE_ENCODING, CPU_MEMORY_SIZE), cpu,
        f"CPU, {registry.label('model', BASE_ARCH)} PE E=H=128 B=128"))
    if cuda:
        for path in DEVICE_MEMORY:
            rows += guarded(f"memory ({Path(path).stem})", functools.partial(
                memory_check, load_recipe(root / path), device, Path(path).stem))
    else:
        rows.append(Finding(f"memory (device: {', '.join(Path(p).stem for p in DEVICE_MEMORY)})",
                            "-", "{:g} to {:g}".format(*MEMORY_RATIO["cuda"]), skipped))
    say("host syncs")
    if cuda:
        rows += guarded("host syncs", lambda: sync_checks(device, load_recipe(root / FIG2_GRU)))
    else:
        rows.append(Finding("host syncs per step (Fig. 2 GRU, fresh and resumed)", "-",
                            f"<= {EXPECTED_SYNCS}, a resume adding none",
                            NO_SYNCS_ON_CPU if not torch.cuda.is_available() else skipped))
    say("speed")
    if cuda:
        rows += guarded("speed", lambda: speed_checks(
            device, load_recipe(root / FIG2_GRU), sorted((root / PAPER_GRIDS).glob("*.toml")),
            runs_root))
    else:
        rows.append(Finding("speed (bench --baseline, device-hours)", "-",
                            f"<= x{SPEED_RATIO:g} the bare cuDNN loop", skipped))
    return rows


def doctor(device: torch.device, runs_root: Path = defaults.RUNS,
           say: Callable[[str], None] = lambda line: None) -> tuple[list[Finding], float]:
    """The rows and the seconds they took."""
    t0 = time.perf_counter()
    rows = run_checks(device, repository_root(), runs_root, say)
    return rows, time.perf_counter() - t0
