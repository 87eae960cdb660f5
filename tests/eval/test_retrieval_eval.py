"""The project's own question sets (data/, data/bench/) carry answer snippets found in their
corpora, and the retrieval evaluation's arithmetic (recall, refusals, the chosen floor). Fast:
the loaders only, no model."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragspec.bench import realdocs
from ragspec.eval import retrieval as retrieval_eval

REPO = Path(__file__).resolve().parents[2]
SETS = {"data": REPO / "data", "bench": REPO / "data" / "bench"}


def _questions(name: str) -> list[dict]:
    return retrieval_eval.read_jsonl(SETS[name] / "questions.jsonl")


@pytest.mark.parametrize("name", sorted(SETS))
def test_every_answerable_question_has_snippets_found_in_its_corpus_file(name):
    corpus = SETS[name] / "corpus"
    texts = realdocs.loaded_texts(corpus, sorted(p.name for p in corpus.iterdir()))
    kinds = [realdocs.question_kind(q) for q in _questions(name)]
    assert kinds.count("unanswerable") >= 8 and kinds.count("copy") >= 7
    for q, kind in zip(_questions(name), kinds, strict=True):
        if kind in ("unanswerable", "task"):
            assert q["answer"] is None and q["source"] is None, q["id"]
            continue
        for snippet in realdocs.snippets(q):
            assert realdocs.whitespace_pattern(snippet).search(texts[q["source"]]), \
                (q["id"], snippet)


@pytest.mark.parametrize("name", sorted(SETS))
def test_question_files_still_load_with_the_bench_loader(name):
    from ragspec.bench.runner import load_questions

    questions = load_questions(SETS[name] / "questions.jsonl")
    # every question but those marked unanswerable (nothing to generate from for the speed bench)
    assert [q.id for q in questions] == [q["id"] for q in _questions(name)
                                         if not q.get("unanswerable")]


def _row(kind, score, dense=None, hybrid=None):
    return {"id": "x", "kind": kind, "best_score": score, "dense": dense, "hybrid": hybrid}


def test_recall_counts_answerable_questions_found_within_each_depth():
    rows = [_row("copy", 0.6, 1, 1), _row("open", 0.5, 4, 2), _row("copy", 0.7, 0, 5),
            _row("unanswerable", 0.3), _row("task", 0.2)]
    assert retrieval_eval.recall(rows, "dense") == {"@1": 1 / 3, "@3": 1 / 3, "@5": 2 / 3}
    assert retrieval_eval.recall(rows, "hybrid") == {"@1": 1 / 3, "@3": 2 / 3, "@5": 1.0}


def test_floor_is_the_highest_that_refuses_no_answerable_tuning_question():
    tuning = {"set": "data", "questions": [_row("copy", 0.47, 1, 1), _row("unanswerable", 0.2),
                                           _row("unanswerable", 0.5)]}
    other = {"set": "heldout", "questions": [_row("copy", 0.3, 1, 1)]}  # not tuned on
    floor = retrieval_eval.choose_floor([tuning, other])
    assert floor == 0.45
    assert retrieval_eval.refusals(tuning["questions"], floor) == {
        "answerable": [0, 1], "unanswerable": [1, 2], "task": [0, 0]}
    assert retrieval_eval.refusals(other["questions"], floor)["answerable"] == [1, 1]
