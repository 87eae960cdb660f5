"""`ragspec serve` with the bundled models on the bundled sample documents: concurrent streamed
answers equal the pipeline's single-sequence answers, and accepted drafts point at the passage
text they copied."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import serve_support
from conftest import REPO

from ragspec.decoding.engine import Generator
from ragspec.decoding.types import GenerationConfig
from ragspec.pipeline import Pipeline, PipelineConfig

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def corpus_store(tmp_path_factory):
    from ragspec.loading import cached_embedder
    from ragspec.retrieval.faiss.store import PassageStore
    from ragspec.retrieval.ingest import ingest_paths

    store = PassageStore.open(tmp_path_factory.mktemp("index"), cached_embedder(None))
    assert ingest_paths([REPO / "data" / "corpus"], store).ok
    return store


def test_concurrent_api_answers_equal_the_pipeline_alone(bundled, corpus_store):
    questions = [json.loads(line)["question"] for line in
                 (REPO / "data" / "questions.jsonl").read_text().splitlines()[:3]]
    gen = Generator.from_loaded(bundled)
    pipeline = Pipeline(corpus_store, gen, PipelineConfig(max_new_tokens=48))
    want = [pipeline.ask(q, gen_config=GenerationConfig(max_new_tokens=48)).result
            for q in questions]
    running = serve_support.start(bundled.model, bundled.tokenizer, corpus_store,
                                  max_new_tokens=48, min_score=0.4, k=4,
                                  eos=sorted(bundled.eos_token_ids))
    try:
        client = openai.OpenAI(base_url=running.base_url, api_key="x", max_retries=0,
                               timeout=600)

        def ask(question):
            text, ext = "", None
            for chunk in client.chat.completions.create(
                    model="ragspec", stream=True, max_tokens=48,
                    messages=[{"role": "user", "content": question}]):
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                ext = (chunk.model_extra or {}).get("ragspec") or ext
            return text, ext

        with ThreadPoolExecutor(len(questions)) as pool:
            got = list(pool.map(ask, questions))
    finally:
        running.stop()
    copies = 0
    for (text, ext), result in zip(got, want, strict=True):
        assert text == result.text
        assert [t for s in ext["spans"] for t in s["token_ids"]] == result.token_ids
        for span in ext["spans"]:
            origin = span["origin"]
            if span["drafted"] and origin["source"] is not None:
                passage = ext["passages"][origin["source"]]["text"]
                copied = passage[origin["char_start"]:origin["char_end"]]
                # a draft of whitespace alone (a line break copied from a passage) is exact too
                assert span["text"] == copied or span["text"].strip() and span[
                    "text"].strip() in " ".join([copied, passage[origin["char_start"]:]])
                copies += 1
    assert copies > 0, "the bundled model copies from the passages on these questions"
