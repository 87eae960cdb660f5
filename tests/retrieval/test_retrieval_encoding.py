"""Text files in other encodings than UTF-8 are read, and say which encoding; binary is not.

Inputs are real documents nobody here wrote: the translated manual pages that Debian's man-db
installs (German, French, Japanese), re-encoded the way other systems save them. A machine
without them skips those tests.
"""

from __future__ import annotations

import gzip
import os
import sys
from pathlib import Path

import pytest
from fakes import HashEmbedder

from ragspec.retrieval.errors import LoadError
from ragspec.retrieval.faiss.store import PassageStore
from ragspec.retrieval.ingest import ingest_paths
from ragspec.retrieval.readers import encoding
from ragspec.retrieval.readers.encoding import SAMPLE_BYTES, decode_text
from ragspec.retrieval.readers.loaders import load_bytes

MAN = Path("/usr/share/man")


def installed_page(lang: str, codec: str) -> str:
    """A translated manual page's source, keeping the lines `codec` can encode."""
    for name in ("apropos.1.gz", "man.1.gz", "whatis.1.gz"):
        path = MAN / lang / "man1" / name
        if path.is_file():
            break
    else:
        pytest.skip(f"no {lang} manual page installed under {MAN}")
    lines = []
    for line in gzip.decompress(path.read_bytes()).decode("utf-8").splitlines(keepends=True):
        try:
            line.encode(codec)
        except UnicodeEncodeError:
            continue
        lines.append(line)
    text = "".join(lines)
    assert sum(ord(c) > 127 for c in text) > 20, "the page should be rich in non-ASCII text"
    return text


def loaded(data: bytes, name: str = "page.txt"):
    (doc,) = load_bytes(data, name)
    return doc.page_content, doc.metadata.get("encoding")


@pytest.mark.parametrize("lang, codec, names", [
    ("de", "cp1252", {"Windows-1252"}),
    ("de", "latin-1", {"Windows-1252", "Latin-1"}),  # the same text in both, for German
    ("ja", "shift_jis", {"Shift_JIS", "Shift_JIS (Windows)"}),
    ("fr", "utf-16", {"UTF-16"}),  # Python writes the byte-order mark, as Windows editors do
    ("fr", "utf-16-be", {"UTF-16"}),
])
def test_text_in_another_encoding_is_read_exactly_and_names_it(lang, codec, names):
    text = installed_page(lang, codec)
    data = text.encode(codec)
    if codec == "utf-16-be":
        data = b"\xfe\xff" + data
    got, name = loaded(data)
    assert got == text.replace("\r\n", "\n")
    assert name in names


def test_windows_line_ends_in_utf16_become_newlines():
    text = installed_page("fr", "utf-16")
    got, _ = loaded(text.replace("\n", "\r\n").encode("utf-16"), "notes.md")
    assert got == text


def test_utf8_and_ascii_never_reach_the_detector(monkeypatch):
    def no_detector(sample):
        raise AssertionError("the detector ran on UTF-8 text")

    monkeypatch.setattr(encoding, "_detect", no_detector)
    german = installed_page("de", "utf-8")
    assert loaded(german.encode("utf-8")) == (german, None)
    assert loaded(b"plain ASCII text\nsecond line\n") == ("plain ASCII text\nsecond line\n", None)
    assert loaded(b"\xef\xbb\xbf" + german.encode("utf-8")) == (german, None)


def _real_binaries() -> list[Path]:
    candidates = [Path(sys.executable).resolve(), Path(os.__file__).with_suffix(".py"),
                  *Path(gzip.__file__).parent.glob("__pycache__/gzip*.pyc")]
    candidates += sorted(MAN.glob("de/man1/*.gz"))[:1]
    return [p for p in candidates if p.is_file() and p.suffix != ".py"]


@pytest.mark.parametrize("kind", ["random bytes", "real binaries"])
def test_binary_data_still_fails(kind):
    blobs = ([os.urandom(n) for n in (64, 4096, 300_000)] if kind == "random bytes"
             else [p.read_bytes()[:400_000] for p in _real_binaries()])
    assert blobs
    for blob in blobs:
        with pytest.raises(LoadError, match="binary|no text encoding"):
            load_bytes(blob, "junk.txt")


def test_a_bad_byte_order_mark_fails_with_a_reason():
    with pytest.raises(LoadError, match="UTF-16 text, though it starts with that byte-order"):
        load_bytes(b"\xff\xfe" + "abc".encode("utf-16-le") + b"\x00\xd8", "x.txt")


def test_detection_sees_a_bounded_sample_around_the_first_non_utf8_byte(monkeypatch):
    """A large file, ASCII for its first megabyte: the sample holds the region where its
    encoding shows, yet stays bounded; the whole file is still decoded."""
    german = installed_page("de", "cp1252")
    ascii_part = "".join(f"line {i} of plain ASCII text before the accents\n"
                         for i in range(25_000))
    text = ascii_part + german * 20
    samples = []
    real = encoding._detect

    def recording(sample):
        samples.append(len(sample))
        return real(sample)

    monkeypatch.setattr(encoding, "_detect", recording)
    got, name = decode_text(text.encode("cp1252"))
    assert (got, name) == (text, "Windows-1252")
    assert samples and max(samples) <= 2 * SAMPLE_BYTES + 1


def test_ingest_reports_the_encoding_it_read(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "handbuch.txt").write_bytes(installed_page("de", "cp1252").encode("cp1252"))
    (folder / "manuel.md").write_bytes(installed_page("fr", "utf-16").encode("utf-16"))
    (folder / "plain.txt").write_text("Plain UTF-8 text about the scheduler.")
    report = ingest_paths([folder], PassageStore.open(tmp_path / "index", HashEmbedder()))
    assert report.ok and len(report.added) == 3
    by_name = {Path(p).name: name for p, name in report.encodings.items()}
    assert by_name == {"handbuch.txt": "Windows-1252", "manuel.md": "UTF-16"}
    listed = {Path(e["path"]).name: e["encoding"] for e in report.to_json()["encodings"]}
    assert listed == by_name


def test_ingest_command_prints_the_encoding_it_read(run, tmp_path):
    page = tmp_path / "handbuch.txt"
    page.write_bytes(installed_page("de", "cp1252").encode("cp1252"))
    result = run("ingest", str(page))
    assert result.exit_code == 0, result.output
    assert f"added      {page} (read as Windows-1252)" in result.output
