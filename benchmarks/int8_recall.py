"""ragspec/eval/retrieval.py with the bundled embedder replaced by an int8 build (measurement only).

The int8 builds are not options of the product (docs/documents-and-search.md, "int8 weights"); this runs the
retrieval evaluation with one of them in place of the torch forward, so its recall can be set
beside the default's:

  onnx8   the transformer in onnxruntime with int8 weights (onnx_embed's build="int8")
  torch8  torch's dynamic int8 of every Linear layer (benchmarks/embed_speed.py's torch8)

    PYTHONPATH=. python benchmarks/int8_recall.py onnx8|torch8 [retrieval_eval options]
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    from benchmarks import embed_speed
    from ragspec.eval import retrieval as retrieval_eval
    from ragspec.retrieval.embeddings import embedder as embeddings

    build, rest = argv[0], argv[1:]
    if build not in ("onnx8", "torch8"):
        raise SystemExit(__doc__)
    load = embeddings.Embedder._load

    def int8_load(self):
        model = load(self)
        if build == "torch8":
            embed_speed.quantise_linear(model)
        else:
            self._model = model
            self._encoder = embed_speed.int8_encoder(self)
        return model

    embeddings.Embedder._load = int8_load
    retrieval_eval.main(rest)


if __name__ == "__main__":
    main(sys.argv[1:])
