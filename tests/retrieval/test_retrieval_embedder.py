"""The bundled all-MiniLM-L6-v2: offline, normalised, same word pieces as the splitter counts;
and end-to-end retrieval on the sample corpus. Marked slow: loads torch and the model (~10 s)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from fakes import HashEmbedder

from ragspec.retrieval.embeddings.embedder import BUNDLED_MODEL_ID, Embedder, bundled_model_dir
from ragspec.retrieval.faiss.store import PassageStore
from ragspec.retrieval.ingest import ingest_paths

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "data" / "corpus"


def _no_network(*args, **kwargs):
    raise AssertionError("the embedder tried to open a network connection")


@pytest.fixture(scope="module")
def embedder():
    # Loaded once for the module, with sockets disabled: proves the model loads offline.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", _no_network)
        model = Embedder()
        model.embed_array(["warm up"])
    return model


@pytest.fixture(scope="module")
def corpus_store(tmp_path_factory, embedder):
    store = PassageStore.open(tmp_path_factory.mktemp("idx"), embedder)
    assert ingest_paths([CORPUS], store).ok
    return store


def test_bundled_model_loads_and_embeds_without_network(embedder, monkeypatch):
    monkeypatch.setattr(socket.socket, "connect", _no_network)
    assert embedder.name == BUNDLED_MODEL_ID
    assert embedder._path == str(bundled_model_dir())
    vectors = embedder.embed_array(["job scheduler", "Larkspur retries failed jobs"])
    assert vectors.shape == (2, 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    query = np.asarray(embedder.embed_query("Larkspur retries failed jobs"), dtype=np.float32)
    assert np.allclose(query, vectors[1], atol=1e-5)


def test_model_limits_and_token_counts_match_what_the_splitter_uses(embedder):
    assert (embedder.dim, embedder.max_tokens, embedder.special_tokens) == (384, 256, 2)
    text = (CORPUS / "configuration-reference.txt").read_text()
    assert embedder.count_tokens(text) == HashEmbedder().count_tokens(text) > 256
    ids = embedder.tokenizer(text[:300])["input_ids"]
    assert len(ids) == embedder.count_tokens(text[:300]) + 2


def test_every_stored_passage_is_fully_visible_to_the_model(corpus_store, embedder):
    for p in corpus_store.passages():
        assert len(embedder.tokenizer(p.text)["input_ids"]) <= embedder.max_tokens


@pytest.mark.parametrize(
    "qid, source, page",
    [
        ("q02", "configuration-reference.txt", None),
        ("q04", "configuration-reference.txt", None),
        ("q05", "operations-guide.pdf", 1),
        ("q10", "operations-guide.pdf", 1),
        ("q11", "namespaces-and-quotas.txt", None),
        ("q12", "command-reference.html", None),
    ],
)
def test_development_questions_find_the_passage_that_answers_them(corpus_store, qid, source, page):
    questions = {
        q["id"]: q for q in map(json.loads, (REPO / "data" / "questions.jsonl").read_text().splitlines())
    }
    hits = corpus_store.search(questions[qid]["question"], k=3)
    assert (Path(hits[0].passage.source).name, hits[0].passage.page) == (source, page)




def test_cli_end_to_end_with_the_bundled_model(tmp_path, monkeypatch, embedder):
    import ragspec.loading as common
    from ragspec.cli import main

    monkeypatch.setenv("RAGSPEC_HOME", str(tmp_path))
    monkeypatch.delenv("RAGSPEC_EMBEDDER", raising=False)
    # The command's own loader, fed the already-loaded model (loading it twice costs seconds).
    monkeypatch.setattr(common, "cached_embedder", lambda name: embedder if name is None else None)
    runner = CliRunner()
    assert runner.invoke(main, ["ingest", str(CORPUS)]).exit_code == 0
    result = runner.invoke(main, ["search", "how many snapshots are kept", "--json", "-k", "1"])
    [hit] = json.loads(result.stdout)
    assert hit["source"].endswith("operations-guide.pdf") and "7 most recent snapshots" in hit["text"]


def test_passages_embedded_in_order_of_length_come_back_in_their_own_order(embedder):
    from ragspec.retrieval.ingest import EMBED_CHUNK, embed_in_order

    words = "the quick brown fox jumps over a lazy dog near the river bank".split()
    texts = [" ".join(words[: 1 + (7 * i) % len(words)]) + f" {i}" for i in range(EMBED_CHUNK + 40)]
    heard = []
    got = embed_in_order(embedder, texts, lambda done, total: heard.append((done, total)))
    alone = np.stack([embedder.embed_array([text])[0] for text in texts[:: 9]])
    # Row i is texts[i], whatever its batch: in fp32 to float rounding; in bf16 a batch's other
    # lengths move the rounding of its products, so a row is only near its text's vector alone.
    if embedder.precision == "fp32":
        assert np.abs(got[:: 9] - alone).max() < 1e-5
    cosines = got[:: 9] @ alone.T
    assert np.diag(cosines).min() > 0.9995
    assert (cosines.argmax(axis=1) == np.arange(len(alone))).all()
    assert heard == [(EMBED_CHUNK, len(texts)), (len(texts), len(texts))]
