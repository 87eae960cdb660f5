"""Loaders: every supported type yields text (PDF per page), every bad file a clear LoadError."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest
from fakes import blank_pdf_bytes, encrypted_pdf_bytes

from ragspec.retrieval.errors import LoadError
from ragspec.retrieval.readers.loaders import SUPPORTED_SUFFIXES, load_file

CORPUS = Path(__file__).resolve().parents[2] / "data" / "corpus"
PDF = CORPUS / "operations-guide.pdf"


def _text(docs) -> str:
    return "\n".join(d.page_content for d in docs)


def test_every_sample_document_loads_with_source_and_page_metadata():
    suffixes = set()
    for path in sorted(CORPUS.iterdir()):
        docs = load_file(path)
        suffixes.add(path.suffix)
        assert docs and all(d.page_content.strip() for d in docs)
        assert all(d.metadata["source"] == str(path) for d in docs)
        pages = [d.metadata["page"] for d in docs]
        if path.suffix == ".pdf":
            assert pages == list(range(1, len(docs) + 1)) and len(docs) >= 3
        else:
            assert pages == [None]
    assert {".pdf", ".txt", ".md", ".html", ".docx"} <= suffixes


def test_pdf_pages_are_numbered_from_one_and_hold_their_own_text():
    docs = load_file(PDF)
    assert "1. Backups" in docs[0].page_content
    assert "3. Monitoring" in docs[1].page_content
    assert "5. Troubleshooting" in docs[2].page_content


def test_html_keeps_visible_text_and_drops_scripts_and_styles():
    text = _text(load_file(CORPUS / "command-reference.html"))
    assert "trackPageView" not in text and "Analytics" not in text
    assert "font-family" not in text
    # Inline elements (<code>) stay inside their sentence instead of breaking it up.
    assert "The lark client sends every command to the daemon's HTTP API." in text
    assert "lark drain --timeout 15m cancels whatever is still running" in text


def test_html_decodes_declared_charset_and_collapses_markup_whitespace(tmp_path):
    page = tmp_path / "p.htm"
    page.write_bytes(
        b'<html><head><meta charset="iso-8859-1"><style>p{}</style></head>'
        b"<body><h1>Caf\xe9</h1><p>one\n   two</p><noscript>hidden</noscript></body></html>"
    )
    assert load_file(page)[0].page_content == "Caf\u00e9\n\none two"


def test_markdown_is_kept_as_written():
    text = _text(load_file(CORPUS / "larkspur-overview.md"))
    assert text.startswith("# Larkspur: an overview")
    assert "`lark logs --tail 200`" in text


def test_docx_paragraphs_are_separated_by_one_blank_line():
    text = _text(load_file(CORPUS / "release-notes.docx"))
    assert "Version 3.0.0 (released 9 September 2025)" in text
    assert "\n\n\n" not in text


def test_unsupported_type_names_the_supported_ones(tmp_path):
    path = tmp_path / "picture.bmp"
    path.write_bytes(b"BM....")
    with pytest.raises(LoadError, match="unsupported type '.bmp'; supported are") as info:
        load_file(path)
    assert all(suffix in str(info.value) for suffix in SUPPORTED_SUFFIXES)


def test_binary_junk_named_txt_is_rejected(tmp_path):
    path = tmp_path / "junk.txt"
    path.write_bytes(os.urandom(4096))
    with pytest.raises(LoadError, match="not text: no text encoding explains these bytes"):
        load_file(path)


def test_nul_bytes_that_decode_as_utf8_are_still_binary(tmp_path):
    path = tmp_path / "zeros.txt"
    path.write_bytes(b"\x00" * 2000 + b"some words")
    with pytest.raises(LoadError, match="binary data"):
        load_file(path)


def test_utf8_byte_order_mark_is_not_part_of_the_text(tmp_path):
    path = tmp_path / "bom.md"
    path.write_bytes("\ufeff# Title\n\nBody.".encode())
    assert load_file(path)[0].page_content == "# Title\n\nBody."


def test_whitespace_only_file_has_no_extractable_text(tmp_path):
    path = tmp_path / "blank.txt"
    path.write_text("  \n\n\t \n")
    with pytest.raises(LoadError, match="no extractable text"):
        load_file(path)


@pytest.mark.parametrize("kind", ["garbage", "truncated"])
def test_corrupt_pdf_is_reported_as_unreadable(tmp_path, kind):
    path = tmp_path / f"{kind}.pdf"
    data = PDF.read_bytes()
    path.write_bytes(b"%PDF-1.4\n" + os.urandom(3000) if kind == "garbage" else data[: len(data) // 2])
    with pytest.raises(LoadError, match="not a readable PDF"):
        load_file(path)


def test_encrypted_pdf_says_it_is_password_protected(tmp_path):
    path = tmp_path / "secret.pdf"
    path.write_bytes(encrypted_pdf_bytes(str(PDF)))
    with pytest.raises(LoadError, match="encrypted .password protected.*qpdf --decrypt"):
        load_file(path)


def test_pdf_encrypted_with_empty_user_password_opens_like_any_pdf(tmp_path):
    # "Protected" PDFs that only restrict printing/copying open without a password anywhere.
    path = tmp_path / "owner-only.pdf"
    path.write_bytes(encrypted_pdf_bytes(str(PDF), user_password=""))
    assert "1. Backups" in load_file(path)[0].page_content


def test_pdf_of_blank_pages_says_no_extractable_text_and_nothing_for_ocr(tmp_path):
    path = tmp_path / "scan.pdf"
    path.write_bytes(blank_pdf_bytes(pages=2))
    with pytest.raises(LoadError, match="no extractable text in 2 page.*no pictures either"):
        load_file(path)


def test_corrupt_docx_is_reported(tmp_path):
    not_zip = tmp_path / "a.docx"
    not_zip.write_bytes(b"this is not a zip file")
    wrong_zip = tmp_path / "b.docx"
    with zipfile.ZipFile(wrong_zip, "w") as z:
        z.writestr("hello.txt", "not a word document")
    for path in (not_zip, wrong_zip):
        with pytest.raises(LoadError, match="not a valid .docx"):
            load_file(path)
