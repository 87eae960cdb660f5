"""Prompt building: numbered passages, trimming that never cuts the question, SourceRegions whose
character ranges map back to the passage text, follow-up rewriting; and one end-to-end check on
the bundled model that accepted drafts carry the passage and the exact characters they copied."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ragspec.decoding.types import GenerationConfig
from ragspec.pipeline import (
    DEFAULT_SEARCH,
    NoDocumentsError,
    Pipeline,
    PipelineConfig,
    is_followup,
    standalone_question,
)
from ragspec.retrieval.faiss.store import Hit, Passage, SearchResult
from ragspec.search import NOT_IN_DOCUMENTS

PASSAGES = [
    Passage(id="a-1", doc_id="a", source="/docs/ops guide.md", page=None, start=0,
            text="The metrics endpoint listens on port 7432 and serves /metrics only. "
                 "It is always on the port after api_port."),
    Passage(id="b-1", doc_id="b", source="/docs/notes.pdf", page=3, start=120,
            text="Café <b>bold</b> **not markdown**  double  spaces\nand a second line — ok."),
    Passage(id="c-1", doc_id="c", source="/docs/faq.txt", page=None, start=40,
            text="Logs are kept for 14 days by default. Logs larger than max_log_size are "
                 "truncated from the start, keeping the newest output."),
]


class FakeStore:
    """Hits with scores best - 0.1 * rank, in the given order; records queries and modes."""

    def __init__(self, passages=PASSAGES, best=1.0):
        self.passages = list(passages)
        self.best = best
        self.queries: list[str] = []
        self.modes: list[str] = []

    def passage_count(self):
        return len(self.passages)

    def retrieve(self, query, k=4, mode="dense"):
        self.queries.append(query)
        self.modes.append(mode)
        hits = [Hit(score=self.best - i / 10, passage=p) for i, p in enumerate(self.passages[:k])]
        return SearchResult(hits=hits, best_score=self.best if hits else None, mode=mode)


@pytest.fixture(scope="module")
def smol_tokenizer(bundled):
    return bundled.tokenizer


def stub_generator(tokenizer, context=8192):
    # Prompt building needs only the tokenizer and the context length.
    return SimpleNamespace(tokenizer=tokenizer, context_length=context)


def pipeline_for(tokenizer, store=None, **config):
    return Pipeline(store or FakeStore(), stub_generator(tokenizer), PipelineConfig(**config))


def assert_regions_map_back(prepared, tokenizer):
    assert len(prepared.sources) == len(prepared.passages)
    for i, (region, passage) in enumerate(zip(prepared.sources, prepared.passages, strict=True)):
        assert region.source == i
        offsets = region.char_offsets
        assert offsets, "every passage occupies some prompt tokens"
        # the token ranges tile the passage text exactly, in order
        assert offsets[0][0] == 0 and offsets[-1][1] == len(passage.text)
        for (s0, e0), (s1, _) in zip(offsets, offsets[1:], strict=False):
            assert e0 == s1 and s0 <= e0
        # and each token's char range is what that token spells (up to the clipped edges)
        ids = prepared.prompt_ids[region.token_start : region.token_end]
        for tok_id, (s, e) in list(zip(ids, offsets, strict=True))[1:-1]:
            assert tokenizer.decode([tok_id]) == passage.text[s:e]
        assert passage.text in tokenizer.decode(ids)


def test_prompt_numbers_passages_best_last_and_ends_with_the_question(smol_tokenizer):
    prepared = pipeline_for(smol_tokenizer).prepare("Which port serves metrics?")
    text = prepared.prompt_text
    # [1] is the best passage, listed last, right before the question
    assert text.index("[3] (from faq.txt)") < text.index("[2] (from notes.pdf, page 3)")
    assert text.index("[2] (from notes.pdf, page 3)") < text.index("[1] (from ops guide.md)")
    assert text.index("[1] (from ops guide.md)") < text.index("Question: Which port")
    assert prepared.passages == PASSAGES
    assert text.rstrip().endswith("assistant")  # the generation prompt of the chat template
    assert prepared.prompt_ids == smol_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert prepared.scores == [1.0, 0.9, 0.8]


def test_best_first_order_lists_passages_by_rank(smol_tokenizer):
    text = pipeline_for(smol_tokenizer, best_last=False).prepare("Which port?").prompt_text
    assert text.index("[1] (from ops guide.md)") < text.index("[2] (from notes.pdf, page 3)")
    assert text.index("[2] (from notes.pdf, page 3)") < text.index("[3] (from faq.txt)")


@pytest.mark.parametrize("best_last", [True, False])
def test_source_regions_char_offsets_map_back_to_passage_text(smol_tokenizer, best_last):
    prepared = pipeline_for(smol_tokenizer, best_last=best_last).prepare_with_passages(
        "Anything?", PASSAGES)
    assert_regions_map_back(prepared, smol_tokenizer)


def test_source_regions_map_back_without_a_chat_template(tiny_tokenizer):
    ascii_passages = [
        Passage(id="x", doc_id="x", source="x.txt", page=None, start=0,
                text="Logs are kept for 14 days; big logs are cut."),
        Passage(id="y", doc_id="y", source="y.txt", page=None, start=5,
                text="Port 7432 serves /metrics only."),
    ]
    prepared = pipeline_for(tiny_tokenizer).prepare_with_passages("Port?", ascii_passages)
    assert_regions_map_back(prepared, tiny_tokenizer)


def prepare_over_budget(tokenizer, short_by: int, min_passage_chars: int):
    """PASSAGES prepared under a prompt budget `short_by` tokens below what they all need."""
    full = pipeline_for(tokenizer).prepare_with_passages("Which port?", PASSAGES)
    budget = len(full.prompt_ids) - short_by
    prepared = pipeline_for(tokenizer, max_prompt_tokens=budget,
                            min_passage_chars=min_passage_chars
                            ).prepare_with_passages("Which port?", PASSAGES)
    return prepared, budget


def test_trimming_drops_lowest_ranked_passages_first_and_fits_the_budget(smol_tokenizer):
    prepared, budget = prepare_over_budget(smol_tokenizer, 20, min_passage_chars=10_000)
    assert len(prepared.prompt_ids) <= budget
    assert prepared.passages == PASSAGES[:2]
    assert prepared.dropped == PASSAGES[2:]
    assert not prepared.truncated
    assert_regions_map_back(prepared, smol_tokenizer)


def test_last_kept_passage_is_cut_at_a_word_boundary_to_fit(smol_tokenizer):
    prepared, budget = prepare_over_budget(smol_tokenizer, 12, min_passage_chars=20)
    assert len(prepared.prompt_ids) <= budget
    assert prepared.truncated and len(prepared.passages) == 3
    cut = prepared.passages[-1]
    assert PASSAGES[2].text.startswith(cut.text) and len(cut.text) < len(PASSAGES[2].text)
    assert PASSAGES[2].text[len(cut.text)] == " "  # cut before a space, not inside a word
    assert_regions_map_back(prepared, smol_tokenizer)


def test_question_is_never_cut_only_passages_are(smol_tokenizer):
    question = "Which port does the metrics endpoint use " + "and why " * 60 + "exactly?"
    bare = pipeline_for(smol_tokenizer).prepare_with_passages(question, [])
    budget = len(bare.prompt_ids) + 30
    prepared = pipeline_for(smol_tokenizer, max_prompt_tokens=budget).prepare_with_passages(
        question, PASSAGES)
    assert f"Question: {question}" in prepared.prompt_text
    assert len(prepared.prompt_ids) <= budget
    assert len(prepared.passages) <= 1
    with pytest.raises(ValueError, match="question alone"):
        pipeline_for(smol_tokenizer, max_prompt_tokens=len(bare.prompt_ids) - 1) \
            .prepare_with_passages(question, PASSAGES)


def test_prompt_budget_keeps_room_for_the_answer(smol_tokenizer):
    p = Pipeline(FakeStore(), stub_generator(smol_tokenizer, context=300),
                 PipelineConfig(max_new_tokens=200))
    prepared = p.prepare_with_passages("Which port?", PASSAGES)
    assert len(prepared.prompt_ids) + 200 <= 300


def test_trimmed_passages_are_the_documents_characters_and_map_back(smol_tokenizer):
    """trim: each passage over the budget is cut to its sentences nearest the question; the kept
    text is the document's own characters at the passage's new start, and the prompt's regions
    map back into it (what citations, highlights and the source view rely on)."""
    document = "Preface. " * 7 + PASSAGES[2].text + " Rotation is weekly."
    long = Passage(id="c-1", doc_id="c", source="/docs/faq.txt", page=None, start=63,
                   text=document[63:])
    assert document[long.start:].startswith(PASSAGES[2].text)
    question = "How long are logs kept by default?"
    whole = pipeline_for(smol_tokenizer).prepare_with_passages(question, [PASSAGES[0], long])
    prepared = pipeline_for(smol_tokenizer, trim=16).prepare_with_passages(
        question, [PASSAGES[0], long])
    kept = prepared.passages[1]
    assert kept.text == "Logs are kept for 14 days by default." and kept.id == long.id
    assert document[kept.start: kept.start + len(kept.text)] == kept.text
    assert len(prepared.prompt_ids) < len(whole.prompt_ids)
    assert_regions_map_back(prepared, smol_tokenizer)
    assert pipeline_for(smol_tokenizer, trim=500).prepare_with_passages(
        question, [PASSAGES[0], long]).prompt_ids == whole.prompt_ids


@pytest.mark.parametrize("question", [
    "and what about its GPU version?", "What about the default?", "Why?",
    "How is it configured?", "also for namespaces",
])
def test_followups_are_detected(question):
    assert is_followup(question)


@pytest.mark.parametrize("question", [
    "Which port does the Larkspur metrics endpoint listen on?",
    "How long are job logs kept by default?",
])
def test_standalone_questions_are_not_followups(question):
    assert not is_followup(question)


def test_followup_is_rewritten_with_the_previous_standalone_question():
    history = [
        {"role": "user", "content": "How do I install Larkspur on Debian?"},
        {"role": "assistant", "content": "Use the package larkspur."},
    ]
    q = standalone_question("and what about its GPU version?", history)
    assert q == "How do I install Larkspur on Debian? and what about its GPU version?"
    # a chain of follow-ups keeps the original subject through "standalone"
    history += [{"role": "user", "content": "and on FreeBSD?", "standalone": "How do I "
                 "install Larkspur on Debian? and on FreeBSD?"}, {"role": "assistant",
                 "content": "..."}]
    assert standalone_question("Why?", history).startswith("How do I install Larkspur on Debian?")
    assert standalone_question("How long are logs kept by default?", history) == \
        "How long are logs kept by default?"
    assert standalone_question("and its GPU version?", []) == "and its GPU version?"


def test_prepare_retrieves_with_the_standalone_question(smol_tokenizer):
    store = FakeStore()
    p = pipeline_for(smol_tokenizer, store=store, k=2)
    history = [{"role": "user", "content": "Which port serves metrics?"},
               {"role": "assistant", "content": "7432"}]
    prepared = p.prepare("and what does it serve?", history)
    assert store.queries == ["Which port serves metrics? and what does it serve?"]
    assert prepared.standalone_question == store.queries[0]
    assert len(prepared.passages) == 2
    assert "Question: Which port serves metrics? and what does it serve?" in prepared.prompt_text


def test_empty_index_and_empty_question_are_clear_errors(smol_tokenizer):
    with pytest.raises(NoDocumentsError, match="ragspec ingest"):
        pipeline_for(smol_tokenizer, store=FakeStore([])).prepare("Which port?")
    with pytest.raises(ValueError, match="empty"):
        pipeline_for(smol_tokenizer).prepare("   ")


@pytest.mark.parametrize("kwargs", [dict(k=0), dict(max_new_tokens=0),
                                    dict(max_prompt_tokens=3), dict(system_prompt=" "),
                                    dict(trim=-1)])
def test_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        PipelineConfig(**kwargs)


def test_ask_returns_answer_with_passages_in_the_json_shape(tiny_model, tiny_tokenizer):
    from ragspec.decoding.engine import Generator

    ascii_passages = [Passage(id="x", doc_id="x", source="/d/x.txt", page=None, start=0,
                              text="Port 7432 serves metrics. Port 7432 serves metrics.")]
    # No token ends the answer (a random model's argmax may hit EOS on some CPUs), so the
    # length checked below is the one the call asked for.
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[-1])
    p = Pipeline(FakeStore(ascii_passages), gen, PipelineConfig(k=1, max_new_tokens=12))
    answer = p.ask("Port?", gen_config=GenerationConfig(max_new_tokens=12))
    out = answer.to_dict()
    assert set(out) == {"answer", "passages", "refused"} and out["refused"] is False
    assert {"text", "prompt_token_ids", "token_ids", "spans", "stats"} <= set(out["answer"])
    assert out["passages"][0]["n"] == 1 and out["passages"][0]["source"] == "/d/x.txt"
    assert {"id", "doc_id", "page", "start", "score", "text", "copied"} <= set(out["passages"][0])
    assert answer.result.stats.new_tokens == 12


@pytest.mark.slow
def test_accepted_drafts_carry_passage_and_the_characters_they_copied(bundled):
    from ragspec.decoding.engine import Generator

    gen = Generator.from_loaded(bundled)
    p = Pipeline(FakeStore(), gen, PipelineConfig(k=1, max_new_tokens=40))
    prepared = p.prepare_with_passages(
        "On which port does the metrics endpoint listen, and what does it serve?", PASSAGES[:1])
    result = p.stream(prepared, GenerationConfig(max_new_tokens=40)).result()
    from_passage = [s for s in result.spans if s.drafted and s.origin.source is not None]
    assert from_passage, f"expected the answer to quote the passage: {result.text!r}"
    for span in from_passage:
        o = span.origin
        copied = prepared.passages[o.source].text[o.char_start : o.char_end]
        # the span may run on past the passage's end into the prompt text after it
        assert copied.strip(), span
        assert span.text.strip().startswith(copied.strip()), (span.text, copied)


# -- the relevance floor ------------------------------------------------------------------------


class RefusingGenerator:
    """A generator double for refusals: it has a tokenizer, but using it to generate fails."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.context_length = 8192

    def stream(self, *args, **kwargs):
        raise AssertionError("the model was called although the floor refused the question")


@pytest.mark.parametrize("best, min_score, refused", [
    (0.39, 0.4, True), (0.41, 0.4, False), (0.05, 0.0, False), (-0.2, 0.0, False),
])
def test_floor_refuses_below_and_answers_above(tiny_tokenizer, tiny_model, best, min_score,
                                               refused):
    from ragspec.decoding.engine import Generator

    store = FakeStore(PASSAGES[:2], best=best)
    real = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[-1])
    gen = RefusingGenerator(tiny_tokenizer) if refused else real
    p = Pipeline(store, gen, PipelineConfig(k=2, max_new_tokens=4, min_score=min_score))
    answer = p.ask("Which port?", gen_config=GenerationConfig(max_new_tokens=4))
    assert answer.refused is refused
    if refused:
        assert answer.result is None and answer.passages == PASSAGES[:2]
        out = answer.to_dict()
        assert out["refused"] is True and out["answer"] is None
        assert [d["id"] for d in out["passages"]] == ["a-1", "b-1"]
        assert out["passages"][0]["score"] == pytest.approx(best)
    else:
        assert answer.result.stats.new_tokens == 4 and answer.to_dict()["refused"] is False


def test_retrieval_uses_the_configured_search_mode_and_reports_the_floor(tiny_tokenizer):
    store = FakeStore(best=0.3)
    p = Pipeline(store, stub_generator(tiny_tokenizer), PipelineConfig(search="dense",
                                                                       min_score=0.5))
    retrieval = p.retrieve("Which port serves metrics?")
    assert store.modes == ["dense"] and retrieval.refused and retrieval.best_score == 0.3
    # A hybrid refusal shows the most similar passages: a second, dense search.
    hybrid = Pipeline(store, stub_generator(tiny_tokenizer),
                      PipelineConfig(search="hybrid", min_score=0.5)).retrieve("Which port?")
    assert store.modes[1:] == ["hybrid", "dense"] and hybrid.refused
    store.modes.clear()
    assert retrieval.to_dict() == {"refused": True, "message": NOT_IN_DOCUMENTS,
                                   "best_score": 0.3, "min_score": 0.5, "absent_words": []}
    Pipeline(store, stub_generator(tiny_tokenizer), PipelineConfig()).retrieve("Which port?")
    assert store.modes[0] == DEFAULT_SEARCH


@pytest.mark.parametrize("kwargs, message", [
    ({"search": "keywords"}, "search must be one of dense, hybrid"),
    ({"min_score": 1.5}, "min_score .* must be between 0 and 1"),
    ({"min_score": -0.1}, "min_score .* must be between 0 and 1"),
])
def test_config_rejects_unknown_search_modes_and_floors_out_of_range(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PipelineConfig(**kwargs)
