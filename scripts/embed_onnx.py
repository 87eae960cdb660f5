"""All-MiniLM-L6-v2 through onnxruntime (fp32) beside sentence-transformers, on the same passages.

Exports the bundled model's transformer to ONNX locally (torch.onnx, no network; needs the
`onnx` and `onnxruntime` packages, which ragspec does not depend on), mean-pools and normalises
as sentence-transformers does, and times both on the first --passages passages of a PDF, in
interleaved rounds with 2 threads each; prints the time ratio and how far the vectors differ.

    python scripts/embed_onnx.py /usr/share/doc/libtasn1-doc/libtasn1.pdf [--passages 64]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

INPUTS = ["input_ids", "attention_mask", "token_type_ids"]


def main(argv=None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import onnxruntime as ort
    import torch

    from ragspec.retrieval.embeddings import Embedder
    from ragspec.retrieval.loaders import load_file
    from ragspec.retrieval.passages import split_documents

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pdf")
    ap.add_argument("--passages", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    embedder = Embedder()
    docs = load_file(Path(args.pdf))
    texts = [d.text for d in split_documents(docs, embedder)][: args.passages]
    tokenizer = embedder.model.tokenizer

    class LastHidden(torch.nn.Module):
        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state

    model = LastHidden(embedder.model[0].auto_model.eval()).eval()
    sample = tokenizer(texts[:2], padding=True, return_tensors="pt")
    path = Path(tempfile.mkdtemp()) / "minilm.onnx"
    axes = {name: {0: "batch", 1: "tokens"} for name in [*INPUTS, "last"]}
    torch.onnx.export(model, tuple(sample[k] for k in INPUTS), str(path), input_names=INPUTS,
                      output_names=["last"], dynamic_axes=axes, opset_version=17, dynamo=False)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = args.threads, 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def onnx_embed(batch_texts: list[str], size: int = 32) -> np.ndarray:
        out = []
        for i in range(0, len(batch_texts), size):
            enc = tokenizer(batch_texts[i : i + size], padding=True, truncation=True,
                            max_length=embedder.max_tokens, return_tensors="np")
            last = session.run(None, {k: enc[k].astype(np.int64) for k in INPUTS})[0]
            mask = enc["attention_mask"][..., None].astype(np.float32)
            vectors = (last * mask).sum(1) / np.clip(mask.sum(1), 1e-9, None)
            out.append(vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
        return np.concatenate(out)

    embedder.embed_array(texts[:8])
    onnx_embed(texts[:8])  # both warmed, untimed
    for round_ in range(args.rounds):
        start = time.perf_counter()
        a = embedder.embed_array(texts)
        torch_s = time.perf_counter() - start
        start = time.perf_counter()
        b = onnx_embed(texts)
        onnx_s = time.perf_counter() - start
        print(f"round {round_}: {len(texts)} passages, torch {torch_s:.1f} s, onnx {onnx_s:.1f} s, "
              f"ratio {torch_s / onnx_s:.2f}, max |d| {np.abs(a - b).max():.2e}, "
              f"min cosine {(a * b).sum(1).min():.7f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
