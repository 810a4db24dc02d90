"""The quick demo (perencode.quickstart): which demo runs where, and that both are valid."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import ROOT, run_cli
from fake_runs import SEEDS, fake_run

from perencode.analysis.verdicts import load_claims
from perencode.commands.figures import make_figures
from perencode.commands.verify import verify_runs
from perencode.common.errors import UserError
from perencode.config import grid
from perencode.config.grid import load_grid
from perencode.quickstart import DEMOS, choose_demo

pytestmark = pytest.mark.forked_children  # the sweep's children as forks (tests/forked.py)


def test_auto_picks_the_gpu_demo_only_where_cuda_is_present():
    assert choose_demo("auto", cuda_available=False).name == "cpu"
    assert choose_demo("auto", cuda_available=True).name == "cuda"
    assert choose_demo("cpu", cuda_available=True).name == "cpu"
    assert choose_demo("cuda", cuda_available=True).device == "cuda"
    with pytest.raises(UserError, match="--device cuda: no CUDA device is available"):
        choose_demo("cuda", cuda_available=False)
    with pytest.raises(UserError, match="expected auto, cpu or cuda"):
        choose_demo("tpu", cuda_available=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_without_cuda_the_cli_chooses_the_cpu_demo(cli, tmp_path, monkeypatch):
    # No recipes/ here nor in the checkout: the chosen demo's grid is reported.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(grid, "CHECKOUT", tmp_path)
    code, text = cli("quickstart", "--device", "auto")
    assert code == 2 and "recipes/quick/quickstart.toml: not found" in text
    code, text = cli("quickstart", "--device", "cuda")
    assert code == 2 and "no CUDA device is available" in text


# The seeds of each demo: the CPU demo's four are what a one-sided Welch test at 95% needs
# to decide its K = 1,024 difference (REPRODUCE.md, "The quick demo").
DEMO_SEEDS = {"cpu": (111, 222, 333, 444), "cuda": SEEDS}


@pytest.mark.parametrize("name", sorted(DEMOS))
def test_demos_are_valid_grids_with_claims(name):
    demo = DEMOS[name]
    grid = load_grid(ROOT / demo.grid)
    seeds = DEMO_SEEDS[name]
    assert len(grid.cells) == 2 * 2 * len(seeds)  # 2 K x 2 encodings x the seeds
    assert {c.recipe.train.seed for c in grid.cells} == set(seeds)
    assert {c.recipe.encoding.kind for c in grid.cells} == {"none", "sinusoidal"}
    assert load_claims(demo.claims)
    if name == "cuda":  # the paper's shapes (Fig. 2, GRU)
        r = grid.cells[0].recipe
        assert (r.model.embed_size, r.model.hidden_size, r.task.length,
                r.train.batch_size, r.optim.lr) == (512, 512, 64, 512, 1e-3)


# Token accuracy and DL distance per (K, encoding, seed): the CPU demo's measured numbers
# (REPRODUCE.md), and for the GPU demo a clear effect of the paper's kind.
DEMO_RESULTS = {
    "cpu": {(32, "none"): [(0.9829, 0.101), (0.9876, 0.074), (0.9811, 0.111), (0.9915, 0.051)],
            (32, "sinusoidal"): [(0.9966, 0.021), (0.9924, 0.043), (0.9902, 0.059),
                                 (0.9933, 0.039)],
            (1024, "none"): [(0.1699, 4.971), (0.1875, 4.847), (0.1689, 4.98), (0.1712, 4.969)],
            (1024, "sinusoidal"): [(0.279, 4.27), (0.2995, 4.173), (0.1963, 4.766),
                                   (0.272, 4.342)]},
    "cuda": {(32, "none"): [(0.99, 0.5), (0.98, 0.6), (0.99, 0.4)],
             (32, "sinusoidal"): [(1.0, 0.0), (1.0, 0.0), (1.0, 0.0)],
             (256, "none"): [(0.40, 20.0), (0.55, 15.0), (0.35, 25.0)],
             (256, "sinusoidal"): [(0.97, 1.0), (0.96, 1.5), (0.98, 0.8)]},
}


def demo_runs(name: str, root: Path, sweep: bool = False,
              iterations: int | None = None) -> Path:
    """Finished runs shaped exactly like the demo's cells, with DEMO_RESULTS' numbers; with
    `sweep`, each with the sweep.json a sweep writes; `iterations`: a copy of the grid
    training every cell for that many iterations."""
    for cell in load_grid(ROOT / DEMOS[name].grid).cells:
        r = cell.recipe
        if iterations:
            r = r.model_copy(update={"train": r.train.model_copy(
                update={"iterations": iterations})})
        acc, dl = DEMO_RESULTS[name][(r.task.vocab_size, r.encoding.kind)][
            DEMO_SEEDS[name].index(r.train.seed)]
        run = fake_run(root, cell.name, recipe=r,
                       metrics={"token_accuracy": acc, "dl_distance": dl, "n_sequences": 1024})
        if sweep:
            (run / "sweep.json").write_text(json.dumps(
                {**cell.record, "name": f"copy{iterations}"} if iterations else cell.record))
    return root


@pytest.mark.parametrize("name", sorted(DEMOS))
def test_every_claim_of_a_demo_reads_its_own_grid(name, tmp_path):
    """Runs shaped exactly like the demo's cells (a tied axis gives K = 32 fewer
    iterations on the CPU) let every claim be decided: none is "not run" because the runs
    differ in a setting the claim does not name. The measured numbers pass every claim
    under the one-sided t-tests: the CPU demo's four seeds decide PE's accuracy lead at
    K = 1,024 (Welch p = 0.014), where its first three alone would not (p = 0.058)."""
    demo = DEMOS[name]
    demo_runs(name, tmp_path / "runs")
    assert verify_runs([tmp_path / "runs"], claims=demo.claims, out=tmp_path) == 0
    report = json.loads((tmp_path / "verify.json").read_text())
    verdicts = {c["id"]: c["verdict"] for c in report["results"]}
    assert verdicts == {c.id: "pass" for c in load_claims(demo.claims)}


@pytest.mark.slow
@pytest.mark.compat
def test_the_cpu_demo_is_one_figure(tmp_path, capsys):
    """K = 32 trains for fewer iterations than K = 1,024 (a tied axis): a setting that
    follows the figure's own axis does not split Fig. 2 into one file per value; a note
    says which setting follows which axis."""
    written = make_figures([demo_runs("cpu", tmp_path / "runs")], out=tmp_path / "figs")
    assert sorted(p.name for p in written if p.name.startswith("fig02")) == \
        ["fig02_reverse_vocabulary__nonpaper.pdf", "fig02_reverse_vocabulary__nonpaper.png"]
    captured = capsys.readouterr()
    out = " ".join((captured.out + captured.err).split())
    assert "one figure although train.iterations follows vocab_size (32: 1500; 1024: 4000)" \
        in out


@pytest.mark.slow
@pytest.mark.compat
def test_a_folder_splits_its_runs_alike_reached_directly_or_from_its_parent(tmp_path, capsys):
    """runs/x: the CPU demo (iterations tied to K); runs/y: a copy of its grid training
    every cell for 200 iterations. `figures runs` draws x's runs in one file, as `figures
    runs/x` does, and y's in another, each named by the iterations its runs took."""
    demo_runs("cpu", tmp_path / "runs" / "x", sweep=True)
    demo_runs("cpu", tmp_path / "runs" / "y", sweep=True, iterations=200)

    def drawn(path: Path) -> tuple[list[str], str]:
        make_figures([path], out=tmp_path / "figs" / path.name)
        table = pd.read_csv(tmp_path / "figs" / path.name / "results.csv")
        assert len(table) == 16 * (2 if path.name == "runs" else 1)
        captured = capsys.readouterr()
        out = " ".join((captured.out + captured.err).split())
        files = sorted(p.stem for p in (tmp_path / "figs" / path.name).glob("fig02*.png"))
        return files, out

    alone, said = drawn(tmp_path / "runs" / "x")
    assert alone == ["fig02_reverse_vocabulary__nonpaper"]
    assert "one figure although train.iterations follows vocab_size (32: 1500; 1024: 4000)" \
        in said
    both, said = drawn(tmp_path / "runs")
    assert both == ["fig02_reverse_vocabulary__iterations=1500,4000__nonpaper",
                    "fig02_reverse_vocabulary__iterations=200__nonpaper"]
    assert "fig02_reverse_vocabulary__iterations=1500,4000__nonpaper: one figure although " \
        "train.iterations follows vocab_size (32: 1500; 1024: 4000)" in said


@pytest.mark.slow
@pytest.mark.compat
def test_quickstart_writes_report_html_beside_verify_md(tmp_path, monkeypatch):
    """The sweep stands in (finished runs with the demo's numbers); the rest is the command's
    own: verify.md, the figures, and report.html whose top says the settings are a demo's."""
    from perencode import quickstart

    def sweep(grid, out, **options):
        demo_runs("cpu", Path(out) / Path(grid).stem)
        return 0

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(quickstart, "run_sweep", sweep)
    code, text = run_cli("quickstart", "--device", "cpu", "--runs", tmp_path / "runs",
                         "--out", tmp_path / "figs", "--no-progress")
    figs = tmp_path / "figs" / "quickstart"
    assert code == 0 and (figs / "verify.md").is_file(), text
    assert f"report: {figs / 'report.html'}" in " ".join(text.split())
    assert f"figure: {figs / 'fig02_reverse_vocabulary__nonpaper.png'}" in " ".join(text.split())
    page = (figs / "report.html").read_text(encoding="utf-8")
    summary = page.split('<div class="summary">', 1)[1].split("</div>", 1)[0]
    assert "Demo settings: direction, not magnitude" in summary
    assert "fig02_reverse_vocabulary__nonpaper" in page


@pytest.mark.slow
def test_a_report_on_demo_runs_with_the_paper_claims_names_the_claims_that_fit(tmp_path):
    from perencode.commands.report import make_report
    runs = demo_runs("cpu", tmp_path / "runs")
    page = make_report([runs], claims="paper", out=tmp_path / "figs").read_text()
    summary = page.split('<div class="summary">', 1)[1].split("</div>", 1)[0]
    assert "No claim of paper.toml concerns these runs; <b>--claims quick</b> decides 4" \
        in summary
    assert "--claims quick" not in make_report([runs], claims="quick",
                                               out=tmp_path / "figs2").read_text()
