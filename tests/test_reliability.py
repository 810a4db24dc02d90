"""What a careless or unlucky cluster user does to perencode, one test per case: foreign
checkpoints on resume (same shape and another shape), empty recipes, sweeps killed with
their workers running, read-only folders, edge values, filesystems without locks, corrupt
checkpoints in finished runs, verify killed mid-write, the wording of the last one-liners,
and lm-prepare at a size where memory, threads, progress and Ctrl-C matter.

Read-only folders: as root (the tests' usual user) a chmod does not stop writes, so a
read-only bind mount is used; where mounting is not allowed either, those tests skip.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path

import forked
import pytest
import torch
from conftest import (
    PYTHON,
    RECIPE,
    ROOT,
    one_line,
    spawned_children,
    subprocess_env,
    tiny_toml,
    train_args,
    unfinish,
)
from conftest import (
    flat as _flat,
)
from wikitext_like import write_wikitext_like

import perencode.store.lock
from perencode.commands import lm_prepare
from perencode.config.grid import load_grid
from perencode.store import runs
from perencode.store.checkpoints import atomic_torch_save

DUALFREQ = ROOT / "recipes/gru_dualfreq_vocab64.toml"


def _args(out: Path, *extra: str, iterations: int = 10, every: int = 5,
          recipe: Path = RECIPE) -> list[str]:
    return train_args(out, f"train.iterations={iterations}", f"train.checkpoint_every={every}",
                      "task.vocab_size=8", "task.length=6", "optim.warmup=2",
                      "train.keep_checkpoints=\"all\"", *extra, recipe=recipe)


def _weights(path: Path) -> dict:
    return runs.load_checkpoint(path)["model"]


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- 1 and 8: a resume checks whose checkpoint it is ------------------------------------

@pytest.mark.slow
@pytest.mark.compat
def test_a_foreign_checkpoint_of_the_same_shape_is_set_aside_and_never_adopted(cli, tmp_path):
    ours, theirs, reference = tmp_path / "c", tmp_path / "b", tmp_path / "ref"
    assert cli(*_args(reference, "train.seed=111"))[0] == 0
    assert cli(*_args(theirs, "train.seed=222"))[0] == 0
    assert cli(*_args(ours, "train.seed=111"))[0] == 0
    ckpts = ours / "checkpoints"
    # Unfinished again, its newest checkpoint replaced by the other seed's (same shapes).
    unfinish(ours)
    shutil.copy(theirs / "checkpoints/step-10.pt", ckpts / "step-10.pt")
    code, text = cli(*_args(ours, "train.seed=111"))
    assert code == 0, text
    assert ("step-10.pt: it is another run's checkpoint (train.seed: 222 in the checkpoint vs "
            "111 in the run); kept aside as step-10.pt.foreign, resuming from step-5.pt") \
        in _flat(text)
    assert f"{ours}: resuming from iteration 5 of 10" in _flat(text)
    assert (ckpts / "step-10.pt.foreign").exists()
    assert _same(_weights(ckpts / "step-10.pt"), _weights(reference / "checkpoints/step-10.pt"))
    assert not _same(_weights(ckpts / "step-10.pt"), _weights(theirs / "checkpoints/step-10.pt"))

    # Every checkpoint foreign: it starts over, saying so, and still ends as seed 111.
    unfinish(ours)
    for step in (5, 10):
        shutil.copy(theirs / f"checkpoints/step-{step}.pt", ckpts / f"step-{step}.pt")
    code, text = cli(*_args(ours, "train.seed=111"))
    assert code == 0 and "no checkpoint of this run is left: training starts over from " \
        "iteration 0" in _flat(text), text
    assert _same(_weights(ckpts / "step-10.pt"), _weights(reference / "checkpoints/step-10.pt"))
    assert json.loads((ours / "eval.json").read_text())["seed"] == 111
    assert json.loads((ours / "eval.json").read_text()) == \
        json.loads((reference / "eval.json").read_text())


def test_a_checkpoint_of_another_shape_is_set_aside_as_another_recipes(cli, tmp_path):
    ours, bigger = tmp_path / "k8", tmp_path / "k16"
    assert cli(*_args(ours))[0] == 0
    assert cli(*_args(bigger, "task.vocab_size=16"))[0] == 0
    unfinish(ours)
    shutil.copy(bigger / "checkpoints/step-10.pt", ours / "checkpoints/step-10.pt")
    code, text = cli(*_args(ours))
    assert code == 0, text
    assert "step-10.pt: it is another run's checkpoint (task.vocab_size: 16 in the checkpoint " \
        "vs 8 in the run); kept aside as step-10.pt.foreign, resuming from step-5.pt" \
        in _flat(text)
    code, text = cli(*_args(ours))  # the rerun is not stuck on it
    assert code == 0 and "already complete" in _flat(text), text


def test_eval_and_stability_apply_the_same_test(cli, tmp_path):
    ours, theirs = tmp_path / "a", tmp_path / "b"
    assert cli(*_args(ours, recipe=DUALFREQ))[0] == 0
    assert cli(*_args(theirs, "train.seed=5", recipe=DUALFREQ))[0] == 0
    shutil.copy(theirs / "checkpoints/step-10.pt", ours / "checkpoints/step-10.pt")
    want = "not a checkpoint of the run in"
    line = one_line(*cli("eval", ours, "--device", "cpu"))
    assert want in line and "(train.seed: 5 in the checkpoint vs 111 in the run)" in line
    line = one_line(*cli("stability", ours, "--device", "cpu", "--triplets", 4,
                          "--no-progress"))
    assert want in line and "train.seed: 5 in the checkpoint" in line


# -- 2, 5, 10: inputs refused before anything is written ---------------------------------

@pytest.mark.parametrize("text", ["", "# only a comment\n\n# and another\n"])
@pytest.mark.parametrize("command", ["show", "train"])
def test_an_empty_recipe_is_one_line(cli, tmp_path, monkeypatch, text, command):
    monkeypatch.chdir(tmp_path)
    recipe = tmp_path / "empty.toml"
    recipe.write_text(text)
    line = one_line(*cli(command, recipe, "--device", "cpu") if command == "train"
                     else cli(command, recipe))
    assert line == (f"error: {recipe}: names no task; a recipe needs at least [task] name = "
                    f"... (`perencode recipe-schema` lists every field and its default)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.toml"]  # no runs/ folder


@pytest.mark.parametrize("setting, says", [
    ("optim.weight_decay=1e300", "optim.weight_decay: must be at most 3.4e38"),
    ("optim.weight_decay=inf", "optim.weight_decay: Input should be a finite number (got inf)"),
    ("optim.lr=nan", "optim.lr: Input should be a finite number (got nan)"),
    ("optim.clip_norm=inf", "optim.clip_norm: Input should be a finite number (got inf)"),
    ("optim.eps=-inf", "optim.eps: Input should be a finite number"),
    ("train.seed=18446744073709551615",
     "train.seed: Input should be less than or equal to 4294967295"),
    ("train.keep_checkpoints=0", 'train.keep_checkpoints: "all" or an integer >= 1 (got 0)'),
])
def test_edge_values_are_refused_before_anything_is_written(cli, tmp_path, setting, says):
    out = tmp_path / "run"
    line = one_line(*cli(*_args(out, setting)))
    assert says in line and line.count("(got") <= 1, line
    assert not out.exists()


def test_the_largest_seed_trains(cli, tmp_path):
    code, text = cli(*_args(tmp_path / "run", "train.seed=4294967295", iterations=2, every=2))
    assert code == 0, text


def test_a_folder_given_as_the_recipe_says_so(cli, tmp_path):
    line = one_line(*cli("train", tmp_path, "--device", "cpu"))
    assert line == f"error: {tmp_path}: is a folder; give a recipe file (e.g. " \
        "recipes/gru_vocab256.toml)"


def test_a_train_that_fails_before_its_first_step_claims_nothing(cli, tmp_path):
    out = tmp_path / "run"
    lm = ROOT / "recipes/lstm_wikitext103.toml"
    line = one_line(*cli("train", lm, "--run-dir", out, "--device", "cpu", "--force",
                          "--set", f"task.data={tmp_path / 'nowhere'}"))
    assert "nowhere" in line
    assert not out.exists()  # nothing claimed: the fixed command is not "a different recipe"
    code, text = cli(*_args(out))
    assert code == 0 and runs.Run(out).is_complete(), text


@pytest.mark.slow
def test_a_sweep_conflict_names_the_run_once(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text('[task]\nname = "reverse"\nlength = 4\nvocab_size = 8\nheld_out = 16\n'
                    '[model]\nhidden_size = 8\nembed_size = 8\n[train]\niterations = 2\n'
                    'batch_size = 4\ncheckpoint_every = 2\nlog_every = 1\n'
                    '[grid]\n"train.seed" = [1]\n')
    cell = tmp_path / "runs/g/seed=1"
    cell.mkdir(parents=True)
    (cell / "recipe.toml").write_text(RECIPE.read_text())
    done = forked.run(["sweep", grid, "--runs", tmp_path / "runs", "--device", "cpu",
                       "--no-progress"], env=subprocess_env(), cwd=tmp_path)
    conflict = [line for line in (done.stdout + done.stderr).splitlines()
                if line.startswith("conflict:")]
    assert done.returncode == 1 and len(conflict) == 1, done.stdout + done.stderr
    assert conflict[0].count(str(cell)) == 1, conflict


# -- 6: a filesystem without locks --------------------------------------------------------

def test_a_filesystem_without_locks_is_one_line_with_the_way_out(cli, tmp_path, monkeypatch):
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(perencode.store.lock.fcntl, "lockf", no_locks)
    out = tmp_path / "run"
    line = one_line(*cli(*_args(out)))
    assert f"{out / '.perencode.lock'}: the filesystem refuses file locks (ENOLCK" in line
    assert "PERENCODE_NO_LOCK=1" in line and "local or lock-capable filesystem" in line
    assert not (out / ".perencode.lock").exists()
    monkeypatch.setenv("PERENCODE_NO_LOCK", "1")
    code, text = cli(*_args(out))
    assert code == 0 and runs.Run(out).is_complete(), text


# -- 7: a corrupt checkpoint in a finished run -------------------------------------------

@pytest.mark.slow
@pytest.mark.compat
def test_a_corrupt_final_checkpoint_gets_advice_that_works(cli, tmp_path):
    out = tmp_path / "run"
    assert cli(*_args(out))[0] == 0
    (out / "checkpoints/step-10.pt").write_bytes(b"cut short")
    line = one_line(*cli("eval", out, "--device", "cpu"))
    older = out / "checkpoints/step-5.pt"
    advice = f"`perencode eval {out} --checkpoint {older}`"
    assert line.endswith(f"score the older step-5.pt with {advice}"), line
    code, text = cli("eval", out, "--checkpoint", older, "--device", "cpu")
    assert code == 0 and (out / "eval-step-5.json").exists(), text

    only = tmp_path / "only"  # one kept checkpoint: a new run directory is the way
    assert cli(*_args(only, "train.keep_checkpoints=1"))[0] == 0
    (only / "checkpoints/step-10.pt").write_bytes(b"cut short")
    line = one_line(*cli("eval", only, "--device", "cpu"))
    assert line.endswith("no other checkpoint is kept: train the recipe again into a new run "
                         f"directory, `perencode train {only / 'recipe.toml'} --run-dir "
                         "NEW_DIR`"), line
    again = tmp_path / "again"
    code, text = cli("train", only / "recipe.toml", "--run-dir", again, "--device", "cpu",
                     "--no-progress")
    assert code == 0 and runs.Run(again).is_complete(), text
    assert json.loads((again / "eval.json").read_text()) == \
        json.loads((out / "eval.json").read_text())


# -- issue 31's eval items -----------------------------------------------------------------

def test_eval_of_an_unfinished_run_says_where_it_stands_and_what_it_scores(cli, tmp_path):
    out = tmp_path / "run"
    assert cli(*_args(out))[0] == 0
    (out / "eval.json").unlink()
    (out / "checkpoints/step-10.pt").unlink()
    state = runs.load_checkpoint(out / "checkpoints/step-5.pt")
    atomic_torch_save(out / "checkpoints/resume.pt", {**state, "iteration": 7})
    code, text = cli("eval", out, "--device", "cpu")
    assert code == 0, text
    assert (f"{out}: unfinished run at iteration 7 of 10; scoring step-5.pt (iteration 5); the "
            f"newer resume.pt (iteration 7, saved when training was stopped) is scored only "
            f"with --checkpoint {out / 'checkpoints/resume.pt'}") in _flat(text)
    assert json.loads((out / "eval-step-5.json").read_text())["iteration"] == 5
    code, text = cli("eval", out, "--checkpoint", out / "checkpoints/resume.pt",
                     "--device", "cpu")
    assert code == 0 and json.loads((out / "eval-step-7.json").read_text())["iteration"] == 7


# -- 9: verify writes under the figures lock ---------------------------------------------

@pytest.mark.slow
def test_verify_clears_what_a_killed_verify_left_and_shares_the_figures_lock(
        cli, tmp_path, paper_like):
    out = tmp_path / "figs"
    out.mkdir()
    stale = out / ".verify.md.abcd1234.tmp"
    stale.write_text("half")
    kept = out / ".results.csv.abcd1234.tmp"  # a figures temp: not verify's to remove
    kept.write_text("half")
    code, text = cli("verify", paper_like, "--out", out, "--report-only")
    assert code == 0, text
    assert not stale.exists() and kept.exists() and (out / "verify.md").exists()
    holder = subprocess.Popen(
        [PYTHON, "-c", "import sys, time; from pathlib import Path; "
         "from perencode.store.lock import hold\nwith hold(Path(sys.argv[1]), 'figures'):\n"
         "    print('held', flush=True); time.sleep(60)", str(out)],
        env=subprocess_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        line = one_line(*cli("verify", paper_like, "--out", out, "--report-only"))
        assert f"{out}: in use by `figures` (pid {holder.pid}" in line
    finally:
        holder.kill()
        holder.wait()


# -- 4: read-only folders ------------------------------------------------------------------

@contextlib.contextmanager
def read_only(folder: Path):
    """`folder` read-only for this process: a read-only bind mount as root (chmod does not
    stop root), else mode 0555; skips where neither is possible."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield folder
        finally:
            folder.chmod(0o755)
        return
    mount = shutil.which("mount")
    done = mount and subprocess.run([mount, "--bind", str(folder), str(folder)],
                                    capture_output=True).returncode == 0
    if not done:
        pytest.skip("cannot make a read-only folder here (root without mount)")
    assert mount is not None
    try:
        if subprocess.run([mount, "-o", "remount,ro,bind", str(folder)],
                          capture_output=True).returncode != 0:
            pytest.skip("cannot remount read-only here")
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> dict[str, Path]:
    """A finished tiny reverse run and a finished tiny dual-frequency run."""
    from conftest import run_cli

    root = tmp_path_factory.mktemp("finished")
    made = {"reverse": root / "reverse", "dual": root / "dual"}
    assert run_cli(*_args(made["reverse"]))[0] == 0
    assert run_cli(*_args(made["dual"], recipe=DUALFREQ))[0] == 0
    return made


def _grid(tmp_path: Path) -> Path:
    grid = tmp_path / "grid.toml"
    grid.write_text('[task]\nname = "reverse"\nlength = 4\nvocab_size = 8\nheld_out = 16\n'
                    '[train]\niterations = 2\nbatch_size = 4\ncheckpoint_every = 2\n'
                    '[grid]\n"train.seed" = [1]\n')
    return grid


COMMANDS = {
    "train": lambda ro, t, f, p: _args(ro / "run"),
    "sweep": lambda ro, t, f, p: ["sweep", _grid(t), "--runs", ro / "sweeps", "--device",
                                  "cpu", "--no-progress"],
    "figures": lambda ro, t, f, p: ["figures", p, "--out", ro / "figs"],
    "verify": lambda ro, t, f, p: ["verify", p, "--out", ro / "figs"],
    "rehearsal corpus": lambda ro, t, f, p: ["rehearsal", "corpus", ro / "corpus"],
    "lm-prepare": lambda ro, t, f, p: ["lm-prepare", "--source", _corpus(t), "--out",
                                       ro / "data",
                                       "--vocab-size", 96, "--threads", 1, "--no-progress"],
    "quickstart": lambda ro, t, f, p: ["quickstart", "--device", "cpu", "--runs", ro / "runs",
                                       "--out", ro / "figs", "--no-progress"],
}


def _corpus(tmp_path: Path) -> Path:
    from perencode.commands.rehearsal import write_corpus

    write_corpus(tmp_path / "corpus")
    return tmp_path / "corpus"


@pytest.mark.slow
@pytest.mark.compat
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_command_writing_into_a_read_only_folder_says_so_in_one_line(
        cli, tmp_path, command, paper_like):
    with read_only(tmp_path / "ro") as ro:
        args = COMMANDS[command](ro, tmp_path, None, paper_like)
        code, text = cli(*args)
    if command == "quickstart":  # its first line says what the demo runs, then it stops
        assert text.startswith("quick demo (cpu)"), text
        text = text.split("\n", 1)[1]
    line = one_line(code, text)
    assert str(ro) in line and "read-only file system" in line.lower(), line


@pytest.mark.parametrize("command", ["eval", "stability"])
def test_eval_and_stability_of_a_run_on_a_read_only_mount_say_so_in_one_line(
        cli, finished, command):
    run = finished["dual"]
    args = ["stability", run, "--triplets", 4, "--no-progress"] if command == "stability" \
        else ["eval", run]
    with read_only(run):
        line = one_line(*cli(*args, "--device", "cpu"))
    assert str(run) in line and "read-only file system" in line.lower(), line


# -- 3: a sweep's workers die with it ---------------------------------------------------------

def _sweep_grid(iterations: int) -> str:
    """Two seeds of a tiny recipe, each `iterations` long (a checkpoint only at the end)."""
    return tiny_toml(task={"vocab_size": 8}, optim={"warmup": 2},
                     train={"iterations": iterations, "checkpoint_every": iterations,
                            "log_every": 10}, grid={"train.seed": [1, 2]})


def _lock_pid(run_dir: Path) -> int | None:
    try:
        return json.loads((run_dir / ".perencode.lock").read_text()).get("pid")
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its new parent) is not running.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


@pytest.mark.slow
def test_workers_of_a_killed_sweep_checkpoint_and_stop(tmp_path, real_children):
    """The sweep a fork of this process (tests/forked.py), its workers new `perencode train`
    processes, as the sweep starts them: they outlive a SIGKILL of the sweep only to save a
    checkpoint."""
    grid = tmp_path / "g.toml"
    grid.write_text(_sweep_grid(1_000_000))
    sweep = forked.start(["sweep", grid, "--runs", tmp_path / "runs", "--jobs", "2", "--device",
                          "cpu", "--no-progress"], env=subprocess_env(),
                         output=tmp_path / "sweep.log")
    cells = [tmp_path / "runs/g" / f"seed={s}" for s in (1, 2)]
    t0 = time.time()
    while not all((c / "metrics.jsonl").exists() and _lock_pid(c) for c in cells):
        assert time.time() - t0 < 120 and sweep.poll() is None
        time.sleep(0.1)
    workers = [pid for pid in map(_lock_pid, cells) if pid is not None]
    sweep.kill()
    sweep.wait()
    t0 = time.time()
    while any(_alive(pid) for pid in workers):
        assert time.time() - t0 < 15, "a worker outlived its sweep"
        time.sleep(0.1)
    for cell in cells:
        assert (cell / "checkpoints/resume.pt").exists()
        assert "interrupted at iteration" in (cell / "train.log").read_text()


@pytest.mark.slow
def test_a_rerun_waits_for_a_live_worker_and_keeps_to_its_jobs(tmp_path, monkeypatch):
    """The worker, the sweep and the sweep's child are forks of this process
    (tests/forked.py): processes of their own, holding and waiting for the run's lock."""
    from perencode.commands.sweep import local
    monkeypatch.setattr(local, "launch", forked.launch)
    grid = tmp_path / "g.toml"
    grid.write_text(_sweep_grid(100))
    cells = load_grid(grid).cells
    first = tmp_path / "runs/g" / cells[0].name
    recipe = tmp_path / "cell.toml"
    recipe.write_text(cells[0].recipe.to_toml())
    # A worker left running by an earlier sweep: training the first cell's run directory.
    worker = forked.start(["train", recipe, "--run-dir", first, "--device", "cpu",
                           "--no-progress"], env=subprocess_env(), output=tmp_path / "worker.log")
    t0 = time.time()
    while not (first / "metrics.jsonl").exists():
        assert time.time() - t0 < 60 and worker.poll() is None
        time.sleep(0.01)
    # Stopped (SIGSTOP: alive, holding its lock, training nothing) until the sweep has said
    # it waits for it, so a short run outlives the sweep's start on a loaded machine.
    worker.send_signal(signal.SIGSTOP)
    resume = threading.Timer(240, worker.send_signal, (signal.SIGCONT,))  # never stopped for good
    resume.start()
    log = tmp_path / "sweep.log"
    try:
        sweep = forked.start(["sweep", grid, "--runs", tmp_path / "runs", "--jobs", "1",
                              "--device", "cpu"], env=subprocess_env(), output=log)
        t0 = time.time()
        while "waiting for it" not in log.read_text() and sweep.poll() is None:
            assert time.time() - t0 < 240, log.read_text()
            time.sleep(0.02)
        worker.send_signal(signal.SIGCONT)
        assert sweep.wait(timeout=300) == 0, log.read_text()
    finally:
        resume.cancel()
        worker.send_signal(signal.SIGCONT)
    output = log.read_text()
    assert worker.wait(timeout=60) == 0
    assert "failed" not in output
    assert f"[sweep] seed=1: running - still held by `train` (pid {worker.pid}" in output
    assert "a worker of an earlier sweep; waiting for it" in output
    assert all(runs.Run(tmp_path / "runs/g" / c.name).is_complete() for c in cells)
    # --jobs 1: the second cell started only once the worker had finished the first.
    ended = datetime.fromisoformat(json.loads((first / "env.json").read_text())["end_time"])
    second = (tmp_path / "runs/g" / cells[1].name / "train.log").read_text()
    started = datetime.fromisoformat(second.splitlines()[0].split()[1])
    assert started >= ended.replace(microsecond=0)


# -- 11: lm-prepare at size ------------------------------------------------------------------

def _prepare(*args):
    from conftest import run_cli

    return run_cli("lm-prepare", *args)


@pytest.fixture(scope="module")
def corpus_1mb(tmp_path_factory) -> Path:
    return write_wikitext_like(tmp_path_factory.mktemp("wt") / "raw", 1.0)


@pytest.fixture(scope="module")
def corpus_small(tmp_path_factory) -> Path:
    """A quarter of a megabyte: enough for 300 pieces, for the tests where SentencePiece's
    work is not what is measured."""
    return write_wikitext_like(tmp_path_factory.mktemp("wt-small") / "raw", 0.25)


@pytest.mark.slow
def test_lm_prepare_refuses_what_cannot_fit_with_the_way_out(tmp_path, monkeypatch,
                                                             corpus_1mb):
    out = tmp_path / "data"
    monkeypatch.setenv("SLURM_MEM_PER_NODE", "210")  # MB: SLURM's --mem=210M
    args = ["--source", corpus_1mb, "--out", out, "--vocab-size", 500, "--threads", 1,
            "--no-progress"]
    line = one_line(*_prepare(*args))
    paragraphs = sum(1 for line in (corpus_1mb / "wiki.train.raw").open()
                     if line.strip() and not line.startswith(" ="))
    size = sum(len(line.encode()) for line in (corpus_1mb / "wiki.train.raw").open()
               if line.strip() and not line.startswith(" ="))
    need = (lm_prepare.SPM_MEMORY_BASE + lm_prepare.SPM_MEMORY_PER_BYTE * size) / 2**30
    fits = (210 * 2**20 - lm_prepare.SPM_MEMORY_BASE) // lm_prepare.SPM_MEMORY_PER_BYTE \
        * paragraphs // size
    assert line == (f"error: training SentencePiece on {size / 1e6:.1f} MB of text needs about "
                    f"{need:.1f} GiB at its peak, more than the 0.2 GiB of the SLURM job's "
                    f"memory (--mem): run it where there is more memory, or pass --force to "
                    f"try anyway, or --sample {fits} to train the vocabulary on a "
                    f"random sample of the paragraphs (a departure from the authors' "
                    f"full-corpus vocabulary)")
    assert not out.exists() and not list(tmp_path.glob(".data.*build*"))
    code, text = _prepare(*args, "--sample", fits)
    assert code == 0, text
    trainer = json.loads((out / "manifest.json").read_text())["tokenizer"]["trainer"]
    assert trainer["input_sentence_size"] == fits and trainer["shuffle_input_sentence"]
    code, text = _prepare(*args, "--force", "--out", tmp_path / "forced")
    assert code == 0, text
    trainer = json.loads((tmp_path / "forced/manifest.json").read_text())["tokenizer"]
    assert trainer["trainer"]["input_sentence_size"] == 0  # every paragraph
    assert trainer["training_text_bytes"] == size and trainer["peak_memory_mib"] > 0


@pytest.mark.slow
def test_lm_prepare_trainer_threads_follow_threads(tmp_path, corpus_small, monkeypatch):
    code, text = _prepare("--source", corpus_small, "--out", tmp_path / "one", "--vocab-size",
                          300, "--threads", 1, "--no-progress")
    assert code == 0, text
    manifest = json.loads((tmp_path / "one/manifest.json").read_text())
    assert manifest["tokenizer"]["trainer"]["num_threads"] == 1
    assert "num_threads: 1\n" in (tmp_path / "one/sentencepiece.log").read_text()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    code, text = _prepare("--source", corpus_small, "--out", tmp_path / "all", "--vocab-size",
                          300, "--no-progress")
    assert code == 0, text
    manifest = json.loads((tmp_path / "all/manifest.json").read_text())
    assert manifest["tokenizer"]["trainer"]["num_threads"] == 3
    assert manifest["encode_threads"] == 3


@pytest.mark.slow
def test_lm_prepare_shows_progress_while_sentencepiece_trains(tmp_path, corpus_1mb,
                                                               monkeypatch):
    monkeypatch.setattr(lm_prepare, "PROGRESS_EVERY_S", 0.0)
    out = tmp_path / "data"
    code, text = _prepare("--source", corpus_1mb, "--out", out, "--vocab-size", 300,
                          "--threads", 1)
    assert code == 0, text
    flat = _flat(text)
    assert "training SentencePiece unigram (300 pieces, 1 threads)" in flat
    assert f"its log: {tmp_path}/.data.build-" in flat and \
        f"(kept as {out / 'sentencepiece.log'})" in flat
    ticks = [line for line in text.splitlines()
             if line.startswith("[lm-prepare] SentencePiece training, 0m")]
    assert ticks and all(" elapsed: " in line for line in ticks)
    assert any("EM sub_iter" in line or "Making suffix array" in line or "Loaded" in line
               for line in ticks), ticks
    assert "trained SentencePiece in 0m" in flat


@pytest.mark.slow
def test_lm_prepare_removes_a_killed_runs_build_folder(tmp_path, corpus_small):
    stale = tmp_path / ".data.build-k1ll3d00"
    stale.mkdir()
    (stale / "train.txt").write_text("x" * 1000)
    code, text = _prepare("--source", corpus_small, "--out", tmp_path / "data", "--vocab-size",
                          300, "--threads", 1, "--no-progress")
    assert code == 0 and not stale.exists(), text
    assert f"removed {stale}, left by an lm-prepare that was killed" in _flat(text)


def _ctrl_c_as_in_a_terminal():
    """A job started with `&` by a non-interactive shell (as CI may start the tests) ignores
    SIGINT, and Python then installs no KeyboardInterrupt handler: give the child the
    default disposition a command typed at a terminal has."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the trainer through /proc")
def test_ctrl_c_stops_lm_prepare_within_seconds_and_leaves_nothing(tmp_path):
    raw = write_wikitext_like(tmp_path / "raw", 8.0)
    proc = subprocess.Popen([PYTHON, "-m", "perencode", "lm-prepare", "--source", str(raw),
                             "--out", str(tmp_path / "data"), "--vocab-size", "8000",
                             "--threads", "1"], env=subprocess_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_ctrl_c_as_in_a_terminal)
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if "its log:" in line or "(kept as" in line:
            break
    log = next(tmp_path.glob(".data.build-*")) / "sentencepiece.log"
    t0 = time.time()
    while not (log.exists() and log.stat().st_size > 0):
        assert time.time() - t0 < 60, "".join(lines)
        time.sleep(0.1)
    trainers = spawned_children(proc.pid)
    assert trainers, "the tokenizer trains in a child process"
    sent = time.time()
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=30)
    took = time.time() - sent
    assert proc.returncode == 130, "".join(lines) + rest
    assert took < 5, took
    assert f"interrupted; the unfinished build was removed ({tmp_path / 'data'} is as it " \
        "was)" in _flat(rest)
    assert "Traceback" not in rest
    assert not any(_alive(pid) for pid in trainers)
    assert not list(tmp_path.glob(".data*"))  # no build folder, no lock file
    assert not (tmp_path / "data").exists()

