"""Models chosen from the owner's list: `ragspec ui --model A --model B` becomes a selectbox of
names (no path reaches the browser, no text box lets a browser name one), answers use the chosen
model, a name off the list is refused, and at most `max_loaded` generators stay in memory."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from ui_support import (
    element_strings,
    fast_page,
    new_session,
    saved_chat,
    settle,
    tiny_model_folder,
)

from ragspec.cli import main
from ragspec.commands.ui import streamlit_env
from ragspec.web import model_choice as um


def test_names_default_to_the_folder_name_or_the_hub_id(tmp_path):
    folder = tmp_path / "deep" / "my-model"
    folder.mkdir(parents=True)
    assert um.parse_choice(str(folder)) == um.ModelChoice("my-model", str(folder))
    assert um.parse_choice("HuggingFaceTB/SmolLM2-360M-Instruct").name == \
        "HuggingFaceTB/SmolLM2-360M-Instruct"
    assert um.parse_choice("fast=" + str(folder)) == um.ModelChoice("fast", str(folder))
    assert um.parse_choice("bundled") == um.ModelChoice(um.BUNDLED_LABEL, "bundled")
    assert um.parse_choices([]) == [um.ModelChoice(um.BUNDLED_LABEL, "bundled")]
    (tmp_path / "other" / "my-model").mkdir(parents=True)
    with pytest.raises(ValueError, match="NAME=SPEC"):
        um.parse_choices([str(folder), str(tmp_path / "other" / "my-model")])


def test_the_list_travels_through_the_environment(tmp_path):
    env = streamlit_env(None, ("a=/models/a", "bundled"), max_loaded=1)
    choices = um.from_env(env)
    assert choices == (um.ModelChoice("a", "/models/a"), um.ModelChoice(um.BUNDLED_LABEL, "bundled"))
    assert um.max_loaded_from_env(choices, env) == 1
    assert um.from_env({}) == (um.ModelChoice(um.BUNDLED_LABEL, "bundled"),)
    with pytest.raises(ValueError, match="JSON list"):
        um.from_env({um.MODELS_ENV: "/etc"})


def test_the_registry_loads_only_offered_models_and_keeps_at_most_max_loaded():
    loads = []

    def loader(spec):
        loads.append(spec)
        return ("loaded", spec)

    reg = um.ModelRegistry([um.ModelChoice("a", "/m/a"), um.ModelChoice("b", "/m/b"),
                            um.ModelChoice("c", "/m/c")], max_loaded=2, loader=loader)
    assert reg.get("a") == ("loaded", "/m/a") and reg.get("a") == ("loaded", "/m/a")
    reg.get("b")
    reg.get("a")  # a is now the most recently used
    reg.get("c")
    assert reg.loaded_names() == ["a", "c"] and loads == ["/m/a", "/m/b", "/m/c"]
    for bad in ("/m/a", "/etc", "d", ""):
        with pytest.raises(um.ModelNotOffered):
            reg.get(bad)
    assert loads == ["/m/a", "/m/b", "/m/c"]


def test_ui_command_refuses_two_models_with_one_name(tmp_path):
    result = CliRunner().invoke(main, ["ui", "--model", "x=/a", "--model", "x=/b"])
    assert result.exit_code == 2 and "two models are named 'x'" in result.output
    assert "Traceback" not in result.output


@pytest.fixture
def two_models(tmp_path, monkeypatch):
    one = tiny_model_folder(tmp_path / "secret" / "path" / "tiny-one", seed=1)
    two = tiny_model_folder(tmp_path / "secret" / "path" / "tiny-two", seed=2)
    env = streamlit_env(None, (str(one), f"second={two}"))
    fast_page(monkeypatch, tmp_path / "home", models=json.loads(env[um.MODELS_ENV]),
              model_cache=tmp_path / "cache")
    return tmp_path


def test_the_browser_picks_a_name_from_the_list_and_never_sees_a_path(two_models, monkeypatch):
    at = new_session()
    assert not at.text_input  # nothing to type a model into
    box = at.selectbox(key="model")
    assert box.options == ["tiny-one", "second"]
    assert not [t for _, t in element_strings(at) if "secret" in t]

    at.file_uploader[0].set_value(("a.md", b"# A\n\nThe port is 7432.\n", "text/markdown"))
    at.run()
    at.number_input(key="max_new_tokens").set_value(8)
    box.set_value("second").run()
    at.chat_input[0].set_value("Which port?").run()
    settle(at)
    assert saved_chat(at)["messages"][-1]["model"] == "second"
    assert saved_chat(at)["messages"][-1]["status"] == "done"

    # at most one generator in memory when the owner says so
    monkeypatch.setenv(um.MAX_LOADED_ENV, "1")
    at.run()
    at.selectbox(key="model").set_value("tiny-one").run()
    at.chat_input[0].set_value("And the other one?").run()
    settle(at)
    registry = um.registry_for(um.from_env(), 1)
    assert registry.loaded_names() == ["tiny-one"]


def test_a_model_that_cannot_take_drafts_says_so_in_the_answer(tmp_path, monkeypatch):
    from conftest import make_char_tokenizer, make_family_model, save_model_folder

    tok = make_char_tokenizer()
    folder = save_model_folder(make_family_model("mamba", len(tok)), tok, tmp_path / "mamba")
    fast_page(monkeypatch, tmp_path / "home", models=[["mamba", str(folder)]],
              model_cache=tmp_path / "cache")
    at = new_session()
    at.file_uploader[0].set_value(("a.md", b"# A\n\nThe port is 7432.\n", "text/markdown"))
    at.run()
    at.number_input(key="max_new_tokens").set_value(8)
    at.chat_input[0].set_value("Which port?").run()
    settle(at)
    note = "speculation off: this model's layers cannot be rolled back"
    assert note in saved_chat(at)["messages"][-1]["note"]
    shown = [t for _, t in element_strings(at) if "speculation off" in t]  # with the saved answer
    assert shown and "rolled back" in shown[0]
