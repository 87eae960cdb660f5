"""Calibrating "not in your documents": the relevance floor alone against the floor plus the
absent-words check, tuned on one group of question sets and reported on the other.

Usage:  PYTHONPATH=. python -m ragspec.eval.refusal [--work DIR] [--json OUT]

Groups (the corpora as in ragspec/eval/retrieval.py; data/unanswerable/README.md):
  tuning    data (data/questions.jsonl) and dev (data/realdocs/dev), plus the not-answerable
            questions of data/unanswerable/tuning.jsonl over the same two corpora;
  held-out  bench (data/bench) and heldout (data/realdocs/heldout), plus
            data/unanswerable/heldout.jsonl (over data/corpus and the heldout manual pages).

Each question is searched once as `ragspec ask` searches it (hybrid, k = 4): its best cosine,
and for every content word its frequency rank and whether the index lacks it
(ragspec.retrieval.absent_words). The rule "refuse below the floor, or below WORDS_CHECK_BELOW
when a word ranked past COMMON_RANK is missing" is then evaluated on a grid; the pair chosen
refuses the most not-answerable tuning questions while refusing no more answerable tuning
questions than the floor alone (ties: the lower cosine bound, then the higher rank). The
table gives, per set, answers kept (answerable questions not refused), not-answerable
questions refused and writing tasks refused, for the floor alone and for the rule. Finally
every question is asked again through ragspec.search.retrieve with the shipped constants,
which must give the refusals the table states for them.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import click

from ragspec.bench import realdocs
from ragspec.eval.retrieval import REPO, corpora, ingested, read_jsonl
from ragspec.retrieval import absent_words as words
from ragspec.search import DEFAULT_MIN_SCORE, WORDS_CHECK_BELOW, retrieve

K = 4
GROUPS = {"tuning": ("data", "dev"), "held-out": ("bench", "heldout")}
RANKS = (2000, 3000, 5000, 8000, 10000, 15000, 20000)
BOUNDS = [round(0.40 + 0.01 * i, 2) for i in range(41)]  # 0.40 .. 0.80


def extra_questions(group: str) -> list[dict]:
    name = "tuning" if group == "tuning" else "heldout"
    return read_jsonl(REPO / "data" / "unanswerable" / f"{name}.jsonl")


def group_of(corpus_name: str) -> str:
    return next(g for g, names in GROUPS.items() if corpus_name in names)


def measure_corpus(name: str, corpus: Path, questions: list[dict]) -> list[dict]:
    """Per question: best cosine, every content word's rank and whether the index lacks it,
    and what ragspec.search.retrieve decided with the shipped constants."""
    rows = []
    with ingested(name, corpus) as store:
        for q in questions:
            result = store.retrieve(q["question"], k=K, mode="hybrid")
            content = words.content_words(q["question"])
            missing = set(words.missing_words(content, store.indexed_words,
                                              [h.passage.text for h in result.hits]))
            shipped = retrieve(store, q["question"], k=K)
            rows.append({
                "id": q["id"], "set": q["_set"], "group": q["_group"],
                "kind": realdocs.question_kind(q), "question": q["question"],
                "best_score": round(result.best_score, 4),
                "words": [[w, words.word_rank(w), w in missing] for w in content],
                "shipped_refused": shipped.refused, "shipped_absent": shipped.absent_words,
            })
    return rows


def refused(row: dict, floor: float, rank: int | None, bound: float) -> bool:
    """The rule at (floor, rank, bound); rank None: the floor alone."""
    if row["best_score"] < floor:
        return True
    return (rank is not None and row["best_score"] < bound
            and any(gone and r > rank for _, r, gone in row["words"]))


def counts(rows: list[dict], rank: int | None, bound: float) -> dict[str, list[int]]:
    """[refused, total] per kind group at the default floor."""
    out = {}
    for label, kinds in (("answerable", ("copy", "open")), ("unanswerable", ("unanswerable",)),
                         ("task", ("task",))):
        chosen = [r for r in rows if r["kind"] in kinds]
        out[label] = [sum(refused(r, DEFAULT_MIN_SCORE, rank, bound) for r in chosen),
                      len(chosen)]
    return out


def choose(rows: list[dict]) -> tuple[int, float]:
    """The (rank, bound) of the module docstring, on the tuning rows."""
    tuning = [r for r in rows if r["group"] == "tuning"]
    allowed = counts(tuning, None, 0.0)["answerable"][0]
    best = None
    for rank in RANKS:
        for bound in BOUNDS:
            c = counts(tuning, rank, bound)
            if c["answerable"][0] > allowed:
                continue
            key = (c["unanswerable"][0], -bound, rank)
            if best is None or key > best[0]:
                best = (key, rank, bound)
    return best[1], best[2]


def table(rows: list[dict], rank: int, bound: float) -> list[dict]:
    out = []
    sets = list(dict.fromkeys(r["set"] for r in rows))
    for group in GROUPS:
        for name in [s for s in sets if any(r["set"] == s and r["group"] == group for r in rows)]:
            chosen = [r for r in rows if r["set"] == name and r["group"] == group]
            out.append({"group": group, "set": name, "floor": counts(chosen, None, 0.0),
                        "rule": counts(chosen, rank, bound)})
        chosen = [r for r in rows if r["group"] == group]
        out.append({"group": group, "set": "all", "floor": counts(chosen, None, 0.0),
                    "rule": counts(chosen, rank, bound)})
    return out


def print_table(lines: list[dict]) -> None:
    click.echo("| group | set | answers kept: floor / rule | not answerable refused: floor / "
               "rule | writing tasks refused: floor / rule |")
    click.echo("|---|---|---|---|---|")
    for t in lines:
        f, r = t["floor"], t["rule"]
        kept = [f"{n - a}/{n}" for a, n in (f["answerable"], r["answerable"])]
        cells = [kept[0] + " / " + kept[1]]
        for label in ("unanswerable", "task"):
            cells.append(" / ".join(f"{a}/{n}" if n else "–" for a, n in (f[label], r[label])))
        click.echo(f"| {t['group']} | {t['set']} | " + " | ".join(cells) + " |")


@click.command()
@click.option("--work", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for the built real-document corpora (default: a temporary one).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Also write every question's measures here.")
def main(work: Path | None, json_out: Path | None) -> None:
    """Refusals of the floor alone and of the floor plus the absent-words check."""
    extra = {g: extra_questions(g) for g in GROUPS}
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="refusal-eval-corpora-") as scratch:
        for name, (corpus, questions) in corpora(work or Path(scratch)).items():
            group = group_of(name)
            own = [{**q, "_set": name, "_group": group} for q in questions]
            added = [{**q, "_set": f"unanswerable/{'tuning' if g == 'tuning' else 'heldout'}",
                      "_group": g}
                     for g, qs in extra.items() for q in qs if q["corpus"] == name]
            rows += measure_corpus(name, corpus, own + added)
    rank, bound = choose(rows)
    click.echo(f"chosen: words ranked past {rank} checked below a best cosine of {bound:.2f} "
               f"(shipped: {words.COMMON_RANK}, {WORDS_CHECK_BELOW:.2f}); floor "
               f"{DEFAULT_MIN_SCORE:.2f}")
    lines = table(rows, rank, bound)
    print_table(lines)
    shipped = table(rows, words.COMMON_RANK, WORDS_CHECK_BELOW)
    disagree = [r["id"] for r in rows if r["shipped_refused"]
                != refused(r, DEFAULT_MIN_SCORE, words.COMMON_RANK, WORDS_CHECK_BELOW)]
    click.echo(f"ragspec.search.retrieve disagrees with the table's rule on {len(disagree)} "
               f"question(s){': ' + ', '.join(disagree) if disagree else ''}")
    if json_out:
        json_out.write_text(json.dumps({
            "chosen": {"common_rank": rank, "words_check_below": bound},
            "shipped": {"common_rank": words.COMMON_RANK, "words_check_below": WORDS_CHECK_BELOW,
                        "min_score": DEFAULT_MIN_SCORE},
            "table": lines, "table_shipped": shipped, "retrieve_disagrees": disagree,
            "questions": rows}, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
