"""Real folders hold malformed, hostile and pathological files: each one is that file's failure
(with its reason), its neighbours still land, the index is untouched, and what a file may cost in
memory and time is bounded by IngestLimits."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path
from xml.etree.ElementTree import ParseError

import pytest
from fakes import HashEmbedder, damaged_zip, docx_bomb_bytes, docx_bytes

import ragspec.retrieval.ingest as ingest_module
from ragspec.retrieval.errors import LoadError
from ragspec.retrieval.faiss.store import PassageStore
from ragspec.retrieval.ingest import ingest_paths
from ragspec.retrieval.readers.limits import IngestLimits
from ragspec.retrieval.readers.loaders import load_bytes

CORPUS = Path(__file__).resolve().parents[2] / "data" / "corpus"
_GOOD_DOCX = docx_bytes(["Ferries leave every hour.", "The last one leaves at 23:10."])


@pytest.fixture(scope="module")
def embedder():
    return HashEmbedder()


@pytest.fixture
def store(tmp_path, embedder):
    return PassageStore.open(tmp_path / "index", embedder)


BAD_FILES = {
    # name: (bytes, words the reason must contain)
    "malformed-xml.docx": (docx_bytes(document_xml="<w:document><w:body><w:p>"),
                           "not well-formed XML"),
    "encrypted-part.docx": (damaged_zip(_GOOD_DOCX, "word/document.xml", encrypt=True),
                            "encrypted"),
    "unknown-method.docx": (damaged_zip(_GOOD_DOCX, "word/document.xml", method=99),
                            "compression method 99"),
    "garbled-part.docx": (damaged_zip(_GOOD_DOCX, "word/document.xml", garble=True),
                          "damaged"),
    "entity-bomb.docx": (docx_bytes(document_xml=(
        '<?xml version="1.0"?><!DOCTYPE d [<!ENTITY a "aaaaaaaaaa">'
        '<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]><d>&b;</d>')), "DOCTYPE"),
    "bomb.docx": (docx_bomb_bytes(24 * 2**20), "zip bomb"),
}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_a_bad_file_is_one_failure_with_its_reason_and_the_rest_lands(store, tmp_path, name):
    data, reason = BAD_FILES[name]
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "a-good.md").write_text("The harbour office opens at 7.")
    (folder / name).write_bytes(data)
    (folder / "z-good.docx").write_bytes(_GOOD_DOCX)
    report = ingest_paths([folder], store)
    assert [Path(p).name for p, _ in report.failed] == [name]
    assert reason in report.failed[0][1]
    assert sorted(Path(p).name for p in report.added) == ["a-good.md", "z-good.docx"]
    reopened = PassageStore.open(store.index_dir, store.embedder)
    assert sorted(Path(d.source).name for d in reopened.documents()) == ["a-good.md", "z-good.docx"]


def test_html_with_an_unknown_marked_section_is_read_as_a_browser_reads_it(tmp_path):
    # The stdlib parser (and BeautifulSoup on it) refuse "<![foo[": browsers treat it as a
    # bogus comment up to the next ">".
    docs = load_bytes(b"<p>before <![foo[ hidden ]]> after</p><p>next</p>", "page.html")
    assert docs[0].page_content == "before after\n\nnext"


@pytest.mark.parametrize("error, shown", [
    (KeyError("a parser bug"), "KeyError: 'a parser bug'"),
    (ParseError("mismatched tag"), "xml.etree.ElementTree.ParseError: mismatched tag"),
])
def test_an_unexpected_exception_in_a_parser_is_that_files_failure_with_its_type(
    store, tmp_path, monkeypatch, error, shown
):
    real = ingest_module.load_bytes

    def flaky(data, name, limits=None):
        if Path(name).name == "boom.txt":
            raise error
        return real(data, name, limits)

    monkeypatch.setattr(ingest_module, "load_bytes", flaky)
    (tmp_path / "boom.txt").write_text("anything")
    (tmp_path / "fine.txt").write_text("Tickets are sold on board.")
    report = ingest_paths([tmp_path / "boom.txt", tmp_path / "fine.txt"], store)
    assert report.failed == [(str(tmp_path / "boom.txt"), f"cannot parse the file ({shown})")]
    assert report.added == [str(tmp_path / "fine.txt")]


# -- bounded memory and time ------------------------------------------------------------------


def _peak_mib(fn) -> float:
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak / 2**20


def test_a_docx_bomb_is_refused_before_it_is_inflated():
    bomb = docx_bomb_bytes(64 * 2**20)  # 64 MiB of XML in ~65 KB
    messages = []

    def load():
        with pytest.raises(LoadError, match="would inflate 1,0[0-9][0-9] times") as info:
            load_bytes(bomb, "bomb.docx")
        messages.append(str(info.value))

    peak = _peak_mib(load)
    assert peak < 4, f"refusing the bomb used {peak:.1f} MiB"
    assert "RAGSPEC_MAX_ZIP_RATIO" in messages[0]


def test_a_part_over_the_inflated_size_limit_is_refused_by_its_declared_size():
    limits = IngestLimits(max_unzipped_bytes=2**20, max_zip_ratio=10_000)
    with pytest.raises(LoadError, match=r"would inflate to 8\.0 MiB, over the limit of 1\.0 MiB"):
        load_bytes(docx_bomb_bytes(8 * 2**20), "big.docx", limits)


def test_inflated_text_is_streamed_and_stops_at_the_character_limit():
    # A genuine-looking part (ratio allowed) whose text exceeds the character limit: the
    # parse stops there instead of holding the whole text.
    limits = IngestLimits(max_chars=100_000, max_zip_ratio=10_000)
    bomb = docx_bomb_bytes(16 * 2**20)

    def load():
        with pytest.raises(LoadError, match="more than 100,000 characters.*RAGSPEC_MAX_CHARS"):
            load_bytes(bomb, "long.docx", limits)

    assert _peak_mib(load) < 6


def test_pdf_page_limit_is_checked_before_any_page_is_read(monkeypatch):
    from ragspec.retrieval.readers import pdf_text

    def no_page(*args, **kwargs):
        raise AssertionError("a page was read")

    monkeypatch.setattr(pdf_text, "_read_page", no_page)
    data = (CORPUS / "operations-guide.pdf").read_bytes()
    with pytest.raises(LoadError, match="has 3 pages, over the limit of 2.*RAGSPEC_MAX_PDF_PAGES"):
        load_bytes(data, "guide.pdf", IngestLimits(max_pdf_pages=2))


@pytest.mark.parametrize("name", ["notes.txt", "page.html", "guide.pdf"])
def test_character_limit_applies_to_every_type(name):
    data = {
        "notes.txt": b"word " * 3000,
        "page.html": b"<p>" + b"word " * 3000 + b"</p>",
        "guide.pdf": (CORPUS / "operations-guide.pdf").read_bytes(),
    }[name]
    with pytest.raises(LoadError, match="more than 1,000 characters"):
        load_bytes(data, name, IngestLimits(max_chars=1000))


def test_limits_are_read_from_the_environment_and_checked(monkeypatch):
    monkeypatch.setenv("RAGSPEC_MAX_PDF_PAGES", "7")
    monkeypatch.setenv("RAGSPEC_MAX_CHARS", "5000")
    monkeypatch.setenv("RAGSPEC_MAX_UNZIPPED_MB", "2.5")
    monkeypatch.setenv("RAGSPEC_MAX_ZIP_RATIO", "50")
    limits = IngestLimits.from_env()
    assert (limits.max_pdf_pages, limits.max_chars, limits.max_unzipped_bytes,
            limits.max_zip_ratio) == (7, 5000, int(2.5 * 2**20), 50.0)
    monkeypatch.setenv("RAGSPEC_MAX_PDF_PAGES", "many")
    with pytest.raises(ValueError, match="RAGSPEC_MAX_PDF_PAGES='many' is not a number"):
        IngestLimits.from_env()
    with pytest.raises(ValueError, match=r"max_chars \(RAGSPEC_MAX_CHARS\) must be > 0"):
        IngestLimits(max_chars=0)


def test_deeply_nested_html_loads_in_linear_time():
    # A tree walk that looks at each text's ancestors costs depth^2 (~1 minute at this depth on
    # a 2-core machine); one pass with counters takes well under a second.
    depth = 20_000
    page = ("<div>x " * depth + "</div>" * depth).encode()
    started = time.perf_counter()
    text = load_bytes(page, "deep.html")[0].page_content
    assert time.perf_counter() - started < 10
    assert text.split() == ["x"] * depth


def test_a_long_run_without_whitespace_is_cut_into_bounded_passages(store, tmp_path):
    path = tmp_path / "base64.txt"
    path.write_text("QUJD" * 250_000)  # 1 MB, no whitespace: one giant word
    report = ingest_paths([path], store)
    assert report.added == [str(path)]
    passages = store.passages()
    assert all(len(p.text) <= 200 * 16 for p in passages)
    assert "".join(p.text for p in passages) == path.read_text()  # no overlap inside one word
