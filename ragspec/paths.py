"""Where ragspec keeps its data: one directory, set by RAGSPEC_HOME.

Default: ~/.ragspec. Inside it: index/ (the FAISS index and passages) and models/ (converted
generator weights and measured forward costs). --index DIR overrides the index per command;
RAGSPEC_MODEL_CACHE moves models/ elsewhere (tests share one converted copy that way).

The compiled CPU kernels are not data: a build depends on the CPU, the compiler, torch and the
sources (its key), never on RAGSPEC_HOME, so every data folder on a machine shares one cache of
them, `kernels_dir()`: $RAGSPEC_KERNELS_DIR, else the user's cache folder ($XDG_CACHE_HOME, else
~/.cache) /ragspec/kernels. A new RAGSPEC_HOME (a second checkout, `make` beside a plain shell)
then never compiles them again.
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


def models_dir(override: str | os.PathLike | None = None) -> Path:
    value = override or os.environ.get(MODEL_CACHE_ENV)
    return Path(value).expanduser() if value else home() / "models"


KERNELS_ENV = "RAGSPEC_KERNELS_DIR"


def kernels_dir() -> Path:
    """Where compiled kernels are kept, shared by every RAGSPEC_HOME (see the module docstring)."""
    value = os.environ.get(KERNELS_ENV)
    if value:
        return Path(value).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME")
    return (Path(cache).expanduser() if cache else Path.home() / ".cache") / "ragspec" / "kernels"
