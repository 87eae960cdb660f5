"""ingest_paths: every bad input is reported for its file, the others still land, and the
previous index is intact afterwards; folders, names and the size limit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fakes import HashEmbedder, blank_pdf_bytes, encrypted_pdf_bytes

from ragspec.retrieval.faiss.store import PassageStore
from ragspec.retrieval.ingest import IngestEvent, default_max_file_bytes, ingest_paths

CORPUS = Path(__file__).resolve().parents[2] / "data" / "corpus"
PDF = CORPUS / "operations-guide.pdf"


@pytest.fixture(scope="module")
def embedder():
    return HashEmbedder()


@pytest.fixture
def store(tmp_path, embedder):
    """A store that already holds one document, so 'the previous index' is not empty."""
    path = tmp_path / "index"
    good = tmp_path / "existing.txt"
    good.write_text("The existing document mentions job_timeout, which defaults to 2h.")
    assert ingest_paths([good], PassageStore.open(path, embedder)).ok
    return PassageStore.open(path, embedder)


def _assert_previous_index_intact(store, embedder):
    reopened = PassageStore.open(store.index_dir, embedder)
    assert [Path(d.source).name for d in reopened.documents()][:1] == ["existing.txt"]
    assert reopened.search("job_timeout default")[0].passage.source.endswith("existing.txt")


BAD_INPUTS = {
    "empty file": ("empty.txt", lambda p: p.write_bytes(b""), "the file is empty"),
    "binary junk named .txt": ("junk.txt", lambda p: p.write_bytes(os.urandom(2048)),
                               "no text encoding explains these bytes"),
    "corrupt pdf": ("broken.pdf", lambda p: p.write_bytes(PDF.read_bytes()[:1500]),
                    "not a readable PDF"),
    "encrypted pdf": ("locked.pdf", lambda p: p.write_bytes(encrypted_pdf_bytes(str(PDF))),
                      "encrypted"),
    "pdf without text layer": ("scan.pdf", lambda p: p.write_bytes(blank_pdf_bytes()),
                               "no extractable text"),
    "unsupported type": ("slides.key", lambda p: p.write_bytes(b"PK\x03\x04"),
                         "unsupported type '.key'"),
    "nonexistent path": ("missing.md", lambda p: None, "no such file or directory"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_fails_alone_with_a_reason_and_the_index_survives(
    case, store, embedder, tmp_path
):
    name, make, reason = BAD_INPUTS[case]
    bad = tmp_path / name
    make(bad)
    good = tmp_path / "good.md"
    good.write_text("# Good\n\nThis file is fine and mentions retry_base_delay.")
    report = ingest_paths([str(bad), str(good)], store)
    assert [path for path, _ in report.failed] == [str(bad)]
    assert reason in report.failed[0][1]
    assert report.added == [str(good)] and not report.ok
    _assert_previous_index_intact(store, embedder)
    assert len(PassageStore.open(store.index_dir, embedder).documents()) == 2


def test_huge_file_is_refused_by_size_before_it_is_read(store, embedder, tmp_path, monkeypatch):
    huge = tmp_path / "huge.txt"
    with open(huge, "wb") as f:  # sparse: 51 MiB on paper, nothing on disk
        f.truncate(51 * 2**20)
    real_read = Path.read_bytes

    def read_bytes(self):
        assert self != huge, "the huge file was read"
        return real_read(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    report = ingest_paths([huge], store)  # default limit: 50 MiB
    assert report.failed == [
        (str(huge), "the file is 51.0 MiB, over the size limit of 50.0 MiB; split it, or raise "
                    "the limit with RAGSPEC_MAX_FILE_MB")
    ]
    _assert_previous_index_intact(store, embedder)


def test_size_limit_is_configurable_by_argument_and_environment(store, tmp_path, monkeypatch):
    small = tmp_path / "small.txt"
    small.write_text("x " * 600)  # 1200 bytes
    assert "over the size limit of 1000 bytes" in ingest_paths(
        [small], store, max_file_bytes=1000
    ).failed[0][1]
    monkeypatch.setenv("RAGSPEC_MAX_FILE_MB", "0.001")
    assert default_max_file_bytes() == 1048
    assert ingest_paths([small], store).failed
    monkeypatch.setenv("RAGSPEC_MAX_FILE_MB", "lots")
    with pytest.raises(ValueError, match="RAGSPEC_MAX_FILE_MB='lots' is not a number"):
        ingest_paths([small], store)


@pytest.mark.parametrize("name", ["notes with spaces.md", "ünïcødé 日本語 notes.txt", "a'b\"c.md"])
def test_names_with_spaces_and_non_ascii_are_ingested_listed_and_removable(store, tmp_path, name):
    path = tmp_path / name
    path.write_text("Namespaces hold at most 500 schedules by default.", encoding="utf-8")
    report = ingest_paths([path], store)
    assert report.added == [str(path)] and report.ok
    [info] = [d for d in store.documents() if d.source == str(path.resolve())]
    reopened = PassageStore.open(store.index_dir, store.embedder)
    assert reopened.search("500 schedules")[0].passage.source == str(path.resolve())
    assert reopened.remove(str(path)).doc_id == info.doc_id


def test_folders_are_walked_skipping_hidden_and_other_types(store, tmp_path):
    root = tmp_path / "tree"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "top.md").write_text("Top level.")
    (root / "sub" / "mid.txt").write_text("Middle level.")
    (root / "sub" / "deeper" / "low.html").write_text("<p>Lowest level.</p>")
    (root / "sub" / "image.bmp").write_bytes(b"\x89PNG")
    (root / ".git" / "config.txt").write_text("hidden")
    (root / ".hidden.md").write_text("hidden")

    flat = ingest_paths([root], store, recursive=False)
    assert flat.added == [str(root / "top.md")] and flat.ok
    deep = ingest_paths([root], store)
    # Stable order: each folder's files (sorted), then its sub-folders (sorted).
    assert deep.added == [str(root / "sub" / "mid.txt"), str(root / "sub" / "deeper" / "low.html")]
    assert deep.unchanged == [str(root / "top.md")]
    assert deep.skipped == [str(root / "sub" / "image.bmp")] and deep.ok


def test_the_same_file_named_twice_is_ingested_once(store, tmp_path):
    path = tmp_path / "twice.txt"
    path.write_text("Only once.")
    report = ingest_paths([path, tmp_path / "." / "twice.txt", tmp_path], store)
    assert report.added == [str(path)]


def test_progress_reports_start_each_file_passages_and_outcome(store, tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "a.txt").write_text("Word. " * 600)
    (tmp_path / "p" / "b.txt").write_bytes(b"")
    events: list[IngestEvent] = []
    ingest_paths([tmp_path / "p"], store, progress=events.append)
    assert events[0] == IngestEvent("start", 0, 2)
    assert [e.kind for e in events if e.kind != "passages"] == [
        "start", "file", "done", "file", "done", "commit"
    ]
    passages = [e for e in events if e.kind == "passages"]
    assert passages and passages[-1].passages_done == passages[-1].passages_total > 1
    assert [e.outcome for e in events if e.kind == "done"] == ["added", "failed"]
    assert events[-1].files_done == events[-1].files_total == 2


def test_json_report_has_exactly_the_documented_keys(store, tmp_path):
    report = ingest_paths([tmp_path / "nope.txt"], store)
    assert report.to_json() == {
        "added": [], "updated": [], "unchanged": [],
        "failed": [{"path": str(tmp_path / "nope.txt"), "error": "no such file or directory"}],
        "links_not_followed": [], "encodings": [], "ocr_pages": [],
    }


def test_ingest_requires_an_embedder(tmp_path):
    with pytest.raises(ValueError, match="opened with an embedder"):
        ingest_paths([tmp_path], PassageStore.open(tmp_path / "i"))
