"""Where an accepted draft came from: a position in the sequence, and for copies out of a
registered passage, which passage and which of its characters.

Contract: pure function of positions and SourceRegions; no model, no text.
"""

from __future__ import annotations

from collections.abc import Sequence

from ragspec.decoding.types import SourceRegion, SpanOrigin


def locate_origin(position: int, count: int, prompt_length: int,
                  sources: Sequence[SourceRegion] = ()) -> SpanOrigin:
    """The origin of `count` tokens copied from `position` of the sequence (prompt, then output).

    A copy that starts inside a SourceRegion gets that region's label and the character range
    of the passage covered by the copied tokens (clipped at the region's end: a copy may run on
    past the passage into the prompt text that follows it).
    """
    if position >= prompt_length:
        return SpanOrigin(position=position, in_prompt=False)
    last = position + max(count, 1) - 1
    for region in sources:
        if region.token_start <= position < region.token_end:
            last = min(last, region.token_end - 1)
            return SpanOrigin(
                position=position,
                in_prompt=True,
                source=region.source,
                char_start=region.char_offsets[position - region.token_start][0],
                char_end=region.char_offsets[last - region.token_start][1],
            )
    return SpanOrigin(position=position, in_prompt=True)
