"""Dependencies point one way: the app -> models -> decoding; the app -> retrieval; both ->
ragspec.fileio, ragspec.paths and ragspec.cpuinfo (leaves).

Read from the source (every import statement of every module, also those inside functions), so
a lazy import cannot hide a dependency:
  * ragspec.decoding (the engine) imports no other part of ragspec but itself and the leaves,
    and neither LangChain nor FAISS (the engine is torch only);
  * ragspec.models (loading and formats) imports only itself, the engine and the leaves;
  * ragspec.retrieval imports no other part of ragspec but itself and the leaves;
  * the leaves (ragspec.fileio: file writes; ragspec.paths: where the data directory is;
    ragspec.cpuinfo: what the CPU can do) import nothing from ragspec;
  * only ragspec.web imports streamlit;
  * no two modules import each other (a pair that does is one module in two files);
  * nothing in ragspec imports the repository's benchmarks/, scripts/ or tests/, and no test
    imports a benchmark script (what both need is a module of the package);
  * the benchmarks import from tests/ only its helpers, tests/support/, and by their full name
    (`from tests.support.format_fakes import ...`, never a bare `format_fakes` put on sys.path),
    so the arrows stay benchmarks -> tests/support -> ragspec and a test module is never one;
  * no package folder holds more than MAX_MODULES modules (a folder names one job).
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ragspec"
LEAF = "ragspec.fileio"
LEAVES = (LEAF, "ragspec.paths", "ragspec.cpuinfo")
# layer -> the ragspec modules it may import (itself included)
ALLOWED = {
    "ragspec.decoding": ("ragspec.decoding", *LEAVES),
    "ragspec.models": ("ragspec.models", "ragspec.decoding", *LEAVES),
    "ragspec.retrieval": ("ragspec.retrieval", *LEAVES),
    LEAF: (),
    "ragspec.paths": (),
    "ragspec.cpuinfo": (),
}
# the repository's folders that are not the package: nothing in the package may need them
OUTSIDE = ("benchmarks", "scripts", "tests")
MAX_MODULES = 20
FORBIDDEN_THIRD_PARTY = {"ragspec.decoding": ("langchain", "langchain_core",
                                              "langchain_community", "faiss")}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str, root: Path) -> bool:
    """True when `name` is a module or package of the ragspec tree at `root` (not a function
    or class that `from X import name` brought in)."""
    path = root.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, absolute name) of everything the file imports: for `from X import y`, both X and
    X.y (y may be a submodule: `from ragspec import web`)."""
    module = module_name(path, root)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against this module's package
                anchor = package.rsplit(".", node.level - 1)[0]
                base = f"{anchor}.{node.module}" if node.module else anchor
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def layer_of(module: str) -> str | None:
    for layer in ALLOWED:
        if module == layer or module.startswith(layer + "."):
            return layer
    return None


def violations(root: Path = PACKAGE) -> list[str]:
    """One line per import statement that goes against the direction."""
    bad: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        module = module_name(path, root)
        layer = layer_of(module)
        for line, name in imports(path, root):
            where = f"{path.relative_to(root.parent)}:{line}"
            top = name.split(".")[0]
            if top == "streamlit" and not module.startswith("ragspec.web"):
                why = "only ragspec.web may import streamlit"
            elif top in OUTSIDE:
                why = f"the package must not import the repository's {top}/"
            elif layer and top in FORBIDDEN_THIRD_PARTY.get(layer, ()):
                why = f"{layer} must not depend on it"
            elif (layer and top == "ragspec" and name != "ragspec" and is_module(name, root)
                  and not any(name == ok or name.startswith(ok + ".") for ok in ALLOWED[layer])):
                why = (f"{layer} may import only {', '.join(ALLOWED[layer])}" if ALLOWED[layer]
                       else f"{layer} must import nothing from ragspec")
            else:
                continue
            bad.setdefault(where, f"{where} imports {name} ({why})")
    return list(bad.values())


def module_edges(root: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the ragspec modules it imports (any import statement, lazy ones too)."""
    edges: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        module = module_name(path, root)
        for _, name in imports(path, root):
            if name.startswith("ragspec.") and name != module and is_module(name, root):
                edges.setdefault(module, set()).add(name)
    return edges


def test_the_source_follows_the_dependency_direction():
    assert violations() == []


def with_import(tmp_path: Path, module: str, source: str) -> Path:
    """A copy of the package with `source` added to `module` (created if new)."""
    copy = tmp_path / "ragspec"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / module
    target.write_text((target.read_text() + "\n" if target.exists() else "") + source)
    return copy


# module the import is added to | the import (backslash-n: a line break) | what the report says
AGAINST = """
decoding/bad.py    | from ragspec.retrieval.faiss.store import PassageStore   | may import only
decoding/bad.py    | def f():\\n    import ragspec.pipeline               | may import only
decoding/bad.py    | from .. import loading                             | may import only
decoding/bad.py    | from ragspec import web                            | may import only
decoding/engine.py | import faiss                                       | must not depend on it
decoding/bad.py    | from langchain_core.documents import Document      | must not depend on it
retrieval/bad.py   | from ragspec.decoding.types import Span            | may import only
retrieval/bad.py   | from ragspec.commands import common                | may import only
retrieval/bad.py   | from ..bench import runner                         | may import only
models/bad.py      | from ragspec.retrieval import errors               | may import only
models/bad.py      | from ragspec import pipeline                       | may import only
bench/bad.py       | from benchmarks import kernel_bench                | must not import
serve/bad.py       | def f():\\n    import tests.support.fakes           | must not import
fileio.py          | from ragspec.retrieval import errors               | nothing from ragspec
bench/bad.py       | import streamlit as st                             | only ragspec.web
search.py          | from streamlit import session_state                | only ragspec.web
"""


def table(text: str) -> list[tuple[str, ...]]:
    rows = [tuple(cell.strip() for cell in line.split("|")) for line in text.strip().splitlines()]
    return [(module, source.replace("\\n", "\n") + "\n", *rest) for module, source, *rest in rows]


@pytest.mark.parametrize("module, source, reason", table(AGAINST))
def test_an_import_against_the_direction_is_caught(tmp_path, module, source, reason):
    found = violations(with_import(tmp_path, module, source))
    assert len(found) == 1 and reason in found[0], found


@pytest.mark.parametrize("module, source", [
    ("decoding/ok.py", "from ragspec.decoding.types import Span\nfrom . import ngram\n"),
    ("decoding/ok.py", "from ragspec.fileio import write_atomically\n"),
    ("models/ok.py", "from ragspec.decoding import native_step\nfrom . import hub\n"),
    ("retrieval/ok.py", "from ragspec.fileio import fsync_dir\nfrom .errors import LoadError\n"),
    ("web/ok.py", "import streamlit\nfrom ragspec.decoding import engine\n"),
    ("pipeline.py", "from ragspec.retrieval.faiss.store import PassageStore\n"),
])
def test_imports_along_the_direction_pass(tmp_path, module, source):
    assert violations(with_import(tmp_path, module, source)) == []


def import_cycles(root: Path = PACKAGE) -> list[list[str]]:
    """Groups of ragspec modules that import each other, directly or round a longer circle
    (every import counts, lazy ones too): strongly connected parts of the import graph."""
    graph: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        module = module_name(path, root)
        targets = graph.setdefault(module, set())
        for _, name in imports(path, root):
            if name.split(".")[0] == "ragspec" and name != module and is_module(name, root):
                targets.add(name)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_no_modules_import_each_other():
    assert import_cycles() == []


def test_a_circle_of_imports_is_caught(tmp_path):
    copy = with_import(tmp_path, "pipeline.py", "def f():\n    import ragspec.remote\n")
    assert ["ragspec.pipeline", "ragspec.remote"] in import_cycles(copy)
    copy = with_import(tmp_path / "b", "retrieval/milvus/location.py",
                       "def f():\n    from ragspec.retrieval import backends\n")
    assert any({"ragspec.retrieval.backends", "ragspec.retrieval.milvus.location"} <= set(c)
               for c in import_cycles(copy))


TESTS = Path(__file__).resolve().parent


def script_imports(root: Path = TESTS) -> list[str]:
    """One line per import of a benchmark script (benchmarks/, scripts/) in the test suite."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(root)}:{node.lineno} imports {name}" for name in names
                      if name.split(".")[0] in ("benchmarks", "scripts")]
    return found


def test_no_test_imports_a_benchmark_script():
    assert script_imports() == []


def test_a_test_that_imports_a_benchmark_script_is_caught(tmp_path):
    (tmp_path / "test_x.py").write_text("def test_x():\n    from benchmarks import replay\n")
    assert script_imports(tmp_path) == ["test_x.py:2 imports benchmarks"]


BENCHMARKS = TESTS.parent / "benchmarks"


def benchmark_test_imports(root: Path = BENCHMARKS, tests: Path = TESTS) -> list[str]:
    """One line per import of the test suite by a benchmark that is not of tests/support/ by
    its full name: a test module, or a helper imported bare off a sys.path entry."""
    helpers = {p.stem for p in (tests / "support").glob("*.py")}
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            for name in names:
                parts = name.split(".")
                if parts[0] == "tests" and parts[1:2] != ["support"]:
                    why = "only tests/support/ is for benchmarks"
                elif parts[0] in helpers:
                    why = f"import it as tests.support.{parts[0]}"
                else:
                    continue
                found.append(f"{path.relative_to(root.parent)}:{node.lineno} imports {name} ({why})")
    return found


def test_benchmarks_import_only_the_tests_helpers_by_their_full_name():
    assert benchmark_test_imports() == []


@pytest.mark.parametrize("source, reason", [
    ("from format_fakes import pptx_bytes", "import it as tests.support.format_fakes"),
    ("import fakes", "import it as tests.support.fakes"),
    ("from tests.retrieval import test_loaders_formats", "only tests/support/"),
    ("import tests.conftest", "only tests/support/"),
])
def test_a_benchmark_importing_a_test_or_a_bare_helper_is_caught(tmp_path, source, reason):
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "x.py").write_text(
        f"from tests.support.format_fakes import xlsx_bytes\ndef main():\n    {source}\n")
    found = benchmark_test_imports(tmp_path / "benchmarks")
    assert len(found) == 1 and "benchmarks/x.py:3" in found[0] and reason in found[0], found


def crowded(root: Path = PACKAGE) -> list[str]:
    """The package folders holding more than MAX_MODULES modules."""
    return [f"{folder.relative_to(root.parent)}: {n} modules"
            for folder in sorted({root, *(p.parent for p in root.rglob("__init__.py"))})
            if (n := len(list(folder.glob("*.py")))) > MAX_MODULES]


def test_no_package_folder_holds_more_than_its_share_of_modules(tmp_path):
    assert crowded() == []
    copy = tmp_path / "ragspec"
    (copy / "big").mkdir(parents=True)
    for i in range(MAX_MODULES + 1):
        (copy / "big" / f"m{i}.py").write_text("")
    (copy / "big" / "m0.py").rename(copy / "big" / "__init__.py")
    assert crowded(copy) == [f"ragspec/big: {MAX_MODULES + 1} modules"]
