"""The n-gram drafter: find the current suffix earlier in the sequence and copy what followed.

Works on token ids only (lists of ints); knows nothing of text, tensors or models, and imports
no torch, so it can be checked against a brute-force matcher.

The index holds one growing sequence (the prompt, then each generated token as it is accepted).
For every n in [min_n, max_n] it maps each n-gram to the positions where it ended with at least
one token after it, oldest first. An n-gram is therefore entered one token late, when its
continuation arrives: the suffix that is being looked up never matches itself.

Which occurrence to copy: with occurrences=1 the latest one. With occurrences=m > 1 the latest m
are compared by how far back each agrees with the current sequence (Match.extended) and the
longest agreement wins, the latest among equals: a suffix of four tokens that a passage and the
answer's own earlier sentence share is continued from the one whose history matches more.
`alternatives` lists the continuations of the other occurrences (one per distinct next token),
for verifying several candidates at once.

Worked example, min_n=1, max_n=3, the sequence

    position:  0  1  2  3  4  5  6  7
    token:     5  7  9  2  5  7  9  ?

After position 6 is appended the suffix is [5, 7, 9]. The 3-gram (5, 7, 9) last ended, with a
continuation, at position 2; so the match has n=3, position 2, and the draft copies what
followed: [2, 5, 7, 9] (up to max_tokens; the copy may run into the suffix itself, which is how
repeated patterns extend). origin = 3, the position of the first copied token.

Word variants (keys=...): a quotation often starts on another form of the passage's word: the
passage has " the", the answer "The". Given a function from token id to a normalised key (the
engine's: the token's text stripped of surrounding space and lower-cased), the index also keeps
the n-grams of keys, and when the latest tokens agree with an earlier place further back under
the keys than any exact match does, that place is proposed instead (Match.kind "variant",
extended = the agreement under keys): the copy continues with the passage's own tokens.

Appending costs O(max_n) dict updates and proposing costs O(max_n) lookups plus, per compared
occurrence, at most extend_cap comparisons and the draft's length, whatever the sequence's
length: nothing rescans the context.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Match:
    """A proposal: tokens to draft and where they were copied from.

    n: the length of the suffix that matched (the evidence).
    extended: how far the match really reaches back (>= n, capped at NgramIndex.extend_cap):
        a long agreeing history is stronger evidence than the n-gram alone.
    origin: position, in the indexed sequence, of the first drafted token.
    tokens: the draft; may be empty when the match has no continuation left.
    """

    n: int
    extended: int
    origin: int
    tokens: list[int]
    kind: str = "suffix"
    own: bool = False  # copied from the generated part of the sequence (self-repetition)


class NgramIndex:
    """Latest-occurrence index of n-grams, min_n <= n <= max_n, over a growing sequence."""

    extend_cap = 64
    window = 8  # how far past a broken copy the follower looks for it to resume
    skip_steps = 3  # how many tokens after a broken copy a skip proposal is still made

    def __init__(self, tokens: list[int] | tuple[int, ...] = (), *, min_n: int = 1, max_n: int = 4,
                 occurrences: int = 1, follow: bool = False,
                 keys: Callable[[int], Hashable] | None = None):
        if occurrences < 1:
            raise ValueError(f"occurrences must be >= 1, got {occurrences}")
        if min_n < 1:
            raise ValueError(f"min_n must be >= 1, got {min_n}")
        if max_n < min_n:
            raise ValueError(f"max_n ({max_n}) must be >= min_n ({min_n})")
        self.min_n = min_n
        self.max_n = max_n
        self.occurrences = occurrences
        self.follow = follow
        self.keys = keys
        self.tokens: list[int] = []
        self._keyed: list = []  # keys(token) for every token (with keys only)
        # the copy follower (follow=True): _next is the position whose token the copy under way
        # expects next; _broken where a copy stopped agreeing, _since tokens written since
        self._next: int | None = None
        self._broken: int | None = None
        self._since = 0
        self._run = 0  # tokens the followed copy has agreed with since it was proposed
        # _ends[n][ngram] = end positions (inclusive) of the occurrences that have a
        # continuation, i.e. end < len(tokens) - 1, in increasing order.
        self._ends: dict[int, dict[tuple[int, ...], list[int]]] = {
            n: {} for n in range(min_n, max_n + 1)
        }
        self._key_ends: dict[int, dict[tuple, list[int]]] = {n: {} for n in range(min_n, max_n + 1)}
        # The constructor's tokens (a prompt) are indexed on first use (propose, alternatives),
        # with whatever was appended meanwhile: a model's first token does not wait for it.
        self.tokens.extend(int(t) for t in tokens)
        self._lazy = bool(self.tokens)
        self.prompt_length = len(self.tokens)  # what the constructor was given: the prompt

    def __len__(self) -> int:
        return len(self.tokens)

    def append(self, token: int) -> None:
        toks = self.tokens
        if self._lazy:  # indexed with the rest on first use (_catch_up)
            toks.append(int(token))
            return
        # The n-grams ending at the previous last position now have a continuation.
        end = len(toks) - 1
        if end >= 0:
            for n in range(self.min_n, min(self.max_n, end + 1) + 1):
                self._ends[n].setdefault(tuple(toks[end - n + 1 : end + 1]), []).append(end)
                if self.keys is not None:
                    self._key_ends[n].setdefault(tuple(self._keyed[end - n + 1 : end + 1]),
                                                 []).append(end)
        toks.append(int(token))
        if self.keys is not None:
            self._keyed.append(self.keys(int(token)))
        if self.follow:
            self._advance(int(token))

    def _advance(self, token: int) -> None:
        """Move the copy follower past the token just appended."""
        toks, nxt = self.tokens, self._next
        if nxt is not None and nxt < len(toks) - 1 and toks[nxt] == token:
            self._next, self._run = nxt + 1, self._run + 1
            return
        if nxt is not None and self._run > 0:  # a copy that was under way broke off
            self._broken, self._since = nxt, 0
        self._next = None
        if self._broken is None:
            return
        self._since += 1
        stop = min(self._broken + self.window, len(toks) - 1)
        for q in range(self._broken, stop):  # the copy resumes a few tokens on
            if toks[q] == token:
                self._next, self._broken, self._run = q + 1, None, 1
                return
        if self._since > self.window:
            self._broken = None

    def extend(self, tokens) -> None:
        for t in tokens:
            self.append(t)

    def _catch_up(self) -> None:
        """Index the tokens held since construction, as appending them one by one would have
        (nothing was proposed meanwhile, so the copy follower had nothing to follow)."""
        if self._lazy:
            self._lazy = False
            held = self.tokens[:]
            self.tokens.clear()
            self.extend(held)

    def _agreement(self, end: int, n: int) -> int:
        """How far back the occurrence ending at `end` agrees with the sequence's end (>= n)."""
        toks, last = self.tokens, len(self.tokens) - 1
        extended = n
        while (extended < self.extend_cap and end - extended >= 0
               and toks[end - extended] == toks[last - extended]):
            extended += 1
        return extended

    def propose(self, max_tokens: int) -> Match | None:
        """Longest suffix (max_n down to min_n) seen before; among its latest `occurrences`
        places the one agreeing furthest back, the latest among equals. With keys, a place that
        agrees further back under the keys proposes instead (`_variant_match`); with
        follow=True the copy follower may (see `_followed`). Match.own says whether the copy
        comes from the generated part (past the constructor's tokens).

        Returns None when no suffix of length >= min_n occurred earlier (and nothing is
        followed).
        """
        self._catch_up()
        match = self._suffix_match(max_tokens)
        if self.keys is not None:
            match = self._variant_match(match, max_tokens)
        if self.follow:
            match = self._followed(match, max_tokens)
            if match is not None and (match.kind != "suffix" or match.extended >= 2
                                      or self._broken is None):
                self._next, self._run = match.origin, 0
        if match is not None and match.origin >= self.prompt_length and not match.own:
            match = replace(match, own=True)
        return match

    prefer_follow = True  # the followed copy wins ties with the suffix match
    skip_below = 2  # a skip proposal replaces suffix matches agreeing less far back than this

    def _followed(self, match: Match | None, max_tokens: int) -> Match | None:
        """The copy follower's proposal, when it beats the suffix match: the copy under way
        (its next token), or, a few tokens after a copy broke off, the copy one token past the
        break (the model replaced a word and goes on quoting)."""
        toks = self.tokens
        if self._next is not None and self._next < len(toks):
            start = self._next
            extended = self._agreement(start - 1, 0)
            if match is None or extended > match.extended or (
                    self.prefer_follow and extended == match.extended):
                return Match(n=0, extended=extended, origin=start,
                             tokens=toks[start : start + max(0, max_tokens)], kind="follow")
        elif (self._broken is not None and 1 <= self._since <= self.skip_steps
              and self._broken + 1 < len(toks)):
            if match is None or match.extended < self.skip_below:
                start = self._broken + 1
                return Match(n=0, extended=0, origin=start,
                             tokens=toks[start : start + max(0, max_tokens)], kind="skip")
        return match

    def _suffix_match(self, max_tokens: int) -> Match | None:
        toks = self.tokens
        length = len(toks)
        for n in range(min(self.max_n, length), self.min_n - 1, -1):
            ends = self._ends[n].get(tuple(toks[length - n :]))
            if not ends:
                continue
            best_end, extended = ends[-1], self._agreement(ends[-1], n)
            for end in reversed(ends[-self.occurrences : -1]):
                if extended >= self.extend_cap:
                    break
                agreement = self._agreement(end, n)
                if agreement > extended:
                    best_end, extended = end, agreement
            start = best_end + 1
            return Match(
                n=n,
                extended=extended,
                origin=start,
                tokens=toks[start : start + max(0, max_tokens)],
            )
        return None

    def _key_agreement(self, end: int, n: int) -> int:
        """_agreement under the keys."""
        keyed, last = self._keyed, len(self._keyed) - 1
        extended = n
        while (extended < self.extend_cap and end - extended >= 0
               and keyed[end - extended] == keyed[last - extended]):
            extended += 1
        return extended

    def _variant_match(self, match: Match | None, max_tokens: int) -> Match | None:
        """The place agreeing furthest back under the keys (longest key suffix, then among its
        latest `occurrences` places the furthest agreement, the latest among equals), when it
        agrees further back than `match` does exactly."""
        keyed, length = self._keyed, len(self._keyed)
        for n in range(min(self.max_n, length), self.min_n - 1, -1):
            ends = self._key_ends[n].get(tuple(keyed[length - n :]))
            if not ends:
                continue
            best_end, extended = ends[-1], self._key_agreement(ends[-1], n)
            for end in reversed(ends[-self.occurrences : -1]):
                if extended >= self.extend_cap:
                    break
                agreement = self._key_agreement(end, n)
                if agreement > extended:
                    best_end, extended = end, agreement
            if match is not None and extended <= match.extended:
                return match
            start = best_end + 1
            return Match(n=n, extended=extended, origin=start,
                         tokens=self.tokens[start : start + max(0, max_tokens)], kind="variant")
        return match

    def alternatives(self, skip: int | None, count: int, length: int,
                     per_suffix: int = 16) -> list[list[int]]:
        """Up to `count` continuations (`length` tokens each) of earlier occurrences of the
        current suffix, longest suffix first, latest first, one per distinct next token and
        none starting with `skip` (the main draft's first token). Looks at the latest
        `per_suffix` occurrences of each suffix length."""
        self._catch_up()
        toks, found, seen = self.tokens, [], {skip}
        length_now = len(toks)
        for n in range(min(self.max_n, length_now), self.min_n - 1, -1):
            for end in reversed(self._ends[n].get(tuple(toks[length_now - n :]), [])[-per_suffix:]):
                if toks[end + 1] in seen:
                    continue
                seen.add(toks[end + 1])
                found.append(toks[end + 1 : end + 1 + length])
                if len(found) >= count:
                    return found
        return found


class WordKeys:
    """Token id -> its normalised word for NgramIndex(keys=...): the token's text without
    surrounding whitespace, lower-cased (" the", "The" and "the" share one key); a token that
    is only whitespace keeps its own text. Looked up lazily and remembered: `decode` maps a
    list of ids to text (a tokenizer's decode)."""

    def __init__(self, decode: Callable[[list[int]], str]):
        self._decode = decode
        self._keys: dict[int, str] = {}

    def __call__(self, token: int) -> str:
        key = self._keys.get(token)
        if key is None:
            text = self._decode([token])
            key = self._keys[token] = text.strip().lower() or text
        return key
