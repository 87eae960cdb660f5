"""A turn after another in one chat: passages the previous prompt showed keep their places
(ragspec.pipeline.keep_places), so the new prompt starts as the previous one did up to the first
place that changed; a question without a previous turn keeps the rank order."""

from __future__ import annotations

import pytest
from test_pipeline import assert_regions_map_back, pipeline_for

from ragspec.describe import source_label
from ragspec.pipeline import keep_places
from ragspec.retrieval.faiss.store import Hit, Passage
from ragspec.search import Retrieval

TEXTS = {
    "A": "tar -x extracts files from an archive; -f names the archive file to read or write.",
    "B": "gzip keeps the original file with -k and writes to standard output with -c.",
    "C": "grep -r searches directories recursively, following symbolic links only on the "
         "command line.",
    "D": "xargs -0 reads items terminated by a null character instead of whitespace.",
    "E": "make -j runs several recipes at once; without a number it runs as many as it can.",
}
P = {name: Passage(id=f"{name}-1", doc_id=name, source=f"/docs/{name}.txt", page=None, start=0,
                   text=text) for name, text in TEXTS.items()}


@pytest.fixture(scope="module")
def smol(bundled):
    """The bundled model's tokenizer (its chat template and BPE merges: the real prefixes)."""
    return bundled.tokenizer


def hits(names: str) -> list[Hit]:
    return [Hit(score=1.0 - i / 10, passage=P[n]) for i, n in enumerate(names)]


def retrieval(names: str, question: str = "How do I keep the original file?") -> Retrieval:
    found = hits(names)
    return Retrieval(question, question, found, found[0].score, 0.0, False)


def names(passages) -> str:
    return "".join(p.doc_id for p in passages)


def test_kept_passages_keep_their_places_new_ones_fill_the_empty_ones_and_the_best_goes_last():
    # previous shown A B C D ([4]..[1]); now ranked D A E B: C's place goes to E, D stays last
    assert names(h.passage for h in keep_places([P[n] for n in "ABCD"], hits("DAEB"))[::-1]) \
        == "ABED"
    # a new best goes last; B's place stays empty
    assert names(h.passage for h in keep_places([P[n] for n in "ABCD"], hits("EDCA"))[::-1]) \
        == "ACDE"
    # the best goes last even when it had another place before
    assert names(h.passage for h in keep_places([P[n] for n in "ABCD"], hits("BDEA"))[::-1]) \
        == "AEDB"
    shown = names(h.passage for h in keep_places([P[n] for n in "ABC"], hits("EDBA"))[::-1])
    assert shown == "ABDE"  # C's place: D (the worse new one); E (the best) after it
    # best first: the new ones in rank order
    assert names(h.passage for h in keep_places([P[n] for n in "ABCD"], hits("DAEB"),
                                                best_last=False)) == "ABED"


def test_a_turn_after_another_starts_as_the_previous_prompt_up_to_the_first_changed_place(
        smol):
    keep = pipeline_for(smol, keep_places=True)
    rank = pipeline_for(smol)  # the default: every turn in rank order
    first = keep.prepare_retrieved(retrieval("DCBA"))
    assert names(first.shown) == "ABCD"  # best last: the rank order reversed
    after = keep.prepare_retrieved(retrieval("DAEB", "How do I run recipes at once?"), first)
    assert names(after.shown) == "ABED"
    assert_regions_map_back(after, smol)
    cut = first.prompt_text.index("[2] (from")  # the first place that changed
    assert after.prompt_text[:cut] == first.prompt_text[:cut]
    shared = _common(first.prompt_ids, after.prompt_ids)
    # the rank order shows B first: the two prompts part at the first passage
    ranked = rank.prepare_retrieved(retrieval("DAEB", "How do I run recipes at once?"), first)
    assert names(ranked.shown) == "BEAD"
    before_passages = first.prompt_text.index("[4] (from")
    assert len(smol(first.prompt_text[:cut])["input_ids"]) - 2 <= shared
    assert _common(first.prompt_ids, ranked.prompt_ids) < len(
        smol(first.prompt_text[:before_passages + len("[4] (from ")])["input_ids"])
    assert shared > _common(first.prompt_ids, ranked.prompt_ids) + 40


def test_without_a_previous_turn_the_prompt_is_in_rank_order(smol):
    pipe = pipeline_for(smol, keep_places=True)
    alone = pipe.prepare_retrieved(retrieval("DAEB"))
    assert names(alone.passages) == "DAEB" and names(alone.shown) == "BEAD"
    assert alone.prompt_ids == pipe.prepare_retrieved(retrieval("DAEB"), None).prompt_ids


@pytest.mark.parametrize("best_last", [True, False])
def test_labels_follow_places_and_scores_follow_their_passages(smol, best_last):
    pipe = pipeline_for(smol, best_last=best_last, keep_places=True)
    first = pipe.prepare_retrieved(retrieval("DCBA"))
    after = pipe.prepare_retrieved(retrieval("DAEB"), first)
    scores = {h.passage.id: h.score for h in hits("DAEB")}
    assert [scores[p.id] for p in after.passages] == after.scores
    for i, p in enumerate(after.passages):
        assert f"[{i + 1}] (from {source_label(p)})\n{p.text}" in after.prompt_text


def _common(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
