"""`ragspec ingest | list | remove | search`: build, inspect and query the passage index.

The index lives in $RAGSPEC_HOME/index unless --index DIR says otherwise. Results go to stdout
(plain, or JSON with --json); progress bars go to stderr so JSON stays machine-readable. Exit
status: 0 on success, 1 when some input failed (each failure is named), 2 on bad usage.
"""

from __future__ import annotations

import json
import sys
import textwrap
from dataclasses import asdict

import click

from ragspec.commands.common import index_option, json_option, open_store, search_mode_option
from ragspec.retrieval.errors import RetrievalError, UnknownDocumentError
from ragspec.retrieval.readers.limits import size_text
from ragspec.terminal import printable


class _ProgressBar:
    """Turns IngestEvents into a click progress bar over files, on stderr."""

    def __init__(self) -> None:
        self._bar = None

    def __call__(self, event) -> None:  # event: ragspec.retrieval.ingest.IngestEvent
        if event.kind == "waiting":
            _say_waiting()
        elif event.kind == "start":
            self._bar = click.progressbar(
                length=max(event.files_total, 1), label="Ingesting", show_pos=True,
                item_show_func=lambda item: item, file=click.get_text_stream("stderr"),
            )
            self._bar.__enter__()
        elif self._bar is None:
            return
        elif event.kind == "file":
            self._bar.update(0, _short(event.path))
        elif event.kind == "passages":
            self._bar.update(
                0, f"{_short(event.path)} ({event.passages_done}/{event.passages_total} passages)"
            )
        elif event.kind == "done":
            self._bar.update(1, _short(event.path))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None


def _short(path: str | None, width: int = 40) -> str:
    path = printable(path or "")
    return path if len(path) <= width else "..." + path[-(width - 3):]


def _say_waiting() -> None:
    from ragspec.retrieval.lock import WAIT_MESSAGE

    click.echo(WAIT_MESSAGE, err=True)


@click.command("ingest")
@click.argument("paths_", metavar="PATH...", nargs=-1, required=True, type=click.Path())
@index_option
@click.option("--recursive/--no-recursive", default=True, show_default=True,
              help="Descend into sub-folders of folders given as PATH.")
@click.option("--follow-symlinks", is_flag=True,
              help="Follow symbolic links inside folders that point outside them (by default "
                   "they are listed and skipped).")
@click.option("--commit-every", default=100, show_default=True, type=click.IntRange(min=1),
              metavar="N", help="Commit to the index after every N finished files...")
@click.option("--commit-seconds", default=30.0, show_default=True,
              type=click.FloatRange(min=0, min_open=True), metavar="S",
              help="...or after S seconds, whichever comes first.")
@click.option("--ocr/--no-ocr", default=True, show_default=True,
              help="Read pictures and PDF pages without a text layer by OCR (Tesseract); "
                   "also RAGSPEC_OCR=0. RAGSPEC_OCR_MAX_PAGES caps the pages per file (200).")
@json_option
def ingest(paths_: tuple[str, ...], index: str | None, recursive: bool, follow_symlinks: bool,
           commit_every: int, commit_seconds: float, ocr: bool, as_json: bool) -> None:
    """Add files and folders to the index, or bring changed files up to date.

    Supported: PDF, plain text, Markdown, HTML, Word (.docx), PowerPoint (.pptx), Excel (.xlsx),
    CSV, EPUB, OpenDocument (.odt, .odp) and picture (.png, .jpg, .tiff: OCR) files; PDF
    pages without a text layer are read by OCR too. Text files in another
    encoding than UTF-8 (UTF-16, Windows-1252, Shift_JIS, ...) are detected and read, and the
    report names the encoding. Unchanged files are skipped (by content hash); changed files
    replace their old passages. A file that cannot be read is reported and the others are still
    ingested; the exit status is then 1.

    Finished files are committed in batches (--commit-every, --commit-seconds): if the command
    is interrupted, what was committed stays, and running it again finishes the rest. The index
    is locked only while committing; another writer waits for its turn.

    \b
    Limits per file (environment variables; see docs/documents-and-search.md):
      RAGSPEC_MAX_FILE_MB (50), RAGSPEC_MAX_PDF_PAGES (2000), RAGSPEC_MAX_CHARS (10000000),
      RAGSPEC_MAX_UNZIPPED_MB (128), RAGSPEC_MAX_ZIP_RATIO (200)
    """
    from ragspec.retrieval.ingest import ingest_paths
    from ragspec.retrieval.readers import ocr as ocr_settings
    from ragspec.retrieval.readers.limits import IngestLimits

    try:
        limits = IngestLimits.from_env()
        ocr_settings.OcrSettings.from_env()
    except ValueError as exc:  # a RAGSPEC_MAX_* or RAGSPEC_OCR_* setting out of range
        raise click.ClickException(str(exc)) from exc
    store = open_store(index)
    bar = _ProgressBar()
    # For this command only (the chat's uploads run in the same process, with their defaults).
    switches = [(ocr_settings.on_page, ocr_settings.on_page.set(
        lambda done, total, seconds: click.echo(f"OCR: page {done}/{total} ({seconds:.1f} s)",
                                                err=True)))]
    if not ocr:
        switches.append((ocr_settings.turned_off, ocr_settings.turned_off.set(True)))
    try:
        report = ingest_paths(
            list(paths_), store, recursive=recursive, progress=bar, limits=limits,
            commit_every=commit_every, commit_seconds=commit_seconds,
            follow_symlinks=follow_symlinks,
        )
    except RetrievalError as exc:
        raise click.ClickException(printable(str(exc))) from exc
    finally:
        bar.close()
        for variable, token in reversed(switches):
            variable.reset(token)
    if as_json:
        click.echo(json.dumps(report.to_json(), ensure_ascii=False, indent=2))
    else:
        _print_report(report, store)
    if report.failed:
        sys.exit(1)


def _print_report(report, store) -> None:
    from ragspec.retrieval.ingest import SUPPORTED_SUFFIXES, page_ranges

    rows = ([("added", p, _read_as(report, p)) for p in report.added]
            + [("updated", p, _read_as(report, p)) for p in report.updated]
            + [("unchanged", p, "") for p in report.unchanged]
            + [("FAILED", p, f": {printable(why)}") for p, why in report.failed]
            + [("skipped", p, f": {printable(why)}") for p, why in report.links])
    for label, path, note in rows:
        click.echo(f"{label:<10} {printable(path)}{note}")
    for path, pages in report.ocr_pages.items():
        click.echo(f"{printable(path)}: OCR on {page_ranges(pages)}")
    click.echo(
        f"{len(report.added)} added, {len(report.updated)} updated, "
        f"{len(report.unchanged)} unchanged, {len(report.failed)} failed; "
        f"{report.passages_added} new passages. Index {printable(str(store.index_dir))}: "
        f"{len(store.documents())} documents, {store.passage_count()} passages."
    )
    if report.skipped:
        click.echo(
            f"Skipped {len(report.skipped)} file(s) of other types inside folders "
            f"(supported: {', '.join(SUPPORTED_SUFFIXES)})."
        )


def _read_as(report, path: str) -> str:
    encoding = report.encodings.get(path)
    return f" (read as {encoding})" if encoding else ""


@click.command("list")
@index_option
@json_option
def list_cmd(index: str | None, as_json: bool) -> None:
    """List the documents in the index with passage counts, sizes and ingestion times."""
    store = open_store(index, with_embedder=False)
    documents = store.documents()
    if as_json:
        click.echo(json.dumps([asdict(d) for d in documents], ensure_ascii=False, indent=2))
        return
    if not documents:
        click.echo(f"The index in {printable(str(store.index_dir))} is empty; add files with "
                   "`ragspec ingest PATH`.")
        return
    click.echo(f"{'ID':<12}  {'PASSAGES':>8}  {'SIZE':>9}  {'INGESTED (UTC)':<19}  SOURCE")
    for d in documents:
        when = d.ingested_at.replace("T", " ")[:19]
        click.echo(f"{d.doc_id:<12}  {d.passages:>8}  {size_text(d.size_bytes):>9}  {when:<19}  "
                   f"{printable(d.source)}")
    click.echo(f"{len(documents)} documents, {store.passage_count()} passages in "
               f"{printable(str(store.index_dir))}")


@click.command("remove")
@click.argument("docs", metavar="DOC...", nargs=-1, required=True)
@index_option
@json_option
def remove(docs: tuple[str, ...], index: str | None, as_json: bool) -> None:
    """Remove documents (by id, as shown by `ragspec list`, or by path) and their passages."""
    store = open_store(index, with_embedder=False)
    removed, failed = [], []
    try:
        with store.writing(on_wait=_say_waiting):
            for doc in docs:
                try:
                    removed.append(store.remove(doc))
                except UnknownDocumentError as exc:
                    failed.append((doc, str(exc)))
    except RetrievalError as exc:
        raise click.ClickException(printable(str(exc))) from exc
    if as_json:
        click.echo(json.dumps({
            "removed": [asdict(d) for d in removed],
            "failed": [{"doc": doc, "error": error} for doc, error in failed],
        }, ensure_ascii=False, indent=2))
    else:
        for d in removed:
            click.echo(f"removed  {printable(d.source)} ({d.passages} passages)")
        for doc, error in failed:
            click.echo(f"FAILED   {printable(doc)}: {printable(error)}")
    if failed:
        sys.exit(1)


# The line above `search`'s passages: which order they are in, so that similarities out of
# order in hybrid mode read as the ranking they are, not as a bug.
_ORDER = {
    "hybrid": "Ranked by hybrid search: embedding similarity and keyword (BM25) ranks fused "
              "(reciprocal-rank fusion), so a passage that matches the query's words can rank "
              "above a more similar one. --search-mode dense ranks by similarity alone.",
    "dense": "Ranked by embedding similarity (cosine).",
}


@click.command("search")
@click.argument("query", nargs=-1, required=True)
@click.option("-k", "k", type=click.IntRange(min=1), default=4, show_default=True,
              help="How many passages to return.")
@search_mode_option
@index_option
@json_option
def search(query: tuple[str, ...], k: int, search_mode: str, index: str | None,
           as_json: bool) -> None:
    """Show the passages that best match QUERY, with their similarity (cosine), source, page
    and offset. In hybrid mode (the default) they are ordered by the fused ranking of
    similarity and keyword (BM25) ranks, so the similarities need not descend; a line above
    the passages says which order they are in. --json adds "fused" in hybrid mode: the
    reciprocal-rank fusion score the passages are ordered by. An empty or missing index is a
    failed input (exit 1), as for `ask`: a mistyped --index is not an empty result."""
    store = open_store(index, require_documents=True)
    try:
        hits = store.search(" ".join(query), k=k, mode=search_mode)
    except RetrievalError as exc:
        raise click.ClickException(printable(str(exc))) from exc
    if as_json:
        click.echo(json.dumps([
            {"score": round(h.score, 6),
             "fused": round(h.fused, 6) if h.fused is not None else None,
             "text": h.passage.text, "source": h.passage.source,
             "page": h.passage.page, "start": h.passage.start}
            for h in hits
        ], ensure_ascii=False, indent=2))
        return
    click.echo(_ORDER[search_mode])
    click.echo()
    for rank, h in enumerate(hits, start=1):
        page = f" p.{h.passage.page}" if h.passage.page is not None else ""
        fused = f" · fused {h.fused:.4f}" if h.fused is not None else ""
        click.echo(f"[{rank}] similarity {h.score:.3f}{fused}  {printable(h.passage.source)}"
                   f"{page} @{h.passage.start}")
        text = printable(" ".join(h.passage.text.split()))
        click.echo(textwrap.indent(textwrap.fill(text, 96), "    "))
        click.echo()


COMMANDS = [ingest, list_cmd, remove, search]
