#!/usr/bin/env python3
"""First contact with a GPU, in under 8 minutes of device time: what a read of the CUDA
code predicts and only a GPU can measure (issue 47). `make device-check` runs it.

    python tools/device_check.py OUT [--budget 450] [--device auto|cuda|cpu] [--dry-run]

Steps, in the order of what they prove; each has its own limit and is skipped when the
budget left is below its minimum (a skipped or failed step never stops the next):

  env      GPU model, driver, torch's CUDA/cuDNN, the build's kernels for this GPU
  syncs    host syncs per training step at the paper's shapes, fresh and after a resume
           mapped onto the GPU (Adam's `step` counters on the CPU)
  resume   bit-identity on the device: a session cut and resumed (cuda -> cuda) against
           the uninterrupted one, and a second uninterrupted one
  speed    ms per step at the paper's shapes: free-running (CUDA events, one sync at the
           end, as training runs) and synchronised per step, against the bare cuDNN loop
  tf32     the K = 16,384 LSTM's and the S4D's step with TF32 on cuBLAS (the heads)
  memory   perencode.training.planning's estimate against the allocator's peak (two steps and the
           held-out evaluation) for the largest synthetic model of each kind; the
           language model's head against its estimate
  share    steps/s of 1 and of 4 training processes at once on the one GPU
  doctor   `perencode doctor` on the device, every row

Without a CUDA device (or with --device cpu) the same steps run at tiny shapes on the CPU,
to show the script works; the rows that need a GPU say "skipped: ..." and why. Results:
OUT/summary.txt (one line a step, then its numbers) and OUT/device-check.json.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's perencode, installed or not

from perencode.commands import bench, doctor  # noqa: E402
from perencode.common.device import (  # noqa: E402
    free_running_seconds,
    host_syncs,
    kernel_support,
    synchronize,
)
from perencode.common.processes import perencode_command  # noqa: E402
from perencode.config.recipe import Recipe, load_recipe  # noqa: E402
from perencode.kinds.models.rnn import CELLS  # noqa: E402
from perencode.store import environment  # noqa: E402
from perencode.training import planning  # noqa: E402
from perencode.training.session import CHUNK_LOGITS, Session  # noqa: E402

# (name, seconds it may take at most, seconds it needs at least) in running order.
STEPS = [("env", 30, 5), ("syncs", 45, 15), ("resume", 45, 15), ("speed", 100, 30),
         ("tf32", 30, 10), ("memory", 60, 20), ("share", 60, 40), ("doctor", 240, 120)]
# The paper's shapes that matter most for time and memory (recipes/).
SPEED_SHAPES = ["gru_vocab256.toml", "gru_vocab256_vanilla.toml", "lstm_vocab16384.toml",
                "lstm_vocab16384_vanilla.toml", "s4d_vocab1024.toml",
                "lstm_predecessor_vocab1024.toml"]
SYNC_SHAPES = ["gru_vocab256.toml", "lstm_varlen_vocab16384.toml", "s4d_vocab1024.toml",
               "gru_dualfreq_vocab64.toml"]
MEMORY_SHAPES = ["lstm_vocab16384.toml", "gru_vocab256.toml", "s4d_dualfreq_vocab2048.toml"]
NO_GPU = "no CUDA device (measured on a GPU only)"


class StepTimeout(Exception):
    pass


def recipe(name: str, smoke: bool) -> Recipe:
    """A recipe of recipes/ at the paper's shapes; on the CPU (smoke) at tiny ones."""
    path = ROOT / "recipes" / name
    sets: list[str] = []
    if smoke:
        sets = ["model.hidden_size=16", "model.embed_size=16", "train.batch_size=8",
                "train.eval_batch_size=64", "task.length=4", "task.vocab_size=16"]
        sets += ["model.d_state=8"] if "s4d" in name else []
        sets += [] if "dualfreq" in name else ["task.held_out=32"]
        sets += ["task.min_length=2"] if "varlen" in name else []
        sets += ["task.held_out_per_cell=1"] if "dualfreq" in name else []
    return load_recipe(path, sets)


def params(session: Session) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in session.model.state_dict().items()}


def identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict:
    return {"bit_identical": all(torch.equal(a[k], b[k]) for k in a),
            "max_abs_diff": max(float((a[k].double() - b[k].double()).abs().max()) for k in a)}


def resumed_from(session: Session, device: torch.device) -> Session:
    """A new session loaded from `session`'s state saved and read back onto `device`, as
    `perencode train` resumes (runs.Run.resume(device))."""
    buffer = io.BytesIO()
    torch.save(session.state(), buffer)
    buffer.seek(0)
    other = Session(session.recipe, device)
    other.load("device-check", torch.load(buffer, map_location=device, weights_only=True))
    return other


class Check:
    def __init__(self, out: Path, device: torch.device, budget: float):
        self.out, self.device, self.budget = out, device, budget
        self.cuda = device.type == "cuda"
        self.smoke = not self.cuda
        self.n, self.warmup = (3, 1) if self.smoke else (20, 5)
        self.t0 = time.monotonic()
        self.results: dict[str, Any] = {
            "shapes": "tiny, on the CPU: the numbers only show that each step runs" if self.smoke
            else "the paper's"}
        self.lines: list[str] = []

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.t0)

    def run(self, name: str, limit: int, least: int, fn: Callable[[], Any]) -> None:
        left = self.left()
        if left < least:
            self.results[name] = f"skipped: {left:.0f} s of the budget left, {least} s needed"
            self.lines.append(f"{name:<7} {self.results[name]}")
            return
        limit = int(min(limit, left))
        start = time.monotonic()

        def expire(signum, frame):
            raise StepTimeout(f"over its limit of {limit} s")

        previous = signal.signal(signal.SIGALRM, expire)
        signal.alarm(limit)
        try:
            self.results[name], status = fn(), "ok"
        except Exception as exc:  # recorded; the next step runs
            self.results[name] = {"error": f"{type(exc).__name__}: {exc}"[:400],
                                  "where": traceback.format_exc().splitlines()[-3:]}
            status = "FAILED" if not isinstance(exc, StepTimeout) else "TIMED OUT"
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
            if self.cuda:
                torch.cuda.empty_cache()
        seconds = time.monotonic() - start
        self.lines.append(f"{name:<7} {status} {seconds:.0f}s (limit {limit}s): "
                          f"{json.dumps(self.results[name], default=str)[:900]}")
        print(self.lines[-1], flush=True)
        self.save()

    def save(self) -> None:
        self.results["seconds"] = round(time.monotonic() - self.t0, 1)
        (self.out / "device-check.json").write_text(
            json.dumps(self.results, indent=1, default=str))
        (self.out / "summary.txt").write_text("\n".join(self.lines) + "\n")

    # --- the steps -------------------------------------------------------------------

    def env(self) -> dict:
        report = environment.report(self.device)
        keep = ("torch", "cuda", "cudnn", "device_name", "gpu_model", "compute_capability",
                "driver", "torch_cuda_archs", "tf32_cudnn", "tf32_matmul", "cpu_cores")
        return {**{k: report.get(k) for k in keep},
                "kernels": kernel_support(self.device) or "this build has kernels for it"}

    def syncs(self) -> dict:
        if not self.cuda:
            return {"skipped": "no CUDA device: the CPU runs the kernels itself, nothing to "
                               "sync (a resumed session's Adam `step` devices still checked)",
                    "step_devices_after_resume": self._step_devices()}
        out: dict[str, Any] = {"expected_per_step": doctor.EXPECTED_SYNCS}
        for name in SYNC_SHAPES:
            fresh = Session(recipe(name, self.smoke), self.device)
            counted = host_syncs(fresh.step, self.device)
            after = host_syncs(resumed_from(fresh, self.device).step, self.device)
            assert counted is not None and after is not None
            out[name] = {"fresh": counted[0], "resumed": after[0],
                         "where": sorted({*counted[1], *after[1]})}
        out["step_devices_after_resume"] = self._step_devices()
        return out

    def _step_devices(self) -> list[str]:
        session = Session(recipe("gru_vocab256.toml", self.smoke), self.device)
        session.step()
        resumed = resumed_from(session, self.device)
        return sorted({str(s["step"].device) for s in resumed.optimizer.state.values()})

    def resume(self) -> dict:
        r = recipe("gru_vocab256.toml", self.smoke)
        k = 3 if self.smoke else 10
        a = Session(r, self.device)
        for _ in range(k):
            a.step()
        b = resumed_from(a, self.device)
        for _ in range(k):
            a.step()
            b.step()
        c = Session(r, self.device)
        for _ in range(2 * k):
            c.step()
        return {f"{self.device.type} -> {self.device.type} resumed after {k} of {2 * k}":
                identical(params(a), params(b)),
                "second uninterrupted session": identical(params(a), params(c)),
                "cudnn.deterministic": torch.backends.cudnn.deterministic}

    def speed(self) -> dict:
        out = {}
        for name in SPEED_SHAPES:
            r = recipe(name, self.smoke)
            s = Session(r, self.device)
            free = free_running_seconds(s.step, self.n, self.warmup, self.device)

            def synced(s=s):
                s.step()
                synchronize(self.device)

            per_step = free_running_seconds(synced, self.n, 0, self.device)
            row: dict[str, Any] = {
                "ms_free": round(1e3 * free, 2), "ms_synced_each_step": round(1e3 * per_step, 2),
                "tflops": round(planning.flops_per_iteration(r) / free / 1e12, 2)}
            del s
            if r.model.arch in CELLS and r.task.name in ("reverse", "sort"):
                bare = bench.bare_loop(r, self.device)
                bare_free = free_running_seconds(bare, self.n, self.warmup, self.device)
                row["ms_bare_free"] = round(1e3 * bare_free, 2)
                row["ratio_to_bare"] = round(free / bare_free, 2)
            out[name] = row
        return out

    def tf32(self) -> dict:
        if not self.cuda:
            return {"skipped": NO_GPU}
        out = {}
        matmul = torch.backends.cuda.matmul
        for name in ("lstm_vocab16384.toml", "s4d_vocab1024.toml"):
            for on in (False, True):
                before = matmul.allow_tf32
                matmul.allow_tf32 = on
                try:
                    s = Session(recipe(name, self.smoke), self.device)
                    seconds = free_running_seconds(s.step, self.n, self.warmup, self.device)
                    out[f"{name} matmul tf32 {'on' if on else 'off'}"] = round(1e3 * seconds, 2)
                    del s
                finally:
                    matmul.allow_tf32 = before
        return out

    def memory(self) -> dict:
        out: dict[str, Any] = {}
        for name in MEMORY_SHAPES if self.cuda else MEMORY_SHAPES[1:2]:
            estimate, peak, ratio = doctor.memory_ratio(recipe(name, self.smoke), self.device)
            out[name] = {"estimate_gib": round(estimate / 2 ** 30, 3),
                         "peak_gib": round(peak / 2 ** 30, 3), "ratio": round(ratio, 2)}
        lm = load_recipe(ROOT / "recipes" / "lstm_wikitext103.toml")
        out["lstm_wikitext103 estimate_gib (not run: needs the prepared data)"] = round(
            planning.estimate(lm, CHUNK_LOGITS).total / 2 ** 30, 2)
        if self.cuda:
            free, total = torch.cuda.mem_get_info(self.device)
            out["free_gib_now"], out["total_gib"] = round(free / 2 ** 30, 2), round(
                total / 2 ** 30, 2)
        return out

    def share(self) -> dict:
        if not self.cuda:
            return {"skipped": NO_GPU}
        out = {}
        for n in (1, 4):
            start = time.time() + (10 if n == 1 else 20)
            procs = [subprocess.Popen([sys.executable, __file__, "--share-worker",
                                       str(start), "6"], stdout=subprocess.PIPE, text=True)
                     for _ in range(n)]
            rows = [json.loads(p.communicate(timeout=60)[0].strip().splitlines()[-1])
                    for p in procs]
            out[f"{n} process(es)"] = {
                "steps_per_s_total": round(sum(r["steps"] / r["seconds"] for r in rows), 2),
                "peak_gib": [round(r["peak_gib"], 2) for r in rows]}
        one, four = out["1 process(es)"], out["4 process(es)"]
        out["throughput_4_over_1"] = round(four["steps_per_s_total"] /
                                           one["steps_per_s_total"], 2)
        return out

    def doctor(self) -> dict:
        if not self.cuda:
            return {"skipped": NO_GPU + " (make doctor runs its CPU rows)"}
        # The checkout's perencode in the child too, installed or not.
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        table = self.out / "doctor.txt"  # written as it goes: kept if the step runs out
        with open(table, "w", encoding="utf-8") as f:
            done = subprocess.run([*perencode_command(), "doctor", "--device",
                                   str(self.device), "--runs", str(self.out / "doctor-runs")],
                                  stdout=f, stderr=subprocess.STDOUT, text=True,
                                  timeout=max(1, self.left() - 5),
                                  env={**os.environ, "PYTHONPATH": path, "COLUMNS": "200"})
        lines = table.read_text(encoding="utf-8").strip().splitlines()
        return {"exit": done.returncode, "summary": lines[-1] if lines else "",
                "failed": [line for line in lines if "FAIL" in line][:10]}


def share_worker(start_at: float, duration: float) -> None:
    """One training process of `share`: the Fig. 2 GRU, steps counted for `duration` s
    from the common start."""
    device = torch.device("cuda")
    s = Session(recipe("gru_vocab256.toml", False), device)
    for _ in range(5):
        s.step()
    synchronize(device)
    while time.time() < start_at:
        time.sleep(0.005)
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < duration:
        for _ in range(5):
            s.step()
        n += 5
        synchronize(device)
    print(json.dumps({"steps": n, "seconds": time.perf_counter() - t0,
                      "peak_gib": torch.cuda.max_memory_allocated() / 2 ** 30}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="device-check", type=Path)
    parser.add_argument("--budget", type=float, default=450.0, help="seconds in all")
    parser.add_argument("--device", default="auto", help="auto, cuda, cuda:N or cpu")
    parser.add_argument("--dry-run", action="store_true", help="list the steps and limits")
    parser.add_argument("--share-worker", nargs=2, type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.share_worker:
        share_worker(*args.share_worker)
        return 0
    name = args.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if args.dry_run:
        for step, limit, least in STEPS:
            print(f"{step:<7} at most {limit} s, skipped with under {least} s of the budget "
                  "left" + ("" if device.type == "cuda" or step in ("env", "syncs", "resume",
                                                                     "speed", "memory")
                            else f" (skipped: {NO_GPU})"))
        print(f"budget {args.budget:.0f} s on {device}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    check = Check(args.out, device, args.budget)
    torch.manual_seed(0)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    for step, limit, least in STEPS:
        check.run(step, limit, least, getattr(check, step))
    check.lines.append(f"total {check.results['seconds']:.0f} s of {args.budget:.0f} s on "
                       f"{device}")
    check.save()
    print(check.lines[-1])
    failed = [line for line in check.lines if " FAILED " in line or "TIMED OUT" in line]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
