"""keywords.npz is derived data that must never be trusted past what it says it is: the file
names the tokenizer that built it (another tokenizer's postings are rebuilt from the texts, not
kept), and a file whose offsets run backwards is refused instead of read into wrong postings."""

from __future__ import annotations

import io

import numpy as np
import pytest

from ragspec.retrieval.bm25 import index as bm25
from ragspec.retrieval.bm25.index import BM25Index

PASSAGES = [("a", "The disk is full."), ("b", "Error E204: the disk quota is full, full."),
            ("c", "Set max_log_size to 7432 bytes.")]
ORDER = [pid for pid, _ in PASSAGES]


def _arrays(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
        return {name: arrays[name] for name in arrays.files}


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def test_a_file_built_by_another_tokenizer_is_rebuilt_from_the_texts(monkeypatch):
    # Written by a tokenizer that cut identifiers at underscores: "max", "log", "size".
    monkeypatch.setattr(bm25, "tokenize", lambda text: text.lower().replace("_", " ").split())
    monkeypatch.setattr(bm25, "TOKENIZER", "words split at underscores", raising=False)
    old = BM25Index.build(PASSAGES).to_bytes(ORDER)
    monkeypatch.undo()
    restored = BM25Index.restore(old, PASSAGES)
    assert [pid for pid, _ in restored.top("max_log_size", 3)] == ["c"]
    assert restored.score("e204 full") == BM25Index.build(PASSAGES).score("e204 full")
    with pytest.raises(ValueError, match="tokenizer"):
        BM25Index.from_bytes(old, ORDER)


def test_a_file_without_a_tokenizer_name_is_not_trusted():
    arrays = _arrays(BM25Index.build(PASSAGES).to_bytes(ORDER))
    arrays.pop("tokenizer", None)
    with pytest.raises(ValueError, match="tokenizer"):
        BM25Index.from_bytes(_npz(arrays), ORDER)


def test_offsets_that_run_backwards_are_refused():
    arrays = _arrays(BM25Index.build(PASSAGES).to_bytes(ORDER))
    offsets = arrays["offsets"].copy()
    assert len(offsets) >= 4 and offsets[1] < offsets[2]
    offsets[1], offsets[2] = offsets[2], offsets[1]  # same length, same last value, not monotonic
    arrays["offsets"] = offsets
    with pytest.raises(ValueError, match="offsets"):
        BM25Index.from_bytes(_npz(arrays), ORDER)
    # restore() rebuilds instead of reading the damaged postings
    assert BM25Index.restore(_npz(arrays), PASSAGES).score("disk") == \
        BM25Index.build(PASSAGES).score("disk")


def test_many_small_segments_score_and_save_like_one_build(monkeypatch):
    # Seal pending postings every few adds, so merging runs through many segment sizes.
    monkeypatch.setattr(bm25, "_SEAL_POSTINGS", 5)
    texts = [(f"p{i:03d}", f"word{i % 7} word{i % 11} shared token{i} E{i % 3}04")
             for i in range(120)]
    grown = BM25Index()
    for pid, text in texts:
        grown.add(pid, text)
        if pid.endswith("7"):
            grown.remove(pid)
            grown.top("shared word3", 5)  # searches between changes seal and merge
    kept = [(pid, text) for pid, text in texts if not pid.endswith("7")]
    scratch = BM25Index.build(kept)
    for query in ("shared", "word3 word5", "E104 token42", "nothing"):
        assert grown.score(query) == pytest.approx(scratch.score(query), rel=1e-12)
    order = [pid for pid, _ in kept]
    assert grown.to_bytes(order) == scratch.to_bytes(order)
    assert len(grown._segments) <= 2 * max(1, len(kept)).bit_length()


def test_an_index_whose_passages_were_all_removed_saves_and_loads():
    index = BM25Index.build(PASSAGES)
    for pid in ORDER:
        index.remove(pid)
    data = index.to_bytes([])
    assert BM25Index.from_bytes(data, []).top("disk", 3) == []
