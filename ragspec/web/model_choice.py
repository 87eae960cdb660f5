"""The generators the chat may use: a list the server's owner sets, and a bounded cache of them.

Contract:
  * The owner names the models when starting the server (`ragspec ui --model A --model B`,
    each `SPEC` or `NAME=SPEC`; SPEC as for `--model` everywhere: a folder, a cached hub id, or
    "bundled"). The list reaches the page through the environment (MODELS_ENV, JSON), so the
    browser only ever sees and sends NAMES: a name not on the list is refused, and no browser
    input becomes a path or an id.
  * A name defaults to the folder's last component (never the whole server path) or the hub
    id; two models with the same name are an error that says to use NAME=SPEC.
  * A SPEC that is an http(s) URL is an OpenAI-compatible server (ragspec.remote; `URL#MODEL`
    picks its model id): the page offers it by name (a bare URL is named by its host and
    port), and answers are generated there.
  * `ModelRegistry.get(name)` loads on first use and keeps at most `max_loaded` generators
    (default: the length of the list), dropping the least recently used one. When a load
    fails, the models dropped to make room for it are loaded again before the error is raised:
    a broken entry in the list cannot take a working model down.
  * `loading_seconds(name)` says how long the load of `name` under way has taken (None when
    none is), so a page waiting for a first start (kernels built, model converted: minutes on
    a busy machine) can show that it moves.
  * `warm_default(registry, before)` starts, once per registry, a background load of the first
    model on the list (after `before()`, the embedder's load) when the page first runs, unless
    WARM_ENV is "0": a newcomer's first question then waits for what is left of the load, if
    anything, not for all of it. A failed warm-up is logged; the question's own load says why.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

MODELS_ENV = "RAGSPEC_UI_MODELS"
MAX_LOADED_ENV = "RAGSPEC_UI_MAX_LOADED"
WARM_ENV = "RAGSPEC_UI_WARM"
BUNDLED_SPEC = "bundled"
BUNDLED_LABEL = "SmolLM2-135M-Instruct (bundled)"
logger = logging.getLogger(__name__)


class ModelNotOffered(ValueError):
    """The page asked for a model the server's owner did not list."""


@dataclass(frozen=True)
class ModelChoice:
    """One model the chat offers: the name users see, the spec the server loads."""

    name: str
    spec: str

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise ValueError("a model's name must not be empty: use NAME=SPEC")
        if not self.spec.strip():
            raise ValueError(f"model {self.name!r} has an empty spec: give a folder, a cached "
                             f"hub id or 'bundled'")


def parse_choice(value: str) -> ModelChoice:
    """`SPEC` or `NAME=SPEC` (a NAME holds no path separator)."""
    name, sep, spec = value.partition("=")
    if sep and name and "/" not in name and os.sep not in name:
        return ModelChoice(name.strip(), spec.strip())
    spec = value.strip()
    if spec in ("", BUNDLED_SPEC):
        return ModelChoice(BUNDLED_LABEL, BUNDLED_SPEC)
    if spec.startswith(("http://", "https://")):
        from urllib.parse import urlsplit

        return ModelChoice(urlsplit(spec).netloc or spec, spec)
    path = Path(spec).expanduser()
    return ModelChoice(path.name if path.exists() else spec, spec)


def parse_choices(values: Sequence[str]) -> list[ModelChoice]:
    """The owner's list (empty: the bundled model only); duplicate names are a ValueError."""
    choices = [parse_choice(v) for v in values] or [ModelChoice(BUNDLED_LABEL, BUNDLED_SPEC)]
    seen: dict[str, str] = {}
    for c in choices:
        if c.name in seen:
            raise ValueError(f"two models are named {c.name!r} ({seen[c.name]} and {c.spec}); "
                             f"name them apart with NAME=SPEC")
        seen[c.name] = c.spec
    return choices


def to_env(choices: Sequence[ModelChoice]) -> str:
    return json.dumps([[c.name, c.spec] for c in choices])


def from_env(environ: Mapping[str, str] = os.environ) -> tuple[ModelChoice, ...]:
    """The list `ragspec ui` passed on (the bundled model when the page runs on its own)."""
    raw = environ.get(MODELS_ENV)
    if not raw:
        return (ModelChoice(BUNDLED_LABEL, BUNDLED_SPEC),)
    try:
        pairs = json.loads(raw)
        choices = tuple(ModelChoice(str(name), str(spec)) for name, spec in pairs)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{MODELS_ENV} must be a JSON list of [name, spec] pairs ({exc})") from exc
    if not choices:
        raise ValueError(f"{MODELS_ENV} lists no model")
    return choices


def max_loaded_from_env(choices: Sequence[ModelChoice],
                        environ: Mapping[str, str] = os.environ) -> int:
    raw = environ.get(MAX_LOADED_ENV)
    if not raw:
        return len(choices)
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{MAX_LOADED_ENV}={raw!r} is not a whole number") from None
    if value < 1:
        raise ValueError(f"{MAX_LOADED_ENV} must be >= 1, got {value}")
    return min(value, len(choices))


def _default_loader(spec: str):
    if spec.startswith(("http://", "https://")):
        from ragspec.remote import connect

        return connect(spec)
    from ragspec.loading import load_generator

    return load_generator(None if spec == BUNDLED_SPEC else spec)


class ModelRegistry:
    """Loaded generators for the offered models (see the module docstring). Thread-safe."""

    def __init__(self, choices: Sequence[ModelChoice], *, max_loaded: int | None = None,
                 loader: Callable[[str], tuple] = _default_loader) -> None:
        self.choices = tuple(choices)
        if not self.choices:
            raise ValueError("offer at least one model")
        self.max_loaded = max_loaded or len(self.choices)
        if self.max_loaded < 1:
            raise ValueError(f"max_loaded must be >= 1, got {self.max_loaded}")
        self._specs = {c.name: c.spec for c in self.choices}
        self._loader = loader
        self._loaded: OrderedDict[str, tuple] = OrderedDict()
        self._loading_since: dict[str, float] = {}  # name -> time.monotonic() its load began
        self._lock = threading.Lock()
        self.warmed: str | None = None  # the model a warm-up was started for (once)
        self._warm_lock = threading.Lock()

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.choices]

    # Reads take no lock: a load holds it for tens of seconds, and a page asking "is it
    # loaded?" must not wait for that (reading a dict is atomic under the GIL).
    def loaded_names(self) -> list[str]:
        return list(self._loaded)

    def is_loaded(self, name: str) -> bool:
        return name in self._loaded

    def loading_seconds(self, name: str) -> float | None:
        """Seconds the load of `name` under way has taken; None when it is not being loaded."""
        since = self._loading_since.get(name)
        return None if since is None else max(0.0, time.monotonic() - since)

    def is_bundled(self, name: str) -> bool:
        return self._specs.get(name) == BUNDLED_SPEC

    def get(self, name: str):
        """(LoadedModel, Generator) for an offered name; loads it on first use."""
        if name not in self._specs:
            raise ModelNotOffered(f"{name!r} is not one of the models this server offers")
        with self._lock:  # one load at a time: two would need twice the memory at once
            if name in self._loaded:
                self._loaded.move_to_end(name)
                return self._loaded[name]
            dropped = []
            while len(self._loaded) >= self.max_loaded:
                # Dropped before the load, so the memory is free for it (max_loaded is a bound
                # on memory); the references go, and a failed load brings them back below.
                gone, _ = self._loaded.popitem(last=False)
                dropped.append(gone)
                logger.info("unloading model %s to make room", gone)
            self._loading_since[name] = time.monotonic()
            try:
                self._loaded[name] = self._loader(self._specs[name])
            except BaseException:
                self._restore(dropped)
                raise
            finally:
                self._loading_since.pop(name, None)
            return self._loaded[name]

    def warm(self, name: str, before: Callable[[], object] | None = None) -> bool:
        """Load `name` in a background thread (after before(), if given), once per registry;
        True when this call started it. Errors are logged, never raised: the next get() of
        `name` loads again and says why."""
        with self._warm_lock:  # not the load lock: a load holds that for tens of seconds
            if self.warmed is not None or name not in self._specs or name in self._loaded:
                return False
            self.warmed = name

        def run() -> None:
            try:
                if before is not None:
                    before()
                self.get(name)
            except Exception:  # noqa: BLE001 - a warm-up must never take the page down
                logger.exception("warming up model %s failed", name)

        threading.Thread(target=run, name=f"ragspec-warm-{name}", daemon=True).start()
        return True

    def _restore(self, names: list[str]) -> None:
        for name in reversed(names):  # back in their old places, least recently used first
            try:
                self._loaded[name] = self._loader(self._specs[name])
                self._loaded.move_to_end(name, last=False)
                logger.info("loaded model %s again after a failed load", name)
            except Exception:  # it loaded before; say so in the log and keep serving others
                logger.exception("could not load model %s again", name)


def warm_default(registry: ModelRegistry, before: Callable[[], object] | None = None) -> bool:
    """Warm the registry's first model (see the module docstring) unless WARM_ENV is "0"."""
    if os.environ.get(WARM_ENV, "").strip() == "0":
        return False
    return registry.warm(registry.names[0], before)


_registries: OrderedDict[tuple, ModelRegistry] = OrderedDict()
_registries_lock = threading.Lock()


def registry_for(choices: Sequence[ModelChoice], max_loaded: int) -> ModelRegistry:
    """The process's registry for this offered list, shared by every session. Keyed by the list,
    so a page started with other models gets its own (the latest two lists are kept)."""
    key = (tuple(choices), max_loaded)
    with _registries_lock:
        if key not in _registries:
            _registries[key] = ModelRegistry(choices, max_loaded=max_loaded)
            while len(_registries) > 2:
                _registries.popitem(last=False)
        _registries.move_to_end(key)
        return _registries[key]
