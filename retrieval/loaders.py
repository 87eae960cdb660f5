"""Turn one file into text, through LangChain's document loaders.

Contract: `load_file(path)` returns LangChain `Document`s whose `page_content` is the text that
passages are cut from and whose metadata holds `source` (the path as a string) and `page`
(1-based page number for PDFs, None for every other type). Passage offsets are character
offsets into exactly this text, so it is the reference for provenance. Anything that stops a
file from yielding usable text raises `LoadError` with a sentence a user can act on; the caller
(ingest) reports it for that file and carries on with the others.

Per type:
- .pdf: PyPDFLoader (pypdf), one Document per page; pages without text are dropped but keep
  their numbers; a PDF without any text layer is an error (it needs OCR first).
- .txt, .md, .markdown: TextLoader, UTF-8 (a BOM is dropped). Markdown stays as written: its
  markup is part of what users quote, and parsing it would need the heavy `unstructured` stack.
- .html, .htm: BSHTMLLoader with the stdlib parser, after removing script, style, noscript and
  template elements; blank runs are collapsed so blocks become paragraphs.
- .docx: Docx2txtLoader.
"""

from __future__ import annotations

import logging
import re
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from langchain_community.document_loaders import BSHTMLLoader, Docx2txtLoader, TextLoader
from langchain_core.documents import Document

from retrieval.errors import LoadError

SUPPORTED_SUFFIXES: tuple[str, ...] = (
    ".pdf", ".txt", ".md", ".markdown", ".html", ".htm", ".docx",
)

# Elements whose text is never content a reader sees.
_INVISIBLE_HTML = ("script", "style", "noscript", "template")
# Elements a browser renders as separate blocks: they become paragraphs of the text.
_BLOCK_HTML = [
    "p", "div", "section", "article", "header", "footer", "nav", "aside", "main", "h1", "h2",
    "h3", "h4", "h5", "h6", "li", "ul", "ol", "dl", "dt", "dd", "pre", "blockquote", "table",
    "tr", "figure", "figcaption", "title", "hr", "form", "fieldset", "address", "details",
    "summary",
]

# Share of control characters (other than tab/newline/CR/form feed) above which decoded "text"
# is really binary data that happened to be valid UTF-8 (runs of NUL bytes are).
_MAX_CONTROL_SHARE = 0.01
_WHITESPACE = re.compile(r"\s+")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f]")


def supported(path: Path) -> bool:
    return path.suffix.lower() in SUPPORTED_SUFFIXES


def unsupported_message(path: Path) -> str:
    kind = f"'{path.suffix}'" if path.suffix else "(no extension)"
    return f"unsupported type {kind}; supported are {', '.join(SUPPORTED_SUFFIXES)}"


def load_file(path: str | Path) -> list[Document]:
    """Load one file into Documents (see module docstring); raises LoadError."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        raise LoadError(unsupported_message(path))
    if suffix == ".pdf":
        docs = _load_pdf(path)
    elif suffix in (".html", ".htm"):
        docs = _load_html(path)
    elif suffix == ".docx":
        docs = _load_docx(path)
    else:
        docs = _load_text(path)
    for doc in docs:
        doc.metadata = {"source": str(path), "page": doc.metadata.get("page")}
    if not any(doc.page_content.strip() for doc in docs):
        raise LoadError("no extractable text: the file contains no words")
    return [doc for doc in docs if doc.page_content.strip()]


def _load_pdf(path: Path) -> list[Document]:
    from langchain_community.document_loaders import PyPDFLoader
    from pypdf.errors import FileNotDecryptedError, PdfReadError, PdfStreamError, WrongPasswordError

    try:
        with _quiet("pypdf"):
            pages = PyPDFLoader(str(path), mode="page").load()
    except (FileNotDecryptedError, WrongPasswordError) as exc:
        raise LoadError(
            "the PDF is encrypted (password protected); save an unprotected copy "
            "(e.g. `qpdf --decrypt in.pdf out.pdf`) and ingest that"
        ) from exc
    except (PdfReadError, PdfStreamError) as exc:
        raise LoadError(f"not a readable PDF (damaged or truncated?): {exc}") from exc
    except Exception as exc:  # noqa: BLE001
        # pypdf raises many unrelated types on malformed files (ValueError, KeyError,
        # AttributeError, ...); any of them means "this PDF is broken", and one broken file
        # must not stop the ingest of the others.
        raise LoadError(f"not a readable PDF (damaged?): {type(exc).__name__}: {exc}") from exc
    if not any(page.page_content.strip() for page in pages):
        raise LoadError(
            f"no extractable text in {len(pages)} page(s): the PDF has no text layer "
            "(scanned images?); run OCR on it (e.g. `ocrmypdf in.pdf out.pdf`) and ingest the result"
        )
    for page in pages:
        # LangChain numbers pages from 0; people (and PDF viewers) from 1.
        page.metadata["page"] = int(page.metadata.get("page", 0)) + 1
    return pages


@contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    """Silence a library's warnings ("EOF marker not found", ...) while it parses one file:
    we report a failure ourselves, in one sentence, and they would clutter `ragspec ingest`."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _load_text(path: Path) -> list[Document]:
    try:
        docs = TextLoader(str(path), encoding="utf-8-sig").load()
    except RuntimeError as exc:
        if isinstance(exc.__cause__, UnicodeDecodeError):
            raise LoadError(
                "not UTF-8 text (binary data, or text in another encoding: convert it to UTF-8)"
            ) from exc
        raise LoadError(f"cannot read the file: {exc.__cause__ or exc}") from exc
    for doc in docs:
        _reject_binary(doc.page_content)
    return docs


def _reject_binary(text: str) -> None:
    if text and len(_CONTROL.findall(text)) > _MAX_CONTROL_SHARE * len(text):
        raise LoadError("looks like binary data, not text (many control characters)")


class _VisibleTextHTMLLoader(BSHTMLLoader):
    """BSHTMLLoader minus what browsers do not show, with the line breaks they do show.

    BSHTMLLoader calls get_text() on the whole soup, which keeps JavaScript and CSS and either
    glues blocks together or splits every inline element onto its own line. Here invisible
    elements are removed, whitespace inside text is collapsed as a browser does (except in
    <pre>), and block elements become paragraphs. The file is read as bytes so BeautifulSoup
    can honour the page's own charset declaration.
    """

    def __init__(self, file_path: str) -> None:
        # The stdlib parser: no lxml dependency for a job this small.
        super().__init__(file_path, bs_kwargs={"features": "html.parser"})

    def lazy_load(self) -> Iterator[Document]:
        from bs4 import BeautifulSoup, NavigableString

        with open(self.file_path, "rb") as f:
            soup = BeautifulSoup(f, **self.bs_kwargs)
        for element in soup(list(_INVISIBLE_HTML)):
            element.decompose()
        title = soup.title.get_text(strip=True) if soup.title else ""
        for string in soup.find_all(string=True):
            if type(string) is NavigableString and string.find_parent("pre") is None:
                string.replace_with(_WHITESPACE.sub(" ", string))
        for element in soup.find_all(_BLOCK_HTML):
            element.insert_before("\n\n")
            element.insert_after("\n\n")
        for br in soup.find_all("br"):
            br.replace_with("\n")
        text = _tidy_lines(soup.get_text())
        yield Document(page_content=text, metadata={"source": str(self.file_path), "title": title})


def _tidy_lines(text: str) -> str:
    """Strip each line and keep at most one blank line between blocks."""
    out: list[str] = []
    for line in (line.strip() for line in text.splitlines()):
        if line or (out and out[-1]):
            out.append(line)
    return "\n".join(out).strip()


def _load_html(path: Path) -> list[Document]:
    try:
        docs = _VisibleTextHTMLLoader(str(path)).load()
    except (OSError, ValueError) as exc:
        raise LoadError(f"cannot read the HTML file: {exc}") from exc
    for doc in docs:
        _reject_binary(doc.page_content)
    return docs


def _load_docx(path: Path) -> list[Document]:
    try:
        docs = Docx2txtLoader(str(path)).load()
    except (zipfile.BadZipFile, KeyError) as exc:
        raise LoadError(
            "not a valid .docx file (Word 2007 or later); re-save it as .docx"
        ) from exc
    for doc in docs:
        # docx2txt leaves several blank lines between paragraphs.
        doc.page_content = re.sub(r"\n\s*\n\s*\n+", "\n\n", doc.page_content).strip()
    return docs
