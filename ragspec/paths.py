"""Where ragspec keeps its data: one directory, set by RAGSPEC_HOME.

Default: ~/.ragspec. Inside it: index/ (the FAISS index and passages), chats and accounts.
--index DIR overrides the index per command.

What ragspec derives from files that are not the user's data is kept once per machine, in the
user's cache folder, `cache_root()` ($RAGSPEC_CACHE_DIR, else $XDG_CACHE_HOME or ~/.cache,
/ragspec), shared by every RAGSPEC_HOME, so a new data folder (a second checkout, `make` beside
a plain shell) never pays for it again:
  - `kernels_dir()`, the compiled CPU kernels ($RAGSPEC_KERNELS_DIR moves them): a build
    depends on the CPU, the compiler, torch and the sources (its key), never on RAGSPEC_HOME;
  - `models_dir()`, the model cache: converted generator weights (keyed by the file they come
    from), measured forward costs (keyed by machine and kernel build), exported embedders.
    $RAGSPEC_MODEL_CACHE moves it (tests share one converted copy that way); a data folder that
    already has its own models/ (made before the cache moved, 2026-12-06) keeps using it.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "RAGSPEC_HOME"


def home() -> Path:
    value = os.environ.get(ENV_VAR)
    return Path(value).expanduser() if value else Path.home() / ".ragspec"


def index_dir(override: str | os.PathLike | None = None) -> Path:
    return Path(override).expanduser() if override else home() / "index"


MODEL_CACHE_ENV = "RAGSPEC_MODEL_CACHE"


CACHE_ENV = "RAGSPEC_CACHE_DIR"


def cache_root() -> Path:
    """ragspec's cache folder on this machine: $RAGSPEC_CACHE_DIR, else the user's cache folder
    ($XDG_CACHE_HOME, else ~/.cache) /ragspec."""
    value = os.environ.get(CACHE_ENV)
    if value:
        return Path(value).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME")
    return (Path(cache).expanduser() if cache else Path.home() / ".cache") / "ragspec"


def models_dir(override: str | os.PathLike | None = None) -> Path:
    """The model cache (see the module docstring): `override`, else $RAGSPEC_MODEL_CACHE, else
    the data folder's own models/ where it has one, else cache_root()/models."""
    value = override or os.environ.get(MODEL_CACHE_ENV)
    if value:
        return Path(value).expanduser()
    own = home() / "models"
    return own if own.is_dir() else cache_root() / "models"


KERNELS_ENV = "RAGSPEC_KERNELS_DIR"


def kernels_dir() -> Path:
    """Where compiled kernels are kept, shared by every RAGSPEC_HOME (see the module docstring)."""
    value = os.environ.get(KERNELS_ENV)
    return Path(value).expanduser() if value else cache_root() / "kernels"
