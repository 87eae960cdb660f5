"""Parse one XML part of an office archive as a stream of events, keeping no tree.

Contract: `parse_part(archive, name, limits, handlers, what)` feeds part `name` (read through
`archive.read_part`: sizes checked before inflating, reads capped) to expat block by block,
calling `handlers` ("start", "end", "characters": expat's element handlers, names as
"namespace-uri local-name"). A DOCTYPE (office formats never write one; it is how XML entity
bombs start) or XML that is not well-formed is a LoadError naming `what` ("Word file").
"""

from __future__ import annotations

from xml.parsers import expat

from ragspec.retrieval.errors import LoadError
from ragspec.retrieval.readers.archive import read_part
from ragspec.retrieval.readers.limits import IngestLimits


def parse_part(archive, name: str, limits: IngestLimits, handlers: dict, what: str) -> None:
    def doctype(*args) -> None:
        raise LoadError(f"{name} declares a DOCTYPE, which a {what} never has; refused")

    parser = expat.ParserCreate(namespace_separator=" ")
    parser.StartElementHandler = handlers["start"]
    parser.EndElementHandler = handlers["end"]
    parser.CharacterDataHandler = handlers["characters"]
    parser.StartDoctypeDeclHandler = doctype
    try:
        for block in read_part(archive, name, limits):
            parser.Parse(block, False)
        parser.Parse(b"", True)
    except expat.ExpatError as exc:
        raise LoadError(
            f"the {what} is damaged: {name} is not well-formed XML ({exc}); re-save it"
        ) from exc
