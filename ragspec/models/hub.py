"""Hugging Face hub models in the local cache: find one, or download one (`ragspec pull`).

Contract: `cached_folder(repo_id)` returns the local snapshot folder of a model already in the
Hugging Face cache (never touching the network), or raises HubError saying to pull it.
`pull(repo_id)` downloads only what ragspec loads — safetensors weights, config, tokenizer and
chat-template files (`wanted`) — never pickled `.bin`/`.pt` weights, with the hub library's
progress bars, into the same cache; every failure (no network, downloads switched off, no such
repository, gated, no safetensors) is a HubError with one line that says which.

The cache is huggingface_hub's (HF_HUB_CACHE, default ~/.cache/huggingface/hub), read when each
function runs, so transformers, the hub CLI and ragspec all share one copy of a model.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

# Top-level files only: repositories also carry other formats in subfolders (onnx/, original/).
WANTED = (
    "*.safetensors", "*.safetensors.index.json", "config.json", "generation_config.json",
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
    "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt", "chat_template.jinja",
    "chat_template.json",
)


class HubError(RuntimeError):
    """A hub model that cannot be found or fetched; the message says what to do."""


def wanted(filename: str) -> bool:
    """True for a repository file ragspec needs (never a pickle: .bin, .pt, .pth, .ckpt)."""
    return "/" not in filename and any(fnmatch.fnmatchcase(filename, p) for p in WANTED)


def select_files(filenames) -> list[str]:
    """The files of a repository listing that `pull` downloads; a listing without safetensors
    weights is refused (ragspec does not load pickled weights)."""
    chosen = sorted(f for f in filenames if wanted(f))
    if not any(f.endswith(".safetensors") for f in chosen):
        formats = sorted({Path(f).suffix for f in filenames if Path(f).suffix in
                          (".bin", ".pt", ".pth", ".ckpt", ".gguf", ".onnx", ".h5", ".msgpack")})
        found = f" (it has {', '.join(formats)})" if formats else ""
        raise HubError(f"the repository has no safetensors weights{found}; ragspec loads "
                       f"safetensors only, never pickled weights")
    return chosen


def hub_cache() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def looks_like_id(spec: str) -> bool:
    """'owner/name': one slash, not a path."""
    return spec.count("/") == 1 and not spec.startswith(("/", ".", "~")) and all(spec.split("/"))


def cached_folder(repo_id: str) -> Path:
    """The model's snapshot folder in the local cache; HubError when it is not there."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(repo_id, local_files_only=True, cache_dir=hub_cache()))
    except LocalEntryNotFoundError:
        folder = None
    if folder is None or not (folder / "config.json").is_file():
        raise HubError(f"model {repo_id!r} is not in the local Hugging Face cache "
                       f"({hub_cache()}); run: ragspec pull {repo_id}")
    return folder


def _listing(repo_id: str, revision: str | None) -> list[str]:
    import httpx
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if constants.HF_HUB_OFFLINE:
        raise HubError("downloads are switched off (HF_HUB_OFFLINE is set): unset it to pull")
    try:
        return HfApi().list_repo_files(repo_id, revision=revision)
    except OfflineModeIsEnabled as exc:
        raise HubError("downloads are switched off (HF_HUB_OFFLINE is set): unset it to pull") from exc
    except GatedRepoError as exc:
        raise HubError(f"{repo_id} is gated: accept its terms on huggingface.co and log in "
                       f"(`hf auth login`), then pull again") from exc
    except RepositoryNotFoundError as exc:
        raise HubError(f"no model {repo_id!r} on the Hugging Face hub (or it is private: log in "
                       f"with `hf auth login`)") from exc
    except RevisionNotFoundError as exc:
        raise HubError(f"{repo_id} has no revision {revision!r}") from exc
    except httpx.HTTPError as exc:
        raise HubError(f"cannot reach the Hugging Face hub ({exc.__class__.__name__}: {exc}); "
                       f"check the network connection") from exc
    except HfHubHTTPError as exc:
        raise HubError(f"the Hugging Face hub refused the request: {str(exc).splitlines()[0]}") from exc


def pull(repo_id: str, revision: str | None = None) -> tuple[Path, list[str]]:
    """Download the wanted files of `repo_id` into the local cache; (snapshot folder, files)."""
    import httpx
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    if not looks_like_id(repo_id):
        raise HubError(f"{repo_id!r} is not a hub model id; give one like "
                       f"HuggingFaceTB/SmolLM2-360M-Instruct")
    files = select_files(_listing(repo_id, revision))
    try:
        folder = snapshot_download(repo_id, revision=revision, allow_patterns=files,
                                   cache_dir=hub_cache())
    except (httpx.HTTPError, HfHubHTTPError, OSError) as exc:
        raise HubError(f"download of {repo_id} failed ({exc.__class__.__name__}: "
                       f"{str(exc).splitlines()[0] if str(exc) else ''}); pull again to resume") from exc
    return Path(folder), files
