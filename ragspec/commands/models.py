"""`ragspec models`: the GGUF models Ollama and LM Studio keep on this machine, usable as --model.

One line per model: the spec to pass as --model, its size, quantisation and architecture read
from the GGUF header, and whether ragspec can run it (else the reason, in one line). Reads files
only (ragspec.models.local); exit status 0 also when nothing is found.
"""

from __future__ import annotations

import json

import click

from ragspec.commands.common import json_option
from ragspec.retrieval.readers.limits import size_text
from ragspec.terminal import printable


def _status(path) -> tuple[dict, str | None]:
    """(header facts, None if ragspec can run it else why not). The architecture is checked
    here; the quantisation and tokenizer are checked when the model is loaded."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    from ragspec.models.local import LocalModelError, describe

    try:
        facts = describe(path)
    except LocalModelError as exc:
        return {}, str(exc)
    arch = facts["architecture"]
    readable = [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer")]
    if arch not in readable:
        return facts, (f"GGUF architecture {arch!r} is not one transformers can read"
                       if arch else "a GGUF file without general.architecture")
    return facts, None


@click.command()
@json_option
def models(as_json: bool) -> None:
    """List the models Ollama (~/.ollama/models, or $OLLAMA_MODELS) and LM Studio
    (~/.lmstudio/models, ~/.cache/lm-studio/models) hold, with size and quantisation.

    Use one with --model ollama:NAME[:TAG] or --model lmstudio:NAME: the GGUF file is read
    where the tool keeps it, never copied.
    """
    from ragspec.models.local import (
        LocalModelError,
        discover,
        lmstudio_roots,
        local_gguf,
        ollama_root,
    )

    rows = []
    for found in discover():
        try:
            local_gguf(found.spec)
        except LocalModelError as exc:  # a manifest without a model layer, a missing blob
            facts, problem = {}, str(exc).removeprefix(f"{found.spec}: ")
        else:
            facts, problem = _status(found.path)
        rows.append({"spec": found.spec, "path": str(found.path), "bytes": found.size,
                     **{k: facts.get(k) for k in ("architecture", "quantisation", "name")},
                     "runs": problem is None, "problem": problem})
    if as_json:
        click.echo(json.dumps(rows))
        return
    if not rows:
        where = ", ".join(str(p) for p in [ollama_root(), *lmstudio_roots()])
        click.echo(f"no Ollama or LM Studio models found (looked in {printable(where)})")
        return
    width = max(len(r["spec"]) for r in rows)
    for r in rows:
        facts = ", ".join(str(r[k]) for k in ("quantisation", "architecture") if r[k])
        size = size_text(r["bytes"]) if r["bytes"] else "-"
        verdict = "" if r["runs"] else f"  cannot run: {r['problem']}"
        click.echo(printable(f"{r['spec']:<{width}}  {size:>10}  {facts}{verdict}"))


COMMANDS = [models]
