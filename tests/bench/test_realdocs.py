"""The question sets over real documents (data/realdocs/) and the script that builds their corpora.

Fast: no model. The sets must load with the benchmark's own loader, meet their minimum counts,
and carry a verbatim answer snippet for every answerable question; where this machine has the
sources, a built corpus must hold every snippet in the text ragspec's loader makes of it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from ragspec.bench import realdocs  # the repository root is on sys.path (pytest's pythonpath)
from ragspec.bench.runner import load_questions

REPO = Path(__file__).resolve().parents[2]
SETS = REPO / "data" / "realdocs"
# (copy, answerable open, unanswerable) each set must at least hold.
MINIMUMS = {"dev": (30, 10, 6), "heldout": (20, 6, 6)}




def _raw(name: str) -> list[dict]:
    lines = (SETS / name / "questions.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _sources(name: str) -> list[dict]:
    return json.loads((SETS / name / "sources.json").read_text(encoding="utf-8"))["sources"]


def _missing_reason(name: str) -> str | None:
    absent = [s["path"] for s in _sources(name) if not Path(s["path"]).is_file()]
    if absent:
        return f"sources of {name} not installed here (e.g. {absent[0]})"
    if any(s["render"] == "man" for s in _sources(name)):
        tools = [t for t in ("man", "col") if shutil.which(t) is None]
        if tools:
            return f"{', '.join(tools)} not installed here"
    return None


def test_there_are_exactly_the_two_sets():
    assert realdocs.set_names() == ["dev", "heldout"]


@pytest.mark.parametrize("name", sorted(MINIMUMS))
def test_question_file_loads_with_the_bench_loader_and_ids_are_unique(name):
    raw = [r for r in _raw(name) if not r.get("unanswerable")]  # the speed bench skips those
    questions = load_questions(SETS / name / "questions.jsonl")
    assert [q.id for q in questions] == [r["id"] for r in raw]
    assert len({q.id for q in questions}) == len(questions)
    assert [q.kind for q in questions] == [r["kind"] for r in raw]


@pytest.mark.parametrize("name", sorted(MINIMUMS))
def test_each_set_meets_its_minimum_counts_per_kind(name):
    raw = _raw(name)
    copy = sum(r["kind"] == "copy" for r in raw)
    open_answerable = sum(r["kind"] == "open" and not r.get("unanswerable") for r in raw)
    unanswerable = sum(bool(r.get("unanswerable")) for r in raw)
    need_copy, need_open, need_unanswerable = MINIMUMS[name]
    assert copy >= need_copy
    assert open_answerable >= need_open
    assert unanswerable >= need_unanswerable


@pytest.mark.parametrize("name", sorted(MINIMUMS))
def test_answerable_questions_name_a_corpus_file_and_a_verbatim_sized_snippet(name):
    files = {s["file"] for s in _sources(name)}
    for r in _raw(name):
        if r.get("unanswerable"):
            assert r["kind"] == "open" and r["answer"] is None, r["id"]
            continue
        assert r["source"] in files, r["id"]
        if r["kind"] == "copy":
            assert isinstance(r["answer"], str), f"{r['id']}: a copy answer is one snippet"
        snippets = realdocs.snippets(r)
        assert 1 <= len(snippets) <= 3, r["id"]
        for snippet in snippets:
            assert 5 <= len(snippet.split()) <= 40, f"{r['id']}: {snippet!r}"


@pytest.mark.parametrize("name", sorted(MINIMUMS))
def test_sources_record_where_each_document_came_from(name):
    for s in _sources(name):
        assert s["render"] in realdocs.RENDERS
        assert s["package"] and s["version"] and s["apt"], s["file"]
        for key in ("source_sha256", "sha256"):
            assert len(s[key]) == 64 and int(s[key], 16) >= 0, (s["file"], key)


def test_list_shows_both_sets_as_json():
    result = CliRunner().invoke(realdocs.cli, ["list", "--json"])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.output)
    assert [entry["set"] for entry in listed] == ["dev", "heldout"]
    assert all(len(entry["sources"]) >= 6 for entry in listed)


@pytest.mark.parametrize("name", sorted(MINIMUMS))
def test_built_corpus_holds_every_snippet_in_the_loaded_text(name, tmp_path):
    reason = _missing_reason(name)
    if reason:
        pytest.skip(reason)
    out = tmp_path / name
    result = CliRunner().invoke(realdocs.cli, ["build", name, str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == sorted(s["file"] for s in _sources(name))
    if result.stderr:
        pytest.skip(f"this machine has other versions of the documents: {result.stderr}")
    assert realdocs.check_snippets(name, out) == []


def _fake_set(root: Path, doc: Path, recorded_sha: str) -> None:
    """A one-source set under root whose source is `doc`, recorded with `recorded_sha`."""
    folder = root / "fake"
    folder.mkdir(parents=True)
    source = {"file": "doc.html", "path": str(doc), "render": "copy", "apt": "fake-docs",
              "package": "fake-docs", "version": "1.0", "source_sha256": recorded_sha,
              "sha256": recorded_sha}
    (folder / "sources.json").write_text(json.dumps({"purpose": "test", "sources": [source]}))
    (folder / "questions.jsonl").write_text(json.dumps(
        {"id": "f1", "question": "What colour is the sky?", "kind": "copy",
         "source": "doc.html", "answer": "the sky over   the harbour is grey"}) + "\n")


def test_build_warns_naming_the_file_when_a_source_changed(tmp_path, monkeypatch):
    doc = tmp_path / "installed.html"
    doc.write_text("<html><body><p>In winter the sky over the\nharbour is grey.</p></body></html>")
    _fake_set(tmp_path / "sets", doc, hashlib.sha256(b"another version").hexdigest())
    monkeypatch.setattr(realdocs, "SETS_DIR", tmp_path / "sets")
    result = CliRunner().invoke(realdocs.cli, ["build", "fake", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "warning: doc.html" in result.stderr and str(doc) in result.stderr
    assert (tmp_path / "out" / "doc.html").read_bytes() == doc.read_bytes()
    # Whitespace differs between the snippet and the page; the check compares normalised text.
    assert realdocs.check_snippets("fake", tmp_path / "out") == []


def test_build_is_silent_when_the_source_matches_its_record(tmp_path, monkeypatch):
    doc = tmp_path / "installed.html"
    doc.write_text("<p>the sky over the harbour is grey</p>")
    _fake_set(tmp_path / "sets", doc, hashlib.sha256(doc.read_bytes()).hexdigest())
    monkeypatch.setattr(realdocs, "SETS_DIR", tmp_path / "sets")
    result = CliRunner().invoke(realdocs.cli, ["build", "fake", str(tmp_path / "out")])
    assert result.exit_code == 0 and result.stderr == "", result.stderr


def test_check_reports_a_snippet_that_is_not_in_the_document(tmp_path, monkeypatch):
    doc = tmp_path / "installed.html"
    doc.write_text("<p>the sea is calm today</p>")
    _fake_set(tmp_path / "sets", doc, hashlib.sha256(doc.read_bytes()).hexdigest())
    monkeypatch.setattr(realdocs, "SETS_DIR", tmp_path / "sets")
    CliRunner().invoke(realdocs.cli, ["build", "fake", str(tmp_path / "out")])
    result = CliRunner().invoke(realdocs.cli, ["check", "fake", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert "f1: snippet not found in doc.html" in result.output


def test_build_exits_1_naming_the_package_when_a_source_is_missing(tmp_path, monkeypatch):
    _fake_set(tmp_path / "sets", tmp_path / "not-installed.html", "0" * 64)
    monkeypatch.setattr(realdocs, "SETS_DIR", tmp_path / "sets")
    result = CliRunner().invoke(realdocs.cli, ["build", "fake", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert "apt-get install -y fake-docs" in result.output
    assert "Traceback" not in result.output


# click already drops ANSI sequences when not on a terminal; a carriage return or a bell in a
# file name would still reach the terminal and overwrite or garble the line.
@pytest.mark.parametrize("stray, shown", [("notes.txt", "notes.txt"),
                                          ("evil\rname\x07", "evil\\rname\\x07")])
def test_build_refuses_a_folder_holding_other_files_and_names_them_safely(
        stray, shown, tmp_path, monkeypatch):
    doc = tmp_path / "installed.html"
    doc.write_text("<p>the sky over the harbour is grey</p>")
    _fake_set(tmp_path / "sets", doc, hashlib.sha256(doc.read_bytes()).hexdigest())
    monkeypatch.setattr(realdocs, "SETS_DIR", tmp_path / "sets")
    out = tmp_path / "out"
    out.mkdir()
    (out / stray).write_text("mine")
    result = CliRunner().invoke(realdocs.cli, ["build", "fake", str(out)])
    assert result.exit_code == 2
    assert shown in result.output
    assert "\r" not in result.output and "\x07" not in result.output


def test_unknown_set_is_a_usage_error(tmp_path):
    result = CliRunner().invoke(realdocs.cli, ["build", "nosuch", str(tmp_path / "out")])
    assert result.exit_code == 2 and not (tmp_path / "out").exists()
    assert "dev, heldout" in result.output


class _Store:
    """Answers every search with fixed hits (search is not what these tests check)."""

    def __init__(self, hits):
        self.hits = hits

    def search(self, query, k):
        return self.hits[:k]


def _hit(text: str, source: Path, start: int, score: float):
    from ragspec.retrieval.records import Hit, Passage

    return Hit(score, Passage(id=f"p{start}", doc_id="d", text=text, source=str(source),
                              page=None, start=start))


def test_recall_ranks_containing_and_overlapping_passages_of_the_right_file_only(tmp_path):
    text = "alpha beta gamma.\n\nThe default level is six, biased towards speed.\n\nomega"
    split = text.index("is six")  # the splitter cut the snippet here
    doc, other = tmp_path / "doc.txt", tmp_path / "other.txt"
    question = {"id": "q", "question": "which level?", "kind": "copy", "source": "doc.txt",
                "answer": "The default level is six, biased towards speed."}
    hits = [_hit(question["answer"], other, 0, 0.9),          # right words, wrong file
            _hit(text[:split], doc, 0, 0.8),                   # first half of the snippet
            _hit(text[split - 20:], doc, split - 20, 0.7)]     # holds the whole snippet
    row = realdocs.rank_question(_Store(hits), question, {"doc.txt": text}, tmp_path, k=3)
    assert (row["contains"], row["overlaps"]) == (3, 2)
    assert row["retrieved"] == ["other.txt", "doc.txt", "doc.txt"] and row["top_score"] == 0.9
    row = realdocs.rank_question(_Store(hits[:2]), question, {"doc.txt": text}, tmp_path, k=2)
    assert (row["contains"], row["overlaps"]) == (0, 2)


def test_recall_summary_counts_hits_per_kind_and_keeps_unanswerable_apart():
    rows = [{"id": "a", "kind": "copy", "top_score": 0.8, "contains": 1, "overlaps": 1},
            {"id": "b", "kind": "copy", "top_score": 0.6, "contains": 3, "overlaps": 2},
            {"id": "c", "kind": "open", "top_score": 0.5, "contains": 0, "overlaps": 0},
            {"id": "d", "kind": "unanswerable", "top_score": 0.3}]
    summary = realdocs.summarise(rows, k=4)
    assert summary["copy"] == {"n": 2, "top_score_median": 0.7, "contains@1": 0.5,
                               "contains@4": 1.0, "overlaps@1": 0.5, "overlaps@4": 1.0}
    assert summary["all"]["n"] == 3 and summary["all"]["contains@4"] == 2 / 3
    assert summary["unanswerable"] == {"n": 1, "top_score_median": 0.3}
