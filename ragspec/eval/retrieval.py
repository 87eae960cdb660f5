"""Retrieval quality: dense vs hybrid search, and the relevance floor, on four question sets.

Usage:  PYTHONPATH=. python -m ragspec.eval.retrieval [--work DIR] [--json OUT]
                                                     [--backend faiss|milvus]

Sets (each question carries the corpus file and verbatim snippet(s) holding its answer, see
data/realdocs/README.md): `data` (data/corpus) and `bench` (data/bench/corpus), written for
this project; `dev` and `heldout` (data/realdocs), documents installed on this machine, their
corpora built with ragspec/bench/realdocs.py. Defaults are chosen on the tuning sets `data` and `dev`;
`bench` and `heldout` are reported only.

For every set: its corpus is ingested with ragspec's ingest into a fresh index (the bundled
embedder, default splitter) and every question searched once per mode, top 5. A question is
found at rank r when the r-th passage is of the right file and contains a snippet whole
(ragspec/bench/realdocs.py's rule); recall@n = share of answerable questions found within the top n.

The floor: a question is refused when the best cosine of any passage to it is below the floor
(the same in both modes: the floor looks at the dense score only). The floor chosen is the
highest on a 0.05 grid that refuses no answerable question of the tuning sets; the table gives,
per set, the answerable questions refused (false refusals), the unanswerable ones refused
(correct refusals) and the writing tasks refused ("write a poem about...": no passage holds
their answer, but they are not questions the documents fail to answer either).
"""

from __future__ import annotations

import json
import statistics
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from ragspec.bench import realdocs

REPO = Path(__file__).resolve().parents[2]
MODES = ("dense", "hybrid")
DEPTHS = (1, 3, 5)
TUNING = ("data", "dev")
GRID = [round(0.05 * i, 2) for i in range(0, 17)]  # 0.00 .. 0.80


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]


def corpora(work: Path) -> dict[str, tuple[Path, list[dict]]]:
    """Each set's corpus folder and questions; the real-document corpora are built in `work`."""
    sets = {
        "data": (REPO / "data" / "corpus", read_jsonl(REPO / "data" / "questions.jsonl")),
        "bench": (REPO / "data" / "bench" / "corpus",
                  read_jsonl(REPO / "data" / "bench" / "questions.jsonl")),
    }
    for name in ("dev", "heldout"):
        out = work / f"realdocs-{name}"
        if not out.is_dir():
            for warning in realdocs.build_set(name, out):
                click.echo(f"warning: {warning}", err=True)
        sets[name] = (out, realdocs.read_questions(name))
    return sets


@contextmanager
def ingested(name: str, corpus: Path, backend: str = "faiss") -> Iterator:
    """A store holding `corpus`, ingested into a temporary index (a FAISS folder, or a Milvus
    Lite file) with the bundled embedder and the default splitter; removed on exit."""
    from ragspec.loading import open_store
    from ragspec.retrieval.ingest import ingest_paths

    with tempfile.TemporaryDirectory(prefix="retrieval-eval-") as scratch:
        store = open_store(scratch if backend == "faiss" else f"milvus:{scratch}/index.db")
        try:
            report = ingest_paths([corpus], store)
            if report.failed:
                raise click.ClickException(f"{name}: ingest failed for {report.failed[0][0]}: "
                                           f"{report.failed[0][1]}")
            yield store
        finally:
            store.close()


def evaluate_set(name: str, corpus: Path, questions: list[dict],
                 backend: str = "faiss") -> dict:
    """Ingest `corpus` (see `ingested`); per question and mode, the found rank and the best
    cosine."""
    files = sorted(p.name for p in corpus.iterdir() if p.is_file())
    texts = realdocs.loaded_texts(corpus, files)
    with ingested(name, corpus, backend) as store:
        rows = []
        for q in questions:
            row = {"id": q["id"], "kind": realdocs.question_kind(q)}
            for mode in MODES:
                result = store.retrieve(q["question"], k=max(DEPTHS), mode=mode)
                ranked = realdocs.rank_hits(q, result.hits, texts, corpus)
                row[mode] = ranked.get("contains")  # None for questions without snippets
                row["best_score"] = round(result.best_score, 4)
            rows.append(row)
        passages = store.passage_count()
    return {"set": name, "passages": passages, "questions": rows}


def recall(rows: list[dict], mode: str) -> dict[str, float]:
    answerable = [r for r in rows if r["kind"] in ("copy", "open")]
    return {f"@{n}": sum(1 <= r[mode] <= n for r in answerable) / len(answerable)
            for n in DEPTHS}


def refusals(rows: list[dict], floor: float) -> dict[str, list[int]]:
    """Per group: [refused, total] at `floor`."""
    groups = {"answerable": ("copy", "open"), "unanswerable": ("unanswerable",),
              "task": ("task",)}
    out = {}
    for group, kinds in groups.items():
        chosen = [r for r in rows if r["kind"] in kinds]
        out[group] = [sum(r["best_score"] < floor for r in chosen), len(chosen)]
    return out


def choose_floor(results: list[dict]) -> float:
    """The highest grid floor that refuses no answerable question of the tuning sets."""
    rows = [r for res in results if res["set"] in TUNING for r in res["questions"]]
    safe = [f for f in GRID if refusals(rows, f)["answerable"][0] == 0]
    return max(safe)


def summarise(results: list[dict], floor: float) -> list[dict]:
    table = []
    for res in results:
        rows = res["questions"]
        scores = {kind: [r["best_score"] for r in rows if r["kind"] == kind]
                  for kind in ("copy", "open", "unanswerable", "task")}
        table.append({
            "set": res["set"], "tuning": res["set"] in TUNING, "passages": res["passages"],
            "answerable": sum(r["kind"] in ("copy", "open") for r in rows),
            "recall": {mode: recall(rows, mode) for mode in MODES},
            "refused": refusals(rows, floor),
            "best_score_median": {k: statistics.median(v) for k, v in scores.items() if v},
            "lowest_answerable_score": min(scores["copy"] + scores["open"]),
        })
    return table


def print_table(table: list[dict], floor: float) -> None:
    click.echo(f"floor {floor:.2f} (highest on the grid refusing no answerable question of "
               f"{' + '.join(TUNING)})")
    click.echo("| set | passages | answerable | mode | recall@1 | recall@3 | recall@5 | "
               "false refusals | correct refusals | tasks refused |")
    click.echo("|---|---|---|---|---|---|---|---|---|---|")
    for t in table:
        name = t["set"] + (" (tuning)" if t["tuning"] else "")
        refused = t["refused"]
        cells = [f"{a}/{n}" if n else "–" for a, n in
                 (refused["answerable"], refused["unanswerable"], refused["task"])]
        for mode in MODES:
            r = t["recall"][mode]
            first = mode == MODES[0]
            shown = [name, str(t["passages"]), str(t["answerable"])] if first else ["", "", ""]
            tail = cells if first else ["", "", ""]  # the floor does not depend on the mode
            click.echo("| " + " | ".join([*shown, mode, f"{r['@1']:.2f}", f"{r['@3']:.2f}",
                                          f"{r['@5']:.2f}", *tail]) + " |")


@click.command()
@click.option("--work", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for the built real-document corpora (default: a temporary one).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Also write every question's ranks and scores here.")
@click.option("--backend", type=click.Choice(["faiss", "milvus"]), default="faiss",
              show_default=True, help="The index backend to ingest and search with.")
def main(work: Path | None, json_out: Path | None, backend: str) -> None:
    """Recall@1/3/5 of dense and hybrid search and refusal rates at the chosen floor."""
    with tempfile.TemporaryDirectory(prefix="retrieval-eval-corpora-") as scratch:
        sets = corpora(work or Path(scratch))
        results = [evaluate_set(name, corpus, questions, backend)
                   for name, (corpus, questions) in sets.items()]
    floor = choose_floor(results)
    table = summarise(results, floor)
    print_table(table, floor)
    tuning = [t for t in table if t["tuning"]]
    for mode in MODES:
        mean = statistics.mean(statistics.mean(t["recall"][mode].values()) for t in tuning)
        click.echo(f"{mode}: mean recall over @1/@3/@5 and the tuning sets {mean:.3f}")
    if json_out:
        json_out.write_text(json.dumps({"floor": floor, "table": table, "sets": results},
                                       indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
