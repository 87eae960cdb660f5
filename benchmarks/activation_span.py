"""What one int8 scale per 256 activation values (Q4_K/Q5_K's form) costs in quality, against one
per 32 (every other quantised format's), on real text.

    python benchmarks/activation_span.py [--docs 48] [--tokens 512] [--out FILE]

The bundled model with fp32 weights reads manual pages installed here (/usr/share/man, roff
markup stripped), teacher-forced, with every Linear's input as it is or rounded as the kernels
round it before an integer product (int8, d = max|x| / 127 over each span). Reported for each
form: perplexity and how often the top token equals the unrounded model's. Where an input's width
is not a multiple of 256 a real Q4_K file could not hold that weight, so "realistic" keeps such
inputs at 32; "pessimistic" rounds them over a half row (288 of the bundled model's 576), coarser
than 256, as a bound for models whose every width is a multiple of 256. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import math
import re
from pathlib import Path

import torch


def man_pages(count: int) -> list[tuple[str, str]]:
    pages = sorted(p for p in glob.glob("/usr/share/man/man*/*.gz") if "gcloud" not in p)
    if not pages:
        raise SystemExit("no manual pages under /usr/share/man (install man-db's pages)")
    step = max(1, len(pages) // count)
    out = []
    for path in pages[1::step][:count]:
        text = gzip.open(path, "rt", errors="replace").read()
        text = re.sub(r"^\.[A-Za-z]+\s?", "", text, flags=re.M)
        text = re.sub(r"\\f[BIRP]|\\-|\\\(..|\\&|\\e", "", text)
        out.append((Path(path).name, " ".join(text.split())[:4000]))
    return out


def rounded(x: torch.Tensor, span: int) -> torch.Tensor:
    """x with each run of `span` values along the last axis as the kernels' int8 form gives it back."""
    k = x.shape[-1]
    xs = x.reshape(*x.shape[:-1], k // span, span)
    d = xs.abs().amax(-1, keepdim=True) / 127
    safe = torch.where(d > 0, d, torch.ones_like(d))
    q = torch.where(d > 0, torch.round(xs / safe), torch.zeros_like(xs)).clamp(-127, 127)
    return (q * d).reshape(x.shape)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=48)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from ragspec import paths
    from ragspec.models.load import load_model

    loaded = load_model(None, paths.models_dir(), weights="fp32")
    model, tok = loaded.model, loaded.tokenizer
    model.eval()
    docs = man_pages(args.docs)
    mode: dict = {"span": None, "other": None}

    def hook(_module, inputs):
        x = inputs[0]
        if mode["span"] is None:
            return None
        k = x.shape[-1]
        span = mode["span"] if k % mode["span"] == 0 else mode["other"](k)
        return (rounded(x, span),)

    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            m.register_forward_pre_hook(hook)
    forms = {
        "fp32 (not rounded)": (None, None),
        "int8 per 32": (32, lambda k: 32),
        "int8 per 256, realistic (other widths per 32)": (256, lambda k: 32),
        "int8 per 256, pessimistic (other widths per half row)": (256, lambda k: k // 2),
    }
    results, reference = {}, None
    with torch.no_grad():
        for name, (span, other) in forms.items():
            mode.update(span=span, other=other)
            nll, n, tops = 0.0, 0, []
            for _, text in docs:
                ids = tok(text, return_tensors="pt").input_ids[:, :args.tokens]
                logits = model(ids).logits[0, :-1].float()
                target = ids[0, 1:]
                nll += torch.nn.functional.cross_entropy(logits, target, reduction="sum").item()
                n += target.numel()
                tops.append(logits.argmax(-1))
            reference = reference or tops
            same = sum(int((a == b).sum()) for a, b in zip(tops, reference, strict=True))
            results[name] = {"perplexity": round(math.exp(nll / n), 4), "tokens": n,
                             "top1_as_unrounded": round(same / n, 4)}
    report = {"model": "bundled SmolLM2-135M (fp32 weights)", "docs": [d for d, _ in docs],
              "results": results}
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
