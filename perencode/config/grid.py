"""Grid files: a recipe plus axes, expanded into validated cells (`perencode sweep`).

A grid file (`recipes/paper/*.toml`) is a recipe plus axes:

    base = "../gru_vocab256.toml"      # optional: a recipe or another grid, relative to this
                                       # file; the tables below override it key by key
    description = "Fig. 2 (GRU) ..."

    [grid]                             # dotted recipe keys -> lists; the cells are the product
    "task.vocab_size" = [32, 64, 128, 256]
    "encoding.kind" = ["none", "sinusoidal"]
    "train.seed" = [111, 222, 333, 444, 555]
    # keys joined by "+" form one tied axis whose values are lists, one value per key, set
    # together (e.g. a shorter training for the small vocabulary); its directories are named
    # by the first key, and `--only` accepts any of its keys
    # "task.vocab_size+train.iterations" = [[32, 4000], [1024, 12000]]

    [slurm]                            # optional: SlurmConfig (partition, time_min, ...)
    [sweep]                            # optional: after = ["stability"]

Inheritance: each file overrides its base key by key, and a value set in a file holds over
its base's axis of that key (a tied axis loses that key, its other keys still vary; a note
says so), as an axis of the file holds over its own template; `sweep --dry-run --explain`
shows where each value of the cells came from (`Grid.origins`).

Every cell is validated as a Recipe and runs in `OUT/<grid file stem>/<axis>=<value>/...`,
axes in file order with short keys (`vocab_size=256/encoding=none/seed=111`), so the same
grid always maps to the same directories: finished runs are skipped, interrupted ones
resume (`perencode train` does both), and a cell whose exact recipe already finished in
another grid under OUT is linked to that run instead of trained twice.
"""

from __future__ import annotations

import copy
import itertools
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from perencode.common.errors import UserError
from perencode.config.naming import format_value, ordered, short_names
from perencode.config.recipe import (
    SECTIONS,
    Recipe,
    apply_overrides,
    foreign_options,
    parse_value,
    read_toml,
    tomllib,
    validate,
)
from perencode.config.validation import validate_table


class SlurmConfig(BaseModel):
    """The grid's `[slurm]` table (or the CLI's --partition/--time-min/... options)."""

    model_config = ConfigDict(extra="forbid")
    cluster: Literal["slurm", "local", "debug"] = Field(
        "slurm", description="submitit executor: slurm, or local/debug to try the path on "
        "this machine.")
    partition: str | None = Field(None, description="SLURM partition (cluster default if unset).")
    account: str | None = Field(None, description="SLURM account to charge (--account).")
    time_min: int = Field(1440, ge=1, description="Time limit of one job; a run that needs "
                          "longer is requeued and resumes from its checkpoint.")
    gpus_per_job: int = Field(1, ge=0, description="GPUs per job (one run per job).")
    cpus_per_job: int = Field(4, ge=1, description="CPU cores per job (also its torch threads).")
    mem_gb: float | None = Field(None, gt=0, description="Memory per job (cluster default).")
    array_parallelism: int = Field(64, ge=1, description="Jobs of the array running at once.")
    max_requeues: int = Field(30, ge=0, description="Time-outs after which a job is not "
                              "requeued again (preemptions do not count).")
    signal_delay_s: int = Field(90, ge=1, description="Seconds before the time limit at which "
                                "SLURM signals a job to checkpoint and requeue (--signal); "
                                "SLURM may send it up to 60 s earlier, so keep 60 * time_min "
                                "- signal_delay_s above 60.")
    poll_s: float = Field(30.0, gt=0, description="Seconds between two looks at the jobs' "
                          "states (sacct): keep it long on a shared cluster.")
    python: str | None = Field(
        None, description="Command that starts Python in a job (submitit's `python`): e.g. "
        "\"apptainer exec --nv --bind /scratch perencode.sif python\" runs every job inside "
        "the container. Unset: the Python running the sweep.")
    qos: str | None = Field(None, description="SLURM quality of service (--qos).")
    constraint: str | None = Field(None, description="SLURM node features (--constraint), "
                                   "e.g. \"a100\".")
    exclude: str | None = Field(None, description="Nodes not to use (--exclude).")
    setup: list[str] = Field([], description="Shell lines run in each job before Python "
                             "starts, e.g. [\"module load apptainer\"].")
    additional: dict[str, str | int | bool] = Field(
        {}, description="Other sbatch options, name (without --) -> value, e.g. "
        "{ reservation = \"paper\", mail_type = \"FAIL\" }.")

    @model_validator(mode="after")
    def _signal_after_start(self) -> SlurmConfig:
        # SLURM may signal up to 60 s early: a signal before the job's Python has started
        # would kill it instead of requeuing it.
        if self.cluster == "slurm" and 60 * self.time_min - self.signal_delay_s < 60:
            raise ValueError(f"field 'signal_delay_s': {self.signal_delay_s} s before a "
                             f"{self.time_min}-minute limit may signal the job before it has "
                             "started (SLURM signals up to 60 s early); keep 60 * time_min - "
                             "signal_delay_s >= 60")
        return self


def slurm_overrides(items: list[str]) -> dict[str, Any]:
    """`--slurm KEY=VALUE` options (VALUE a TOML literal, a bare word a string) as a dict
    over the grid's [slurm] table; validated with it by the sweep."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in SlurmConfig.model_fields:
            raise UserError(f"--slurm '{item}': expected KEY=VALUE with KEY one of "
                            f"{', '.join(SlurmConfig.model_fields)}")
        out[key.strip()] = parse_value(value.strip())
    return out


class SweepConfig(BaseModel):
    """The grid's `[sweep]` table."""

    model_config = ConfigDict(extra="forbid")
    after: list[Literal["stability"]] = Field(
        [], description="Analyses run on each finished run (`perencode stability RUN`).")


@dataclass
class Cell:
    name: str                 # the run directory below OUT/<grid>: "vocab_size=32/seed=111"
    coords: dict[str, Any]    # axis (dotted key) -> value
    recipe: Recipe
    # What its run remembers of the sweep (RUN_DIR/sweep.json): grid, name, tag, cell, axes
    record: dict[str, Any] = field(default_factory=dict)


@dataclass
class Grid:
    path: Path
    name: str                 # its runs' folder under OUT: the file's stem, @tag with a tag
    description: str
    cells: list[Cell]
    slurm: SlurmConfig
    sweep: SweepConfig
    # dotted key -> where its value comes from: "FILE", "FILE [grid]" or "--set" (a key
    # absent: the recipe's default)
    origins: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # one line each: an inherited axis fixed
    tag: str | None = None    # `sweep --tag`: a second variant of the same grid, named


TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def axis_options(items: list[str]) -> dict[str, list]:
    """`--axis FIELD=V1,V2` options as [grid] axes: the values read as a TOML array (a bare
    word is a string), a tied axis as `a.b+c.d=[1,2],[3,4]`."""
    axes: dict[str, list] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or not text.strip():
            raise UserError(f"--axis '{item}': expected FIELD=V1,V2 (e.g. "
                            "--axis task.vocab_size=32,64)")
        try:
            values = tomllib.loads(f"v = [{text}]")["v"]
        except tomllib.TOMLDecodeError:
            values = [parse_value(v.strip()) for v in text.split(",")]
        if key in axes:
            raise UserError(f"--axis '{item}': {key} is given twice")
        axes[key] = values
    return axes


def _merge(base: dict, top: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _shown(path: Path) -> str:
    """A file as a user names it: relative to the working directory where it lies below."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _layer_keys(data: dict) -> tuple[set[str], set[str]]:
    """(template keys, axis keys) a file's own tables set, as dotted keys."""
    template = {f"{section}.{key}" for section in SECTIONS
                if isinstance(data.get(section), dict) for key in data[section]}
    axes = data.get("grid")
    keys = {k.strip() for axis in axes for k in axis.split("+")} \
        if isinstance(axes, dict) else set()
    return template, keys


def _fix_inherited_axes(base: dict, top: dict, source: str, base_source: str) -> list[str]:
    """Drop from `base`'s [grid] the keys that `top` (a file over it) sets itself: a value
    of its template holds over the base's axis (a note says so), an axis of its own replaces
    the base's (an axis spelt the same is replaced in place by the merge). A tied axis keeps
    its other keys. Returns the notes."""
    axes = base.get("grid")
    if not isinstance(axes, dict):
        return []
    template, own_axes = _layer_keys(top)
    top_grid = top.get("grid")
    top_grid = top_grid if isinstance(top_grid, dict) else {}
    notes, out = [], {}
    for axis, values in axes.items():
        keys = [k.strip() for k in axis.split("+")]
        taken = [k for k in keys if k in template or k in own_axes]
        well_formed = isinstance(values, list) and (len(keys) == 1 or all(
            isinstance(v, list) and len(v) == len(keys) for v in values))
        if axis in top_grid or not taken or not well_formed:
            out[axis] = values  # the merge replaces it, or _axis_groups names the mistake
            continue
        values_set = [f"{k} = {format_value(top[k.split('.')[0]][k.split('.')[1]])}"
                      for k in taken if k not in own_axes]
        varied = [k for k in taken if k in own_axes]
        parts = ([f"sets {' and '.join(values_set)}"] if values_set else []) + \
            ([f"varies {' and '.join(varied)} itself"] if varied else [])
        kept = [i for i, k in enumerate(keys) if k not in taken]
        if any(k not in own_axes for k in taken) or kept:
            rest = "+".join(keys[i] for i in kept)
            notes.append(f"{source} {' and '.join(parts)}, which its base {base_source} "
                         f"varies in the axis '{axis}': {source}'s values hold in every cell"
                         + (f" ({rest} still varies)" if kept else ""))
        if not kept:
            continue
        rows = [tuple(v[i] for i in kept) for v in values]
        unique = list({repr(r): r for r in rows}.values())  # rows left equal: one cell
        out[rest] = [list(r) if len(kept) > 1 else r[0] for r in unique]
    base["grid"] = out
    return notes


def _read_layers(path: Path, chain: tuple[Path, ...] = ()) -> tuple[dict, dict[str, str],
                                                                    list[str]]:
    """The file's TOML merged over its `base` chain, where each key's value came from
    (dotted key -> "FILE" or "FILE [grid]"), and the notes of inherited axes fixed."""
    path = path.resolve()
    if path in chain:
        raise UserError(f"{chain[-1]}: `base` leads back to {path} (a loop)")
    data = read_toml(path)
    base = data.pop("base", None)
    source = _shown(path)
    template, axis_keys = _layer_keys(data)
    own = {**{key: source for key in template}, **{key: f"{source} [grid]" for key in axis_keys}}
    if base is None:
        return data, own, []
    if not isinstance(base, str):
        raise UserError(f"{path}: base: expected a path string, got {base!r}")
    base_path = path.parent / base
    below, origins, notes = _read_layers(base_path, (*chain, path))
    notes += _fix_inherited_axes(below, data, source, _shown(base_path))
    return _merge(below, data), {**origins, **own}, notes


def _check_key(key: str, source: str) -> None:
    section, _, name = key.partition(".")
    if section not in SECTIONS or not name or "." in name:
        raise UserError(f"{source}: [grid] '{key}': axes are section.key with section one of "
                        f"{', '.join(SECTIONS)}")


def _axis_groups(axes: dict[str, Any], source: str) -> list[tuple[tuple[str, ...], list]]:
    """The [grid] table as (keys, rows) per axis, a row holding one value per key: a plain
    axis has one key; a tied axis "a.b+c.d" several, each of its values a list of as many."""
    groups, seen = [], set()
    for axis, values in axes.items():
        keys = tuple(k.strip() for k in axis.split("+"))
        for key in keys:
            _check_key(key, source)
            if key in seen:
                raise UserError(f"{source}: [grid] '{axis}': {key} is already an axis")
            seen.add(key)
        if not isinstance(values, list) or not values:
            raise UserError(f"{source}: [grid] '{axis}': must be a non-empty list of values, "
                            f"got {values!r}")
        if len(keys) == 1:
            rows = [(v,) for v in values]
        else:
            bad = [v for v in values if not isinstance(v, list) or len(v) != len(keys)]
            if bad:
                raise UserError(f"{source}: [grid] '{axis}': each value must be a list of "
                                f"{len(keys)} values, one for each of {', '.join(keys)}; got "
                                f"{bad[0]!r}")
            rows = [tuple(v) for v in values]
        shown = [format_value(row[0]) for row in rows]
        repeated = [v for v, n in Counter(shown).items() if n > 1]
        if repeated:
            raise UserError(f"{source}: [grid] '{axis}': value {repeated[0]} appears twice")
        groups.append((keys, rows))
    return groups


def _set(data: dict, key: str, value: Any) -> None:
    section, _, name = key.partition(".")
    table = data.setdefault(section, {})
    if not isinstance(table, dict):
        raise UserError(f"[{section}] is not a table")
    table[name] = copy.deepcopy(value)


def _select(cells: list[Cell], axes: dict[str, list], only: list[str], source: str) -> list[Cell]:
    """Keep the cells matching every `--only KEY=V1,V2` (KEY: dotted or short axis name)."""
    names = short_names(axes)
    by_name = {**{v: k for k, v in names.items()}, **{k: k for k in axes}}
    for item in only:
        key, sep, values = item.partition("=")
        axis = by_name.get(key.strip())
        if not sep or axis is None:
            raise UserError(f"--only '{item}': expected AXIS=V1,V2 with AXIS one of "
                            f"{', '.join(names.values())} (axes of {source})")
        wanted = {format_value(parse_value(v.strip())) for v in values.split(",")}
        known = {format_value(v) for v in axes[axis]}
        unknown = sorted(wanted - known)
        if unknown:
            raise UserError(f"--only '{item}': {unknown[0]} is not a value of {axis} "
                            f"(values: {', '.join(map(format_value, ordered(axes[axis])))})")
        cells = [c for c in cells if format_value(c.coords[axis]) in wanted]
    return cells


def load_grid(path: str | Path, overrides: list[str] | None = None,
              only: list[str] | None = None, extra_axes: list[str] | None = None,
              tag: str | None = None) -> Grid:
    """Read, expand and validate a grid file; UserError (one line) on any mistake.
    `extra_axes` (`--axis FIELD=V1,V2`) lie over the file as a grid inheriting it would (a
    recipe becomes a grid); `tag` names a variant: its runs go to OUT/<stem>@<tag>."""
    path = Path(path)
    source = str(path)
    if tag is not None and not TAG.fullmatch(tag):
        raise UserError(f"--tag '{tag}': letters, digits, '_', '.' and '-' only (it names "
                        "the runs' folder)")
    data, origins, notes = _read_layers(path)
    if extra_axes:
        extra = {"grid": axis_options(extra_axes)}
        notes += _fix_inherited_axes(data, extra, "--axis", source)
        data = _merge(data, extra)
        origins.update({key: "--axis" for key in _layer_keys(extra)[1]})
    axes = data.pop("grid", None)
    if not isinstance(axes, dict) or not axes:
        raise UserError(f"{source}: no [grid] table of axes (dotted keys -> lists); a single "
                        "recipe runs with `perencode train`, or sweeps with --axis "
                        "FIELD=V1,V2")
    slurm = validate_table(SlurmConfig, data.pop("slurm", {}), source, "slurm")
    sweep = validate_table(SweepConfig, data.pop("sweep", {}), source, "sweep")
    description = data.pop("description", "")
    groups = _axis_groups(axes, source)
    values = {key: [row[i] for row in rows] for keys, rows in groups
              for i, key in enumerate(keys)}
    if overrides:
        for item in overrides:
            key = item.partition("=")[0].strip()
            if key in values:
                raise UserError(f"--set {item}: {key} is an axis of {source}; pick its values "
                                "with --only")
        data = apply_overrides(data, overrides)
        origins.update({item.partition("=")[0].strip(): "--set" for item in overrides})
    names = short_names(values)
    set_keys = [item.partition("=")[0].strip() for item in overrides or []]
    cells: list[Cell] = []
    applied: set[str] = set()
    for combo in itertools.product(*(rows for _, rows in groups)):
        coords = {key: value for (keys, _), row in zip(groups, combo)
                  for key, value in zip(keys, row)}
        name = "/".join(f"{names[keys[0]]}={format_value(row[0])}"
                        for (keys, _), row in zip(groups, combo))
        cell_data = copy.deepcopy(data)
        for key, value in coords.items():
            _set(cell_data, key, value)
        # The grid's shared settings reach the cells whose kinds have them (a state size
        # is the S4D's alone); an axis value is the cell's own and is always checked.
        dropped = [key for key in foreign_options(cell_data) if key not in coords]
        for key in dropped:
            section, _, option = key.partition(".")
            del cell_data[section][option]
        applied.update(key for key in set_keys if key not in dropped)
        # Stable and independent of the free-text description: editing that text must not
        # turn finished runs into "a different recipe".
        cell_data["description"] = f"{path.stem}: {name}"
        cells.append(Cell(name, coords, validate(cell_data, f"{source} [grid] {name}")))
    for item, key in zip(overrides or [], set_keys):
        if key not in applied:
            raise UserError(f"--set {item}: no cell of {source} has this option (it belongs "
                            f"to another task, model or encoding than the grid's)")
    name = f"{path.stem}@{tag}" if tag else path.stem
    for cell in cells:
        cell.record = {"grid": str(path), "name": name, "tag": tag, "cell": cell.name,
                       "axes": {key: format_value(v) for key, v in cell.coords.items()}}
    return Grid(path, name, description, _select(cells, values, only or [], source), slurm,
                sweep, origins, notes, tag)


def explain(grid: Grid) -> list[tuple[str, str, str]]:
    """Where each value of the grid's cells came from: (dotted key, its values over the
    cells, its source: a file, a file's [grid], --set, or "default")."""
    values: dict[str, list[str]] = {}
    for cell in grid.cells:
        for section in SECTIONS:
            for name, value in getattr(cell.recipe, section).model_dump().items():
                seen = values.setdefault(f"{section}.{name}", [])
                if format_value(value) not in seen:
                    seen.append(format_value(value))
    return [(key, ", ".join(shown), grid.origins.get(key, "default"))
            for key, shown in values.items()]


# The checkout this package runs from (an editable install, the tests): its recipes/ is the
# one the commands read, wherever they run.
CHECKOUT = Path(__file__).resolve().parents[2]


def repository_root() -> Path:
    """The folder whose recipes/ the commands read (the paper's grids, the quick demos, the
    Fig. 2 recipe): the checkout this package runs from where it has recipes/paper/, else
    the working directory (a wheel install run in a clone, the container's /work), spelt
    relative ('.') so that the paths printed under it stay as short as before."""
    if CHECKOUT != Path.cwd().resolve() and (CHECKOUT / "recipes" / "paper").is_dir():
        return CHECKOUT
    return Path()


def paper_folder() -> Path | None:
    """recipes/paper/ (`repository_root`), or None where there is none."""
    folder = repository_root() / "recipes" / "paper"
    return folder if folder.is_dir() else None
