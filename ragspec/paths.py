"""Where ragspec keeps its data: one directory, set by RAGSPEC_HOME.

Default: ~/.ragspec. Inside it: index/ (the FAISS index and passages) and models/ (converted
generator weights and measured forward costs). --index DIR overrides the index per command;
RAGSPEC_MODEL_CACHE moves models/ elsewhere (tests share one converted copy that way).
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
