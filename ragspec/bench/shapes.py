"""Random-weight models at the published shapes of real models, written as GGUF files.

Contract: `SHAPES` names a shape (e.g. "smollm2-1.7b") -> its transformers model type and the
published configuration values that set its cost (hidden size, layers, heads, vocabulary...).
`config(name)` is that transformers config; `write_gguf(name, fmt, path)` writes a GGUF file of
it with random weights in a llama.cpp quantisation mix — "Q4_0", "Q8_0" or "Q4_K_M" (Q4_K, with
Q6_K for the LM head and for attn_v/ffn_down in the layers llama.cpp's Q4_K_M gives more bits;
tensors whose rows are not whole 256-value super-blocks fall back as llama.cpp's quantiser
does: Q5_0 for Q4_K, Q8_0 for Q6_K). Tensor names and hyper-parameters come from gguf-py
(llama.cpp's own GGUF package) and transformers' GGUF mapping, read in reverse; the vocabulary
is a placeholder of the right size. Random weights measure cost, never answers: acceptance is
measured on the bundled model and replayed on these curves.

Every block is random bytes with its fp16 scales set to small finite values, so each block is a
valid block of its format whatever the other bits are.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

# name -> (model_type, published configuration values). Tied embeddings where the model ties.
SHAPES: dict[str, tuple[str, dict]] = {
    "smollm2-135m": ("llama", dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                                   tie_word_embeddings=True)),
    "smollm2-360m": ("llama", dict(hidden_size=960, intermediate_size=2560, num_hidden_layers=32,
                                   num_attention_heads=15, num_key_value_heads=5, vocab_size=49152,
                                   tie_word_embeddings=True)),
    "smollm2-1.7b": ("llama", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
                                   num_attention_heads=32, num_key_value_heads=32,
                                   vocab_size=49152, tie_word_embeddings=True)),
    "llama-3.2-1b": ("llama", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                   num_attention_heads=32, num_key_value_heads=8,
                                   vocab_size=128256, tie_word_embeddings=True)),
    "qwen2.5-0.5b": ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                   num_attention_heads=14, num_key_value_heads=2,
                                   vocab_size=151936, tie_word_embeddings=True)),
    "qwen2.5-1.5b": ("qwen2", dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                   num_attention_heads=12, num_key_value_heads=2,
                                   vocab_size=151936, tie_word_embeddings=True)),
    "qwen3-0.6b": ("qwen3", dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                 vocab_size=151936, tie_word_embeddings=True)),
    "gemma-3-270m": ("gemma3_text", dict(hidden_size=640, intermediate_size=2048,
                                         num_hidden_layers=18, num_attention_heads=4,
                                         num_key_value_heads=1, head_dim=256, vocab_size=262144,
                                         sliding_window=512)),
    "gemma-3-1b": ("gemma3_text", dict(hidden_size=1152, intermediate_size=6912,
                                       num_hidden_layers=26, num_attention_heads=4,
                                       num_key_value_heads=1, head_dim=256, vocab_size=262144,
                                       sliding_window=512)),
    "gemma-2-2b": ("gemma2", dict(hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                                  num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                                  vocab_size=256000, sliding_window=4096,
                                  attn_logit_softcapping=50.0, final_logit_softcapping=30.0)),
    "phi-3-mini": ("phi3", dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                                num_attention_heads=32, num_key_value_heads=32, vocab_size=32064)),
    "gpt2": ("gpt2", dict(n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=1024)),
    "pythia-410m": ("gpt_neox", dict(hidden_size=1024, intermediate_size=4096,
                                     num_hidden_layers=24, num_attention_heads=16,
                                     vocab_size=50304, rotary_pct=0.25)),
    "olmo-2-1b": ("olmo2", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                num_attention_heads=16, num_key_value_heads=16,
                                vocab_size=100352)),
    "granite-3.3-2b": ("granite", dict(hidden_size=2048, intermediate_size=8192,
                                       num_hidden_layers=40, num_attention_heads=32,
                                       num_key_value_heads=8, vocab_size=49159,
                                       tie_word_embeddings=True)),
    "smollm3-3b": ("smollm3", dict(hidden_size=2048, intermediate_size=11008,
                                   num_hidden_layers=36, num_attention_heads=16,
                                   num_key_value_heads=4, vocab_size=128256,
                                   tie_word_embeddings=True)),
    "mistral-7b": ("mistral", dict(hidden_size=4096, intermediate_size=14336,
                                   num_hidden_layers=32, num_attention_heads=32,
                                   num_key_value_heads=8, vocab_size=32768)),
}
FORMATS = ("Q4_0", "Q4_K_M", "Q8_0")
CONTEXT = 4096  # positions every shape is configured for


def config(name: str):
    from transformers import AutoConfig

    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; known: {', '.join(SHAPES)}")
    model_type, values = SHAPES[name]
    positions = "n_positions" if model_type == "gpt2" else "max_position_embeddings"
    cfg = AutoConfig.for_model(model_type, **{positions: CONTEXT, **values})
    cfg._name_or_path = f"shape:{name}"
    return cfg


def multiply_accumulates(name: str) -> int:
    """Multiply-accumulates per token in the shape's linear layers and LM head (a tied head
    multiplies the embedding): the arithmetic of a forward, attention aside."""
    from ragspec.models.packed_cache import meta_model_from_config, targets

    model = meta_model_from_config(config(name))
    kinds = targets(model)
    macs = sum(p.numel() for n, p in model.named_parameters()
               if kinds.get(n) in ("linear", "conv1d"))
    if model.get_output_embeddings() is not None and "lm_head.weight" not in dict(model.named_parameters()):
        macs += model.get_input_embeddings().weight.numel()
    return macs


# -- which format each tensor gets ----------------------------------------------------------------

_FALLBACK = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}  # rows that are not whole super-blocks


def _more_bits(layer: int, layers: int) -> bool:
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def tensor_format(mix: str, gguf_name: str, k: int, layers: int) -> str:
    """The format a 2-D tensor gets in a `mix` file (see the module docstring)."""
    if mix == "Q8_0":
        fmt = "Q8_0"
    elif gguf_name == "output.weight":
        fmt = "Q6_K"
    elif mix == "Q4_0":
        fmt = "Q4_0"
    else:
        fmt = "Q4_K"
        parts = gguf_name.split(".")
        if parts[0] == "blk" and parts[2] in ("attn_v", "ffn_down") and _more_bits(int(parts[1]), layers):
            fmt = "Q6_K"
    if k % 256 and fmt in _FALLBACK:
        fmt = _FALLBACK[fmt]
    return fmt


# Byte offsets of each format's fp16 scales (and their magnitude) within a block.
_SCALES = {"Q4_0": [(0, 0.02)], "Q5_0": [(0, 0.02)], "Q8_0": [(0, 0.005)],
           "Q4_K": [(0, 0.002), (2, 0.002)], "Q6_K": [(208, 0.001)]}


def random_blocks(fmt: str, rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """(rows, bytes per row) random blocks of `fmt` with finite, small fp16 scales."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    per_block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[fmt]]
    blocks = rng.integers(0, 256, size=(rows, k // per_block, block_bytes), dtype=np.uint8)
    for offset, scale in _SCALES[fmt]:
        d = (rng.random((rows, k // per_block), dtype=np.float32) * scale + scale / 4)
        blocks[:, :, offset:offset + 2] = d.astype(np.float16).view(np.uint8).reshape(rows, -1, 2)
    return blocks.reshape(rows, -1)


# -- the file ---------------------------------------------------------------------------------------

def _gguf_arch(model_type: str) -> str:
    return {"gemma3_text": "gemma3", "gpt_neox": "gptneox"}.get(model_type, model_type)


def _hparams(writer, arch: str, cfg) -> None:
    """The config values transformers reads from a GGUF file of this architecture, written
    under the keys it reads them from."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    mapping = {k: v for k, v in GGUF_CONFIG_MAPPING.get(arch, {}).items()
               if k not in ("attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon",
                            "rope.freq_base")}
    for gguf_key, hf_key in list(mapping.items()):
        value = getattr(cfg, hf_key, None) if hf_key else None
        if value is None or isinstance(value, (list, dict)):
            del mapping[gguf_key]
            continue
        key = f"{arch}.{gguf_key}"
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
    written = {f"{arch}.{k}" for k in mapping}
    hidden, layers = cfg.hidden_size, cfg.num_hidden_layers
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    # what llama.cpp reads for every architecture, where transformers' mapping has no entry
    standard = {
        "context_length": getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", CONTEXT),
        "embedding_length": hidden, "block_count": layers,
        "feed_forward_length": getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 4 * hidden,
        "attention.head_count": heads,
        "attention.head_count_kv": getattr(cfg, "num_key_value_heads", None) or heads,
    }
    for key, value in standard.items():
        if f"{arch}.{key}" not in written:
            writer.add_uint32(f"{arch}.{key}", int(value))
    eps = getattr(cfg, "rms_norm_eps", None)
    if eps is not None:
        writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", float(eps))
    eps = getattr(cfg, "layer_norm_epsilon", None) or getattr(cfg, "layer_norm_eps", None)
    if eps is not None:
        writer.add_float32(f"{arch}.attention.layer_norm_epsilon", float(eps))
    for key, attr in (("attention.scale", "attention_multiplier"), ("embedding_scale", "embedding_multiplier"),
                      ("residual_scale", "residual_multiplier"), ("logit_scale", "logits_scaling")):
        if getattr(cfg, attr, None) is not None:  # Granite's multipliers
            writer.add_float32(f"{arch}.{key}", float(getattr(cfg, attr)))
    writer.add_uint32(f"{arch}.attention.key_length", head_dim)
    writer.add_uint32(f"{arch}.attention.value_length", head_dim)
    theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta")
    if theta:
        writer.add_float32(f"{arch}.rope.freq_base", float(theta))


def write_gguf(name: str, mix: str, path: Path | str, seed: int = 0) -> Path:
    """The shape `name` as a GGUF file of random weights in quantisation mix `mix`."""
    import gguf
    from gguf import get_tensor_name_map

    from ragspec.models.packed_cache import meta_model_from_config, targets

    if mix not in FORMATS:
        raise ValueError(f"unknown quantisation mix {mix!r}; known: {', '.join(FORMATS)}")
    cfg = config(name)
    model = meta_model_from_config(cfg)
    arch = _gguf_arch(cfg.model_type)
    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    name_map = get_tensor_name_map(arch_id, cfg.num_hidden_layers)
    kinds = targets(model)
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), arch)
    _hparams(writer, arch, cfg)
    writer.add_tokenizer_model("llama")  # a placeholder vocabulary of the right size
    tokens = ["<unk>", "<s>", "</s>", *[f"<0x{b:02X}>" for b in range(256)]]
    tokens += [f"t{i}" for i in range(cfg.vocab_size - len(tokens))]
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types([2, 3, 3, *[6] * 256, *[1] * (len(tokens) - 259)])
    seen: set[int] = set()
    for hf_name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            continue  # a tied weight is written once
        seen.add(id(tensor))
        base, _, suffix = hf_name.rpartition(".")
        gguf_name = name_map.get_name(base)
        if gguf_name is None:
            continue
        gguf_name += f".{suffix}"
        shape = tuple(tensor.shape)
        if kinds.get(hf_name) and len(shape) == 2:
            rows, k = (shape[1], shape[0]) if kinds[hf_name] == "conv1d" else shape
            fmt = tensor_format(mix, gguf_name, k, cfg.num_hidden_layers)
            writer.add_tensor(gguf_name, random_blocks(fmt, rows, k, rng),
                              raw_dtype=gguf.GGMLQuantizationType[fmt])
        else:
            values = 1.0 + 0.01 * rng.standard_normal(shape, dtype=np.float32)
            writer.add_tensor(gguf_name, values.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)
    writer.close()
    return Path(path)


def random_entries(name: str, mix: str, seed: int = 0) -> dict:
    """The packed entries of shape `name` in mix `mix` with random weights, without a GGUF
    file (families whose GGUF files transformers cannot map, e.g. GPT-NeoX)."""
    import torch

    from ragspec.decoding.packed import PackedWeight
    from ragspec.models.packed_cache import meta_model_from_config, targets

    cfg = config(name)
    model = meta_model_from_config(cfg)
    kinds = targets(model)
    rng = np.random.default_rng(seed)
    head = model.get_output_embeddings()
    head_name = next((n for n, m in model.named_modules() if m is head), None)
    entries, seen = {}, {}
    for hf_name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            entries[hf_name] = seen[id(tensor)]
            continue
        shape = tuple(tensor.shape)
        if kinds.get(hf_name) and len(shape) == 2:
            rows, k = (shape[1], shape[0]) if kinds[hf_name] == "conv1d" else shape
            layer = next((int(p) for p in hf_name.split(".") if p.isdigit()), 0)
            role = "output.weight" if hf_name == f"{head_name}.weight" else (
                f"blk.{layer}.attn_v.weight" if "v_proj" in hf_name else
                f"blk.{layer}.ffn_down.weight" if "down" in hf_name else f"blk.{layer}.x.weight")
            fmt = tensor_format(mix, role, k, cfg.num_hidden_layers)
            value = PackedWeight(torch.from_numpy(random_blocks(fmt, rows, k, rng)), fmt, k)
        else:
            value = torch.from_numpy(1.0 + 0.01 * rng.standard_normal(shape, dtype=np.float32))
        entries[hf_name] = seen[id(tensor)] = value
    return entries
