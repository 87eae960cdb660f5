"""The refusal calibration's question sets (data/unanswerable/), the follow-up pairs
(data/followups/) and the arithmetic that chooses the absent-words check's constants. Fast: no
embedder, no index."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragspec.bench import realdocs
from ragspec.eval import followups, refusal
from ragspec.eval.retrieval import read_jsonl

REPO = Path(__file__).resolve().parents[2]
SETS = {"tuning": ("data", "dev"), "heldout": ("data", "heldout")}


def _set(name: str) -> list[dict]:
    return read_jsonl(REPO / "data" / "unanswerable" / f"{name}.jsonl")


@pytest.mark.parametrize("name", sorted(SETS))
def test_unanswerable_sets_are_marked_and_name_a_corpus_of_their_own_group(name):
    questions = _set(name)
    assert len(questions) >= (30 if name == "heldout" else 15)
    assert len({q["id"] for q in questions}) == len(questions)
    for q in questions:
        assert q["unanswerable"] is True and q["answer"] is None and q["source"] is None, q["id"]
        assert q["corpus"] in SETS[name], q["id"]
        assert realdocs.question_kind(q) == "unanswerable"


def test_tuning_and_held_out_questions_are_kept_apart():
    others = [q["question"].lower() for path in ("questions.jsonl", "bench/questions.jsonl")
              for q in read_jsonl(REPO / "data" / path)]
    others += [q["question"].lower() for s in ("dev", "heldout")
               for q in realdocs.read_questions(s)]
    tuning = {q["question"].lower() for q in _set("tuning")}
    heldout = {q["question"].lower() for q in _set("heldout")}
    assert not tuning & heldout and not (tuning | heldout) & set(others)


def _row(kind, best, words=(), group="tuning"):
    return {"id": "x", "set": "s", "group": group, "kind": kind, "best_score": best,
            "words": [list(w) for w in words]}


def test_chosen_constants_refuse_no_more_answerable_tuning_questions_than_the_floor():
    rows = [
        _row("copy", 0.62, [("bashrc", 30000, True)]),   # answerable, a rare word missing
        _row("copy", 0.45, [("port", 100, False)]),
        _row("unanswerable", 0.50, [("rotate", 24000, True)]),
        _row("unanswerable", 0.60, [("kubernetes", 30000, True)]),
        _row("unanswerable", 0.30),                       # the floor's
        _row("unanswerable", 0.70, [("docker", 30000, True)]),  # only a bound that costs an answer
        _row("unanswerable", 0.50, [("haiku", 9000, True)], group="held-out"),
    ]
    rank, bound = refusal.choose(rows)
    # refusing all three needs a bound above 0.60, sparing the answerable 0.62 one below 0.63:
    # of 0.61 and 0.62 the lower wins; of the ranks below rotate's, the highest
    assert bound == 0.61 and rank == max(refusal.RANKS)
    tuning = [r for r in rows if r["group"] == "tuning"]
    assert refusal.counts(tuning, None, 0.0) == {"answerable": [0, 2], "unanswerable": [1, 4],
                                                 "task": [0, 0]}
    assert refusal.counts(tuning, rank, bound)["unanswerable"] == [3, 4]
    assert refusal.counts(tuning, rank, bound)["answerable"] == [0, 2]


def test_followup_pairs_hold_their_snippets_and_non_followups_stay_unchanged():
    pairs = read_jsonl(followups.PAIRS)
    assert sum(p["followup"] for p in pairs) >= 15 and sum(not p["followup"] for p in pairs) >= 5
    texts = realdocs.loaded_texts(followups.CORPUS,
                                  sorted(p.name for p in followups.CORPUS.iterdir()))
    for p in pairs:
        assert realdocs.whitespace_pattern(p["answer"]).search(texts[p["source"]]), p["id"]
        if not p["followup"]:
            assert followups.new_rule(p) == p["question"], p["id"]
    changed = [p["id"] for p in pairs if followups.new_rule(p) != followups.old_rule(p)]
    assert changed == ["f03"]  # the "then" follow-up, the one the rule change is about
