"""A full disk under the index or RAGSPEC_HOME: each command that writes ends with one line that
names the file or index, the cause and what to do, exit status 1, and every file of the
previous state is as it was (no temporary or pending file left). A real 2 MiB tmpfs where the
test may mount one (root), else ENOSPC injected (full_disk.py). HashEmbedder, no torch."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from fakes import HashEmbedder
from full_disk import snapshot

import ragspec.loading as loading
from ragspec.cli import main

CORPUS = Path(__file__).resolve().parents[2] / "data" / "corpus"
FULL = "the disk is full (no space left on device); free some space there"


@pytest.fixture
def disk(disk, tmp_path, monkeypatch):
    """The full-able disk (tests/support/full_disk.py), with the hash embedder and a home."""
    monkeypatch.setattr(loading, "cached_embedder", lambda name: HashEmbedder())
    monkeypatch.setenv("RAGSPEC_HOME", str(tmp_path / "home"))
    return disk


def run(*args: str, stdin: str | None = None):
    # catch_exceptions=False: a traceback fails the test instead of becoming exit status 1
    return CliRunner().invoke(main, list(args), input=stdin, catch_exceptions=False)


def one_error_line(result) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: ") and "\n" not in last
    return last


def test_an_ingest_whose_pdf_layout_does_not_fit_says_so_and_changes_nothing(disk):
    index = disk.root / "index"
    assert run("ingest", "--index", str(index), str(CORPUS / "faq.md")).exit_code == 0
    disk.fill()
    before = snapshot(disk.root)
    line = one_error_line(run("ingest", "--index", str(index), str(CORPUS / "operations-guide.pdf")))
    assert f"could not write {index / 'layouts'}" in line and FULL in line
    assert snapshot(disk.root) == before
    assert not (index / "layouts").exists()  # not even the folder it made for the layout
    disk.free()
    assert run("ingest", "--index", str(index), str(CORPUS)).exit_code == 0


@pytest.mark.parametrize("change", ["remove", "append"])
def test_a_commit_that_does_not_fit_leaves_the_previous_index_and_no_pending_file(disk, change):
    index = disk.root / "index"
    kept = [str(CORPUS / "faq.md"), str(CORPUS / "larkspur-overview.md")]
    assert run("ingest", "--index", str(index), *kept).exit_code == 0
    hits = run("search", "--index", str(index), "quota", "--json").stdout
    disk.fill()
    before = snapshot(disk.root)
    if change == "remove":  # a full rewrite of the index
        result = run("remove", "--index", str(index), str((CORPUS / "faq.md").resolve()))
    else:  # an appending commit
        result = run("ingest", "--index", str(index), str(CORPUS / "configuration-reference.txt"))
    line = one_error_line(result)
    assert f"Could not save the index in {index}: {FULL}" in line
    assert "previous index is unchanged" in line
    assert snapshot(disk.root) == before  # no index.faiss.new, keywords.npz.new, append bytes
    assert run("search", "--index", str(index), "quota", "--json").stdout == hits


def test_account_changes_on_a_full_home_say_so_and_keep_the_accounts(disk, monkeypatch):
    monkeypatch.setenv("RAGSPEC_HOME", str(disk.root))
    added = run("users", "add", "ann", "--password-stdin", stdin="a-long-password\n")
    assert added.exit_code == 0, added.output
    disk.fill()
    before = snapshot(disk.root)
    for args, stdin in ((("users", "add", "bob", "--password-stdin"), "a-long-password\n"),
                        (("users", "key", "ann"), None),
                        (("users", "set", "ann", "--max-queued", "3"), None)):
        line = one_error_line(run(*args, stdin=stdin))
        assert f"could not write {disk.root / 'accounts.json'}: {FULL}" in line
        assert snapshot(disk.root) == before
