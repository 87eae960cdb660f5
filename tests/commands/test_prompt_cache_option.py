"""--prompt-cache-mb: every command that makes a generator takes it, and it sets the budget the
generator reads (ragspec.decoding.prefix_cache.budget_bytes); bench and eval time repeated
prompts, so their cache is off unless asked."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from ragspec.cli import main
from ragspec.commands.common import PROMPT_CACHE_ENV, prompt_cache_option
from ragspec.loading import timing_prompt_cache


def test_the_option_and_the_budget_name_the_same_variable():
    from ragspec.decoding import prefix_cache

    assert PROMPT_CACHE_ENV == prefix_cache.ENV


@pytest.mark.parametrize("command", ["ask", "generate", "serve", "calibrate", "eval", "bench", "ui"])
def test_every_command_that_loads_a_model_takes_it(command):
    options = {opt for param in main.commands[command].params for opt in param.opts}
    assert "--prompt-cache-mb" in options


def test_it_sets_the_budget_and_turns_the_timing_commands_cache_on(monkeypatch):
    monkeypatch.setenv(PROMPT_CACHE_ENV, "")  # restored (unset) after the test, whatever it sets
    monkeypatch.delenv(PROMPT_CACHE_ENV)
    assert timing_prompt_cache() == 0  # bench and eval: off unless asked
    seen = {}

    @click.command()
    @prompt_cache_option
    def command():
        import os

        seen["env"] = os.environ.get(PROMPT_CACHE_ENV)
        seen["timing"] = timing_prompt_cache()

    result = CliRunner().invoke(command, ["--prompt-cache-mb", "12"])
    assert result.exit_code == 0, result.output
    assert seen == {"env": "12", "timing": None}  # None: the budget the variable names
    monkeypatch.delenv(PROMPT_CACHE_ENV, raising=False)
    result = CliRunner().invoke(command, ["--prompt-cache-mb", "-3"])
    assert result.exit_code == 2 and "-3" in result.output
