"""The drafter against a brute-force matcher that scans every position."""

from hypothesis import given, settings
from hypothesis import strategies as st

from ragspec.decoding.ngram import NgramIndex, WordKeys


def brute_extended(tokens, origin, cap):
    end, length, k = origin - 1, len(tokens), 0
    while k < cap and end - k >= 0 and tokens[end - k] == tokens[length - 1 - k]:
        k += 1
    return k


def brute_force(tokens, *, min_n, max_n, max_tokens, occurrences=1, cap=NgramIndex.extend_cap):
    """Longest suffix first; among its latest `occurrences` earlier places the one agreeing
    furthest back (latest among equals); (n, origin, draft) or None."""
    length = len(tokens)
    for n in range(min(max_n, length), min_n - 1, -1):
        suffix = tokens[length - n :]
        ends = [end for end in range(length - 2, n - 2, -1)
                if tokens[end - n + 1 : end + 1] == suffix][:occurrences]
        if ends:
            end = max(ends, key=lambda e: (brute_extended(tokens, e + 1, cap), e))
            return n, end + 1, tokens[end + 1 : end + 1 + max_tokens]
    return None


@settings(max_examples=300, deadline=None)
@given(
    seq=st.lists(st.integers(0, 5), min_size=0, max_size=80),
    min_n=st.integers(1, 3),
    extra=st.integers(0, 4),
    max_tokens=st.integers(0, 12),
    occurrences=st.sampled_from([1, 2, 8]),
)
def test_propose_matches_brute_force_at_every_prefix(seq, min_n, extra, max_tokens, occurrences):
    max_n = min_n + extra
    index = NgramIndex(min_n=min_n, max_n=max_n, occurrences=occurrences)
    for i, t in enumerate(seq):
        index.append(t)
        prefix = seq[: i + 1]
        got = index.propose(max_tokens)
        want = brute_force(prefix, min_n=min_n, max_n=max_n, max_tokens=max_tokens,
                           occurrences=occurrences)
        if want is None:
            assert got is None
        else:
            assert (got.n, got.origin, got.tokens) == want
            assert got.extended == brute_extended(prefix, got.origin, NgramIndex.extend_cap)
            assert got.extended >= got.n


def test_worked_example_from_docstring():
    index = NgramIndex([5, 7, 9, 2, 5, 7, 9], min_n=1, max_n=3)
    m = index.propose(8)
    assert (m.n, m.origin, m.tokens) == (3, 3, [2, 5, 7, 9])


def test_suffix_never_matches_itself():
    index = NgramIndex([1, 2, 3], min_n=1, max_n=3)
    assert index.propose(4) is None


def test_prefers_latest_occurrence_on_ties():
    # (1, 2) is followed by 3 at position 2 and by 4 at position 5; the later one wins.
    index = NgramIndex([1, 2, 3, 1, 2, 4, 1, 2], min_n=2, max_n=2)
    m = index.propose(1)
    assert m.origin == 5 and m.tokens == [4]


def test_longer_match_beats_more_recent_shorter_one():
    # suffix (8, 1, 2): the 3-gram occurs at 0..2 (then 9); the 2-gram (1, 2) more recently (then 4).
    index = NgramIndex([8, 1, 2, 9, 1, 2, 4, 8, 1, 2], min_n=1, max_n=3)
    m = index.propose(2)
    assert m.n == 3 and m.tokens == [9, 1]


def test_append_cost_does_not_grow_with_length():
    # Amortised O(1): the dicts hold at most (max_n - min_n + 1) entries per position.
    index = NgramIndex(min_n=1, max_n=4)
    index.extend(range(10_000))
    assert sum(len(ends) for d in index._ends.values() for ends in d.values()) <= 4 * 10_000


def test_occurrence_with_the_longer_history_beats_the_latest():
    # suffix (1, 2) after 7: "7 1 2 3" agrees one token further back than the later "5 1 2 4"
    seq = [7, 1, 2, 3, 5, 1, 2, 4, 6, 7, 1, 2]
    assert NgramIndex(seq, min_n=2, max_n=2).propose(1).tokens == [4]
    m = NgramIndex(seq, min_n=2, max_n=2, occurrences=2).propose(1)
    assert m.tokens == [3] and m.origin == 3 and m.extended == 3


def test_alternatives_are_other_occurrences_one_per_next_token():
    seq = [1, 2, 3, 9, 1, 2, 4, 8, 1, 2, 3, 7, 1, 2]
    index = NgramIndex(seq, min_n=1, max_n=2)
    assert index.propose(2).tokens == [3, 7]
    # the main draft starts with 3; the others, latest first: 4 (then 8); 2-grams before 1-grams
    assert index.alternatives(3, 2, 2) == [[4, 8]]
    assert index.alternatives(None, 5, 1) == [[3], [4]]


def test_bad_arguments_raise_value_error():
    import pytest

    with pytest.raises(ValueError):
        NgramIndex(min_n=0)
    with pytest.raises(ValueError):
        NgramIndex(min_n=3, max_n=2)
    with pytest.raises(ValueError):
        NgramIndex(occurrences=0)


def _after_copy(prompt, first, written, follow):
    """The drafter as the engine drives it: the answer's first token, one proposal, then the
    tokens the verify committed (accepted draft tokens and the model's own), then a proposal."""
    index = NgramIndex(prompt, min_n=1, max_n=4, follow=follow)
    index.append(first)
    index.propose(4)
    index.extend(written)
    return index.propose(4)


def test_follower_skips_a_replaced_word_and_goes_on_copying():
    prompt = [10, 11, 12, 13, 14, 15, 16, 17]
    # the model copied 11 12 from the draft, then wrote 99 where the passage has 13
    m = _after_copy(prompt, 10, [11, 12, 99], follow=True)
    assert m is not None and m.kind == "skip"
    assert m.origin == 4 and m.tokens == [14, 15, 16, 17]
    assert _after_copy(prompt, 10, [11, 12, 99], follow=False) is None


def test_follower_resumes_a_copy_that_left_out_a_word():
    # 14 occurs twice: the plain suffix match takes the latest place; the follower the copy's
    prompt = [10, 11, 12, 13, 14, 15, 16, 17, 14, 30, 31]
    m = _after_copy(prompt, 10, [11, 12, 14], follow=True)
    assert m.kind == "follow" and m.origin == 5 and m.tokens == [15, 16, 17, 14]
    plain = _after_copy(prompt, 10, [11, 12, 14], follow=False)
    assert plain.origin == 9 and plain.tokens[:2] == [30, 31]


def test_follower_gives_up_on_a_copy_left_behind():
    prompt = [10, 11, 12, 13, 14, 15, 16, 17]
    m = _after_copy(prompt, 10, [11, 12, 99, 98, 97, 96], follow=True)
    assert m is None  # past skip_steps tokens after the break nothing is proposed from it


@given(st.lists(st.integers(0, 5), min_size=1, max_size=60), st.integers(1, 6))
def test_followed_proposals_are_slices_of_the_sequence(seq, max_tokens):
    index = NgramIndex(min_n=1, max_n=3, follow=True)
    for i, t in enumerate(seq):
        index.append(t)
        m = index.propose(max_tokens)
        if m is None:
            continue
        assert 0 < m.origin <= i
        assert m.tokens == seq[: i + 1][m.origin : m.origin + max_tokens]


def brute_variant(tokens, keys, *, min_n, max_n, max_tokens, occurrences, cap=NgramIndex.extend_cap):
    """The proposal with word keys, by scanning: the exact brute-force match, unless a place
    agrees further back under the keys (longest key suffix, then among its latest
    `occurrences` places the furthest agreement, latest among equals). (kind, origin, draft)."""
    exact = brute_force(tokens, min_n=min_n, max_n=max_n, max_tokens=max_tokens,
                        occurrences=occurrences)
    exact_ext = brute_extended(tokens, exact[1], cap) if exact else 0
    keyed = [keys(t) for t in tokens]
    length = len(tokens)
    for n in range(min(max_n, length), min_n - 1, -1):
        suffix = keyed[length - n :]
        ends = [end for end in range(length - 2, n - 2, -1)
                if keyed[end - n + 1 : end + 1] == suffix][:occurrences]
        if ends:
            end = max(ends, key=lambda e: (brute_extended(keyed, e + 1, cap), e))
            if brute_extended(keyed, end + 1, cap) > exact_ext:
                return "variant", end + 1, tokens[end + 1 : end + 1 + max_tokens]
            break
    return ("suffix", exact[1], exact[2]) if exact else None


@settings(max_examples=300, deadline=None)
@given(
    seq=st.lists(st.integers(0, 7), min_size=0, max_size=80),
    min_n=st.integers(1, 2),
    extra=st.integers(0, 3),
    max_tokens=st.integers(0, 8),
    occurrences=st.sampled_from([1, 3, 8]),
)
def test_variant_matches_brute_force_at_every_prefix(seq, min_n, extra, max_tokens, occurrences):
    def keys(t):  # token t and t + 4 are variants of one word ("the" / " The")
        return t % 4

    index = NgramIndex(min_n=min_n, max_n=min_n + extra, occurrences=occurrences, keys=keys)
    for i, t in enumerate(seq):
        index.append(t)
        got = index.propose(max_tokens)
        want = brute_variant(seq[: i + 1], keys, min_n=min_n, max_n=min_n + extra,
                             max_tokens=max_tokens, occurrences=occurrences)
        assert (None if got is None else (got.kind, got.origin, got.tokens)) == want


def test_a_quotation_starting_on_another_form_of_the_word_is_found():
    # passage: 20 " the" 21 "function" 22 "returns" 23 "a" 24 "list"; the answer writes
    # 30 "The" (the variant of 20), then 21: exactly only "function" agrees, under keys two
    passage = [9, 20, 21, 22, 23, 24, 8, 21, 7]
    keys = {20: "the", 30: "the"}.get
    index = NgramIndex(passage, min_n=1, max_n=4, keys=lambda t: keys(t, t))
    index.extend([5, 30, 21])
    m = index.propose(3)
    assert m.kind == "variant" and m.origin == 3 and m.tokens == [22, 23, 24]
    plain = NgramIndex(passage + [5, 30, 21], min_n=1, max_n=4).propose(3)
    assert plain.origin == 8  # the latest "function", which goes elsewhere


def test_word_keys_join_case_and_leading_space():
    texts = {1: " the", 2: "The", 3: "the", 4: " ", 5: "\n", 6: " them"}
    calls = []
    keys = WordKeys(lambda ids: calls.append(ids) or texts[ids[0]])
    assert keys(1) == keys(2) == keys(3) != keys(6)
    assert keys(4) != keys(5)  # whitespace-only tokens keep their own text
    keys(1)
    assert len(calls) == 6  # remembered: one decode per distinct token


def test_own_marks_copies_from_the_generated_part():
    index = NgramIndex([1, 2, 3], min_n=1, max_n=2)
    index.extend([1, 2])
    assert not index.propose(2).own  # from the prompt
    index.extend([3, 1])
    index.extend([2])
    assert index.propose(2).own  # (1, 2) last occurred in the answer


@settings(max_examples=200, deadline=None)
@given(
    prompt=st.lists(st.integers(0, 5), min_size=0, max_size=40),
    written=st.lists(st.integers(0, 5), min_size=0, max_size=30),
    unproposed=st.integers(0, 3),
    follow=st.booleans(),
    keyed=st.booleans(),
)
def test_a_prompt_indexed_on_first_use_proposes_as_one_indexed_at_once(
        prompt, written, unproposed, follow, keyed):
    """The constructor's tokens (a prompt) are indexed on the first proposal, after whatever was
    appended before it (the model's first tokens): every proposal and alternative then is the
    one an index that took the prompt token by token gives."""
    keys = (lambda t: t // 2) if keyed else None
    lazy = NgramIndex(prompt, min_n=1, max_n=3, occurrences=2, follow=follow, keys=keys)
    eager = NgramIndex(min_n=1, max_n=3, occurrences=2, follow=follow, keys=keys)
    eager.extend(prompt)
    eager.prompt_length = len(prompt)  # what it was given first, as the lazy one's
    assert lazy.prompt_length == len(prompt)
    for i, token in enumerate(written):
        lazy.append(token)
        eager.append(token)
        assert lazy.tokens == eager.tokens and len(lazy) == len(eager)
        if i >= unproposed:
            assert lazy.propose(6) == eager.propose(6)
            assert lazy.alternatives(None, 3, 4) == eager.alternatives(None, 3, 4)
