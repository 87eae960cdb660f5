"""Models: which generator to load and in which form — the bundled SmolLM2, a model folder, a
GGUF file or a cached hub id — and the packed copies made for this machine.

load (load_model: a spec in, a LoadedModel out) -> gguf (GGUF files converted once into the
model cache, keyed by content), hub (hub ids in the local cache; `ragspec pull`), local (the
GGUF files Ollama and LM Studio keep), weights (which weights a model runs with: --weights),
packed_cache (packed models stored once in the model cache and loaded back without
de-quantising). Imports the engine (ragspec.decoding) and the leaves; the engine never imports
this package.
"""
