"""The chat's warm-up: the first model on the list (and the embedder before it) loads in the
background when the page first runs, once per registry, so a newcomer's first question waits for
what is left of the load. Fake loaders for the registry; the page itself under AppTest, with the
warm-up recorded instead of run."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from ragspec.web import model_choice as ui_models
from ragspec.web.model_choice import ModelChoice, ModelRegistry

APP = str(Path(__file__).resolve().parents[2] / "ragspec" / "web" / "page.py")


def test_a_warm_up_loads_once_in_the_background_after_its_before_step():
    order, release = [], threading.Event()

    def loader(spec):
        release.wait(30)
        order.append(("load", spec))
        return ("loaded", spec)

    registry = ModelRegistry([ModelChoice("a", "/m/a"), ModelChoice("b", "/m/b")], loader=loader)
    assert registry.warm("a", before=lambda: order.append(("before",)))
    assert not registry.warm("a") and not registry.warm("b")  # once per registry
    assert order == [("before",)] or order == []  # the load waits: the page is not held up
    release.set()
    assert registry.get("a") == ("loaded", "/m/a")  # waits for the warm-up's load, no second
    assert order == [("before",), ("load", "/m/a")]
    assert registry.loaded_names() == ["a"]


def test_a_failed_warm_up_is_logged_and_the_questions_own_load_says_why(caplog):
    calls = []

    def loader(spec):
        calls.append(spec)
        raise OSError(f"cannot read {spec}")

    registry = ModelRegistry([ModelChoice("a", "/m/a")], loader=loader)
    done = threading.Event()
    assert registry.warm("a", before=done.set)
    done.wait(10)
    for _ in range(100):  # the thread logs, then ends
        if "warming up model a failed" in caplog.text:
            break
        threading.Event().wait(0.05)
    assert "warming up model a failed" in caplog.text
    with pytest.raises(OSError, match="cannot read /m/a"):
        registry.get("a")
    assert calls == ["/m/a", "/m/a"]


def test_an_unknown_or_loaded_model_is_not_warmed_and_the_setting_turns_it_off(monkeypatch):
    registry = ModelRegistry([ModelChoice("a", "/m/a")], loader=lambda spec: ("m", spec))
    assert not registry.warm("nope")
    registry.get("a")
    assert not registry.warm("a")
    other = ModelRegistry([ModelChoice("a", "/m/a")], loader=lambda spec: ("m", spec))
    monkeypatch.setenv(ui_models.WARM_ENV, "0")
    assert not ui_models.warm_default(other) and other.warmed is None


def test_the_page_warms_the_first_offered_model_with_the_embedder_first(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("RAGSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RAGSPEC_AUTH", "single-user")
    for name in ("RAGSPEC_UI_INDEX", "RAGSPEC_UI_MAX_LOADED"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(ui_models.MODELS_ENV, '[["first", "/m/first"], ["second", "/m/second"]]')
    monkeypatch.setenv(ui_models.WARM_ENV, "1")
    seen = []
    monkeypatch.setattr(ModelRegistry, "warm",
                        lambda self, name, before=None: seen.append((name, before)) or True)
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    assert not at.exception, at.exception
    assert [name for name, _ in seen][:1] == ["first"], seen
    assert seen[0][1] is not None and seen[0][1].__name__ == "warm_embedder"
