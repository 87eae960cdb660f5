"""Benchmark question sets over real documents installed on this machine (data/realdocs/).

Usage:  PYTHONPATH=. python -m ragspec.bench.realdocs list [--json]
        PYTHONPATH=. python -m ragspec.bench.realdocs build dev OUT_DIR
        PYTHONPATH=. python -m ragspec.bench.realdocs check dev OUT_DIR [--json]
        PYTHONPATH=. python -m ragspec.bench.realdocs recall dev OUT_DIR [-k 4] [--index DIR] [--json]
        PYTHONPATH=. python -m ragspec.bench.realdocs record dev

A set is a folder data/realdocs/SET holding `sources.json` (which installed files make the
corpus, how each is turned into a corpus file, and the sha256 and Debian package version they
had when the questions were written) and `questions.jsonl` (the questions `ragspec bench`
reads, each with the corpus file and a verbatim snippet that holds its answer). The documents
themselves are never stored in the repository: `build` makes the corpus folder from this
machine's files.

Source kinds ("render"):
  copy  the installed file, byte for byte (the Python documentation's HTML pages);
  man   a manual page rendered to plain text: `man --nh --nj -l -P cat PATH | col -bx` with
        MANWIDTH=100 and LC_ALL=C.UTF-8 (no hyphenation or justification, so words stay whole).

Checks: `build` compares each source's sha256 with the recorded one (a difference is a warning
naming the file: another version of the documents, whose snippets may have moved; the build
completes) and stops with exit 1, naming the package to install, when a source is missing.
`check` finds every answer snippet in the text ragspec's loader makes of its file (whitespace
collapsed). `recall` ingests the corpus with ragspec's ingest and searches each question with
ragspec's search: a hit is a top-k passage of the right file that *contains* the snippet, or
(second rule) *overlaps* its place in the loaded text, which also counts snippets the splitter
cut in two. `record` rewrites a set's hashes and package versions from this machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import click

from ragspec.terminal import printable

REPO = Path(__file__).resolve().parents[2]
SETS_DIR = REPO / "data" / "realdocs"
RENDERS = ("copy", "man")
# Rendering settings are part of a man source's identity: another width reflows every line, and
# a user's MANOPT/MANROFFOPT or kept formatting would change the text, so those are dropped.
MAN_ENV = {"MANWIDTH": "100", "LC_ALL": "C.UTF-8"}
MAN_ENV_DROPPED = ("MANOPT", "MANROFFOPT", "MAN_KEEP_FORMATTING", "MANPAGER", "PAGER")
MAN_TOOLS = {"man": "man-db", "col": "bsdextrautils"}
MAN_PACKAGES = ("man-db", "groff-base", "bsdextrautils")  # recorded: they shape the rendered text


@dataclass(frozen=True)
class Source:
    """One corpus file: `file` (its name in the corpus) made from `path` on this machine."""

    file: str
    path: str
    render: str
    apt: str
    package: str = ""
    version: str = ""
    source_sha256: str = ""
    sha256: str = ""

    def __post_init__(self) -> None:
        if self.render not in RENDERS:
            raise ValueError(f"source {self.file!r}: render must be one of {RENDERS}, "
                             f"got {self.render!r}")
        if not self.file or Path(self.file).name != self.file:
            raise ValueError(f"source file name {self.file!r} must be a plain file name")


def set_names() -> list[str]:
    return sorted(p.parent.name for p in SETS_DIR.glob("*/sources.json"))


def set_dir(name: str) -> Path:
    if name not in set_names():
        raise click.UsageError(f"no set named {name!r}; sets: {', '.join(set_names())}")
    return SETS_DIR / name


def read_set(name: str) -> tuple[dict, list[Source]]:
    """The set's sources.json as (its header fields, its sources)."""
    meta = json.loads((set_dir(name) / "sources.json").read_text(encoding="utf-8"))
    try:
        sources = [Source(**entry) for entry in meta.pop("sources")]
    except (KeyError, TypeError, ValueError) as exc:
        raise click.ClickException(
            f"data/realdocs/{name}/sources.json is malformed: {exc}") from exc
    return meta, sources


def read_questions(name: str) -> list[dict]:
    path = set_dir(name) / "questions.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def snippets(question: dict) -> list[str]:
    """The answer snippets of a question: one string, a list of them, or none (null)."""
    answer = question.get("answer")
    if answer is None:
        return []
    return [answer] if isinstance(answer, str) else list(answer)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def render(source: Source) -> bytes:
    """The corpus file's bytes, made from the installed source (see the module docstring)."""
    path = Path(source.path)
    if source.render == "copy":
        return path.read_bytes()
    env = {k: v for k, v in os.environ.items() if k not in MAN_ENV_DROPPED} | MAN_ENV
    man = subprocess.run(["man", "--nh", "--nj", "-l", "-P", "cat", str(path)],
                         capture_output=True, env=env, check=False)
    if man.returncode != 0 or not man.stdout.strip():
        raise click.ClickException(f"man could not render {path}: "
                                   f"{man.stderr.decode(errors='replace').strip()}")
    # col -bx removes the overstrike sequences of bold and underline and expands tabs.
    col = subprocess.run(["col", "-bx"], input=man.stdout, capture_output=True, env=env,
                         check=False)
    if col.returncode != 0:
        raise click.ClickException(f"col could not clean the rendering of {path}: "
                                   f"{col.stderr.decode(errors='replace').strip()}")
    return col.stdout


def require_sources(sources: list[Source]) -> None:
    """Exit 1 naming what to install when a source or a rendering tool is missing here."""
    missing = sorted({s.apt for s in sources if not Path(s.path).is_file()})
    if any(s.render == "man" for s in sources):
        missing += sorted(pkg for tool, pkg in MAN_TOOLS.items() if shutil.which(tool) is None)
    if missing:
        absent = [s.path for s in sources if not Path(s.path).is_file()]
        where = f" ({len(absent)} source file(s) absent, e.g. {absent[0]})" if absent else ""
        raise click.ClickException(
            f"missing on this machine{where}: install with `apt-get install -y "
            f"{' '.join(dict.fromkeys(missing))}`")


def build_set(name: str, out_dir: Path) -> list[str]:
    """Write the set's corpus into out_dir; returns the warnings (hash differences)."""
    _, sources = read_set(name)
    require_sources(sources)
    out_dir.mkdir(parents=True, exist_ok=True)
    ours = {s.file for s in sources}
    strangers = sorted(p.name for p in out_dir.iterdir() if p.name not in ours)
    if strangers:
        # ingest takes the whole folder: a stray file would change every measurement.
        shown = ", ".join(printable(n) for n in strangers[:3])
        raise click.UsageError(f"{printable(str(out_dir))} holds files that are not part of "
                               f"set {name!r} ({shown}); use an empty folder")
    warnings = []
    for source in sources:
        data = render(source)
        (out_dir / source.file).write_bytes(data)
        if sha256_hex(Path(source.path).read_bytes()) != source.source_sha256:
            warnings.append(f"{source.file}: {source.path} differs from the recorded version "
                            f"({source.package} {source.version}); answers may have moved")
        elif sha256_hex(data) != source.sha256:
            warnings.append(f"{source.file}: rendered text differs from the recorded one "
                            "(another man-db/groff version?); answers may have moved")
    return warnings


def dpkg_owner(path: str) -> tuple[str, str]:
    """(package, version) that installed `path`, following symlinks to the real file."""
    real = os.path.realpath(path)
    found = subprocess.run(["dpkg", "-S", real], capture_output=True, text=True, check=False)
    if found.returncode != 0:
        return "", ""
    package = found.stdout.split(":", 1)[0].strip()
    return package, package_version(package)


def package_version(package: str) -> str:
    return subprocess.run(["dpkg-query", "-W", "-f=${Version}", package],
                          capture_output=True, text=True, check=False).stdout.strip()


def whitespace_pattern(snippet: str) -> re.Pattern:
    """Matches the snippet in a text whatever the whitespace between its words."""
    return re.compile(r"\s+".join(re.escape(word) for word in snippet.split()))


def loaded_texts(corpus: Path, files: list[str]) -> dict[str, str]:
    """The text ragspec's loader makes of each corpus file (what passages are cut from)."""
    from ragspec.retrieval.readers.loaders import load_file

    return {name: "\n\n".join(d.page_content for d in load_file(corpus / name))
            for name in files}


def check_snippets(name: str, corpus: Path) -> list[str]:
    """Problems with the set's questions against the built corpus; empty when all is well."""
    _, sources = read_set(name)
    texts = loaded_texts(corpus, [s.file for s in sources])
    problems = []
    for q in read_questions(name):
        if q.get("unanswerable"):
            continue
        if q.get("source") not in texts:
            problems.append(f"{q['id']}: source {q.get('source')!r} is not a file of the set")
            continue
        for snippet in snippets(q):
            if not whitespace_pattern(snippet).search(texts[q["source"]]):
                problems.append(f"{q['id']}: snippet not found in {q['source']}: {snippet[:60]!r}")
    return problems


def first_rank(hits, source_path: str, spans: list[tuple[int, int]],
               snippet: str) -> tuple[int, int]:
    """1-based rank of the first hit that contains the snippet, and of the first that overlaps
    one of its places (spans) in the loaded text; 0 when none does."""
    flat = " ".join(snippet.split())
    contains = overlaps = 0
    for rank, hit in enumerate(hits, 1):
        p = hit.passage
        if p.source != source_path:
            continue
        if not contains and flat in " ".join(p.text.split()):
            contains = rank
        end = p.start + len(p.text)
        if not overlaps and any(p.start < stop and start < end for start, stop in spans):
            overlaps = rank
    return contains, overlaps


def measure_recall(name: str, corpus: Path, k: int, index: Path | None = None) -> dict:
    """Ingest the corpus (into `index`, or a temporary one) and rank every question's snippets."""
    from ragspec.loading import open_store
    from ragspec.retrieval.ingest import ingest_paths

    _, sources = read_set(name)
    texts = loaded_texts(corpus, [s.file for s in sources])
    with tempfile.TemporaryDirectory(prefix="realdocs-index-") as scratch:
        store = open_store(index or scratch)
        report = ingest_paths([corpus], store)
        if report.failed:
            raise click.ClickException(f"ingest failed for {report.failed[0][0]}: "
                                       f"{report.failed[0][1]}")
        rows = [rank_question(store, q, texts, corpus, k) for q in read_questions(name)]
        passages = store.passage_count()
    return {"set": name, "k": k, "passages": passages, "questions": rows,
            "summary": summarise(rows, k)}


def rank_question(store, q: dict, texts: dict[str, str], corpus: Path, k: int) -> dict:
    """One question's search: where its snippets rank (0: not in the top k), the files
    retrieved and the best score (for unanswerable questions only the latter two)."""
    return rank_hits(q, store.search(q["question"], k=k), texts, corpus)


def question_kind(q: dict) -> str:
    """copy / open; "unanswerable" (the documents lack the answer); "task" for a request with
    no answer snippet that is not marked unanswerable (write a poem, suggest names)."""
    if q.get("unanswerable"):
        return "unanswerable"
    return (q.get("kind") or "copy") if snippets(q) else "task"


def rank_hits(q: dict, hits, texts: dict[str, str], corpus: Path) -> dict:
    """rank_question for hits already retrieved (best first)."""
    kind = question_kind(q)
    row = {"id": q["id"], "kind": kind,
           "top_score": round(hits[0].score, 4) if hits else None,
           "retrieved": [Path(h.passage.source).name for h in hits]}
    if kind in ("unanswerable", "task"):
        return row
    path = str((corpus / q["source"]).resolve())
    ranks = []
    for snippet in snippets(q):
        spans = [m.span() for m in whitespace_pattern(snippet).finditer(texts[q["source"]])]
        if not spans:
            raise click.ClickException(f"{q['id']}: snippet not in {q['source']}; "
                                       "run `check` first")
        ranks.append(first_rank(hits, path, spans, snippet))
    # An open question with several snippets counts as found when any of them is.
    row["contains"], row["overlaps"] = (min((r[i] for r in ranks if r[i]), default=0)
                                        for i in (0, 1))
    return row


def summarise(rows: list[dict], k: int) -> dict:
    """Per kind: how many, the median best score, and recall@1/@k by both rules."""
    answerable = [r for r in rows if "contains" in r]
    groups = {kind: [r for r in rows if r["kind"] == kind] for kind in ("copy", "open")}
    groups |= {"all": answerable, "unanswerable": [r for r in rows if r["kind"] == "unanswerable"]}
    out = {}
    for kind, chosen in groups.items():
        if not chosen:
            continue
        scores = [r["top_score"] for r in chosen if r["top_score"] is not None]
        out[kind] = {"n": len(chosen),
                     "top_score_median": statistics.median(scores) if scores else None}
        for rule in ("contains", "overlaps") if kind != "unanswerable" else ():
            ranks = [r[rule] for r in chosen]
            out[kind][f"{rule}@1"] = sum(r == 1 for r in ranks) / len(ranks)
            out[kind][f"{rule}@{k}"] = sum(r >= 1 for r in ranks) / len(ranks)
    return out


@click.group()
def cli() -> None:
    """Question sets over real documents installed on this machine (data/realdocs/)."""


@cli.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON to stdout.")
def list_cmd(as_json: bool) -> None:
    """Show the sets, their purpose, and each source with whether it is present here."""
    sets = []
    for name in set_names():
        meta, sources = read_set(name)
        questions = read_questions(name)
        sets.append({"set": name, **meta, "questions": len(questions), "sources": [
            {**vars(s), "present": Path(s.path).is_file()} for s in sources]})
    if as_json:
        click.echo(json.dumps(sets, indent=2))
        return
    for entry in sets:
        click.echo(f"{entry['set']}: {entry.get('purpose', '')} — {entry['questions']} questions, "
                   f"{len(entry['sources'])} sources")
        for s in entry["sources"]:
            state = "" if s["present"] else "   MISSING (apt-get install " + s["apt"] + ")"
            click.echo(f"  {s['file']:<18} {s['render']:<5} {s['path']}  "
                       f"[{s['package']} {s['version']}]{state}")


@cli.command("build")
@click.argument("name", metavar="SET")
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
def build_cmd(name: str, out_dir: Path) -> None:
    """Make SET's corpus folder OUT_DIR from this machine's files."""
    try:
        warnings = build_set(name, out_dir)
    except OSError as exc:
        raise click.ClickException(f"cannot build {name} into {out_dir}: {exc}") from exc
    for line in warnings:
        click.echo(f"warning: {line}", err=True)
    click.echo(f"built {name} into {out_dir} ({len(read_set(name)[1])} files, "
               f"{len(warnings)} warning(s))")


@cli.command("check")
@click.argument("name", metavar="SET")
@click.argument("corpus", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON to stdout.")
def check_cmd(name: str, corpus: Path, as_json: bool) -> None:
    """Check that every answer snippet of SET is verbatim in its file of CORPUS (as loaded)."""
    problems = check_snippets(name, corpus)
    if as_json:
        click.echo(json.dumps({"set": name, "problems": problems}, indent=2))
    else:
        for line in problems:
            click.echo(line)
        click.echo(f"{name}: {len(problems)} problem(s)")
    if problems:
        sys.exit(1)


@cli.command("recall")
@click.argument("name", metavar="SET")
@click.argument("corpus", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-k", "k", default=4, show_default=True, type=click.IntRange(min=1),
              help="How many passages each search returns.")
@click.option("--index", "index", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="Ingest into (or reuse) this index instead of a temporary one.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON to stdout.")
def recall_cmd(name: str, corpus: Path, k: int, index: Path | None, as_json: bool) -> None:
    """Recall@1 and @k of ragspec's search for SET's answer snippets in CORPUS."""
    result = measure_recall(name, corpus, k, index)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    for row in result["questions"]:
        found = (f"contains@{row['contains'] or '-'} overlaps@{row['overlaps'] or '-'}"
                 if "contains" in row else "")
        click.echo(f"{row['id']:<6} {row['kind']:<12} top {row['top_score']}  {found}")
    click.echo(f"{name}: {result['passages']} passages")
    for kind, s in result["summary"].items():
        line = f"  {kind:<12} n={s['n']:<3} median top score {s['top_score_median']:.3f}"
        if "contains@1" in s:
            line += (f"  contains @1 {s['contains@1']:.2f} @{k} {s[f'contains@{k}']:.2f}"
                     f"  overlaps @1 {s['overlaps@1']:.2f} @{k} {s[f'overlaps@{k}']:.2f}")
        click.echo(line)


@cli.command("record")
@click.argument("name", metavar="SET")
def record_cmd(name: str) -> None:
    """Rewrite SET's sources.json with this machine's hashes and package versions."""
    meta, sources = read_set(name)
    require_sources(sources)
    entries = []
    for s in sources:
        package, version = dpkg_owner(s.path)
        entries.append({**vars(s), "package": package, "version": version,
                        "source_sha256": sha256_hex(Path(s.path).read_bytes()),
                        "sha256": sha256_hex(render(s))})
    if any(s.render == "man" for s in sources):
        meta["rendered_with"] = {pkg: package_version(pkg) for pkg in MAN_PACKAGES}
    path = set_dir(name) / "sources.json"
    path.write_text(json.dumps({**meta, "sources": entries}, indent=2) + "\n", encoding="utf-8")
    click.echo(f"recorded {len(entries)} sources in {path.relative_to(REPO)}")


if __name__ == "__main__":
    cli()
