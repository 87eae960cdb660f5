"""A reader can trace every figure: the "Done when" list of the documentation, checked.

Read from the files themselves, not from a list kept by hand:
  * README.md stays at most README_LINES lines (the rest lives in docs/);
  * every link from README.md or a docs/ page into docs/results/ names one file (no glob, no
    folder) that exists, and so does every `docs/results/NAME` that benchmarks/README.md or a
    page names in its text (a command's --out, the table of which script feeds which page);
  * every file in docs/results/ is linked from README.md or a docs/ page (a results file that
    no page cites is stale: delete it);
  * every results file is a JSON object naming the command, the commit and the machine that
    produced it (benchmarks/record.py writes them so), or a Markdown record of something done
    by hand (a walk-through) whose first lines say the same as `Command:`, `Commit:` and
    `Machine:` lines.
Which figure of a page needs which file is for a reader to judge; these checks catch the
mechanical half: a link that points nowhere, to many files, or a file that nothing points to.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_LINES = 250
RECORD_KEYS = ("command", "commit", "machine")
MD_HEAD_LINES = 15  # a Markdown record names them as "Command: ..." lines this near its top
# a markdown link's target: [text](target) or [text](target "title")
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)")
# docs/results/NAME (or results/NAME from a docs page) written in the text
NAMED = re.compile(r"(?<![\w/.-])(?:docs/)?results/[\w.*?{\[/-]*")
GLOB = set("*?[{")


def pages(root: Path) -> list[Path]:
    """README.md and every page under docs/ (the pages a reader reads)."""
    return [p for p in [root / "README.md", *sorted((root / "docs").rglob("*.md"))] if p.is_file()]


def results_links(page: Path) -> list[tuple[str, Path]]:
    """(as written, the file it resolves to) for every markdown link from `page` into results/."""
    found = []
    for match in LINK.finditer(page.read_text()):
        target = match.group(1).split("#")[0]
        if "results/" in target and "://" not in target:
            found.append((match.group(1), (page.parent / target).resolve()))
    return found


def broken_links(root: Path = ROOT) -> list[str]:
    """One line per link into docs/results/ that is a glob, a folder or names no file."""
    bad = []
    for page in pages(root):
        for written, target in results_links(page):
            where = f"{page.relative_to(root)}: ({written})"
            if GLOB & set(written):
                bad.append(f"{where} is a glob: link each file")
            elif not target.is_file():
                bad.append(f"{where} names no file")
    return bad


def broken_names(root: Path = ROOT) -> list[str]:
    """One line per `docs/results/NAME` in a page's or benchmarks/README.md's text that is a
    glob or names no file (a results file renamed or deleted under a command that writes it)."""
    bad = []
    for page in [*pages(root), root / "benchmarks" / "README.md"]:
        if not page.is_file():
            continue
        for match in NAMED.finditer(page.read_text()):
            written = match.group(0).rstrip(".")
            if written.endswith("/"):
                continue  # the folder itself, named in prose
            base = root / "docs" if not written.startswith("docs/") else root
            where = f"{page.relative_to(root)}: {written}"
            if GLOB & set(written):
                bad.append(f"{where} is a glob: name each file")
            elif not (base / written).is_file():
                bad.append(f"{where} names no file")
    return sorted(set(bad))


def uncited(root: Path = ROOT) -> list[str]:
    """The files in docs/results/ that no link from README.md or a docs/ page points to."""
    cited = {target for page in pages(root) for _, target in results_links(page)}
    return [f"docs/results/{f.name} is cited by no page" for f in
            sorted((root / "docs" / "results").glob("*")) if f.is_file() and f.resolve() not in cited]


def unrecorded(root: Path = ROOT) -> list[str]:
    """The results files that do not name their command, commit and machine."""
    bad = []
    for path in sorted((root / "docs" / "results").glob("*")):
        if path.suffix == ".md":
            head = path.read_text().splitlines()[:MD_HEAD_LINES]
            missing = [k for k in RECORD_KEYS if not any(
                line.lower().startswith(f"{k}:") and line[len(k) + 1:].strip() for line in head)]
            if missing:
                bad.append(f"docs/results/{path.name} names no {', '.join(missing)} in its "
                           f"first {MD_HEAD_LINES} lines")
            continue
        try:
            data = json.loads(path.read_text())
        except (UnicodeDecodeError, ValueError) as error:
            bad.append(f"docs/results/{path.name} is not JSON ({error})")
            continue
        missing = [k for k in RECORD_KEYS if not isinstance(data, dict) or not data.get(k)]
        if missing:
            bad.append(f"docs/results/{path.name} names no {', '.join(missing)}")
    return bad


def long_readme(root: Path = ROOT) -> list[str]:
    """README.md when it is longer than README_LINES lines."""
    lines = len((root / "README.md").read_text().splitlines())
    return [f"README.md has {lines} lines (at most {README_LINES})"] if lines > README_LINES else []


def test_the_readme_stays_short():
    assert long_readme() == []


def test_every_link_into_the_results_names_one_existing_file():
    assert broken_links() == []
    assert broken_names() == []


def test_every_results_file_is_cited_and_names_its_command_commit_and_machine():
    assert uncited() == []
    assert unrecorded() == []


RECORD = {"command": "python benchmarks/x.py", "commit": "abc1234", "machine": "a CPU", "runs": []}


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A README, one page and one results file, all in order."""
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "docs" / "results" / "a.json").write_text(json.dumps(RECORD))
    (tmp_path / "docs" / "page.md").write_text("Measured: 3 ms ([file](results/a.json)).\n")
    (tmp_path / "README.md").write_text("[a](docs/results/a.json)\n")
    (tmp_path / "benchmarks" / "README.md").write_text("| x.py | `docs/results/a.json` |\n")
    return tmp_path


def test_a_site_in_order_passes(site):
    assert (long_readme(site), broken_links(site), broken_names(site), uncited(site),
            unrecorded(site)) == ([], [], [], [], [])


@pytest.mark.parametrize("link, reason", [
    ("results/gone.json", "names no file"),
    ("results/*.json", "is a glob"),
    ("results/", "names no file"),
])
def test_a_link_to_no_file_or_to_many_is_caught(site, link, reason):
    page = site / "docs" / "page.md"
    page.write_text(page.read_text() + f"Also ([more]({link})).\n")
    found = broken_links(site)
    assert len(found) == 1 and reason in found[0] and link in found[0], found


def test_a_results_file_named_in_the_text_that_does_not_exist_is_caught(site):
    (site / "benchmarks" / "README.md").write_text("| y.py | `docs/results/renamed.json` |\n")
    assert broken_names(site) == ["benchmarks/README.md: docs/results/renamed.json names no file"]


def test_a_results_file_no_page_cites_is_caught(site):
    (site / "docs" / "results" / "stale.json").write_text(json.dumps(RECORD))
    assert uncited(site) == ["docs/results/stale.json is cited by no page"]


def test_a_results_file_without_its_command_commit_or_machine_is_caught(site):
    (site / "docs" / "results" / "a.json").write_text(json.dumps({"command": "x", "rows": []}))
    assert unrecorded(site) == ["docs/results/a.json names no commit, machine"]


def test_a_markdown_record_names_its_command_commit_and_machine_at_its_top(site):
    record = site / "docs" / "results" / "walk.md"
    record.write_text("# A walk-through\n\nCommand: `make demo`\nMachine: a CPU\n\nSteps.\n")
    assert unrecorded(site) == [f"docs/results/walk.md names no commit in its first "
                                f"{MD_HEAD_LINES} lines"]
    record.write_text("# A walk-through\n\nCommand: `make demo`\nCommit: abc1234\n"
                      "Machine: a CPU\n\nSteps.\n")
    assert unrecorded(site) == []


def test_a_readme_one_line_too_long_is_caught(site):
    (site / "README.md").write_text("line\n" * README_LINES)
    assert long_readme(site) == []
    (site / "README.md").write_text("line\n" * (README_LINES + 1))
    assert long_readme(site) == [f"README.md has {README_LINES + 1} lines (at most {README_LINES})"]
