"""`ragspec generate` through click's CliRunner, on a tiny model saved as a local folder."""

from __future__ import annotations

import json

import pytest
from conftest import save_model_folder


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, tiny_model, tiny_tokenizer):
    return save_model_folder(tiny_model, tiny_tokenizer, tmp_path_factory.mktemp("tiny-model"))


def test_json_output_has_the_documented_shape(run, tiny_model_dir):
    res = run("generate", "--prompt", "abcabcabcabc", "--raw", "--max-new-tokens", "12",
              "--model", str(tiny_model_dir), "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert {"text", "prompt_token_ids", "token_ids", "spans", "stats"} <= set(out)
    assert len(out["token_ids"]) <= 12
    assert {"new_tokens", "forward_passes", "drafted_tokens", "accepted_tokens", "seconds",
            "tokens_per_s"} <= set(out["stats"])
    assert all({"text", "drafted", "origin"} <= set(s) for s in out["spans"])
    assert "".join(s["text"] for s in out["spans"]) == out["text"]


def test_no_spec_gives_the_same_tokens(run, tiny_model_dir):
    args = ["generate", "--prompt", "xyzxyzxyzxyz", "--raw", "--max-new-tokens", "20",
            "--model", str(tiny_model_dir), "--json"]
    a = json.loads(run(*args).stdout)
    b = json.loads(run(*args, "--no-spec").stdout)
    assert a["token_ids"] == b["token_ids"] and b["stats"]["drafted_tokens"] == 0


def test_plain_output_prints_text_and_a_stats_line(run, tiny_model_dir):
    res = run("generate", "--prompt", "hello hello hello", "--raw", "--max-new-tokens", "8",
              "--model", str(tiny_model_dir))
    assert res.exit_code == 0, res.output
    assert "tokens in" in res.stderr and "accepted" in res.stderr


@pytest.mark.parametrize("args,code,message", [
    (["--prompt", "   "], 2, "empty"),
    (["--prompt", "hi", "--max-new-tokens", "0"], 2, "at least 1"),
    (["--prompt-file", "/nonexistent/prompt.txt"], 1, "cannot read"),
    (["--prompt", "a", "--prompt-file", "x"], 2, "exactly one"),
    (["--prompt", "hi", "--model", "/nonexistent/model"], 1, "not found"),
    (["--prompt", "x" * 1200], 1, "context"),
    (["--prompt", "hi", "--top-p", "0"], 2, "top-p"),
])
def test_bad_input_exits_nonzero_with_one_clear_line(run, tiny_model_dir, args, code, message):
    extra = [] if "--model" in args else ["--model", str(tiny_model_dir)]
    res = run("generate", "--raw", *args, *extra)
    assert res.exit_code == code, res.output
    assert message in res.output.lower()
    assert "Traceback" not in res.output


def test_binary_prompt_file_is_rejected(run, tiny_model_dir, tmp_path):
    bad = tmp_path / "junk.txt"
    bad.write_bytes(b"\xff\xfe\x00\x81" * 10)
    res = run("generate", "--prompt-file", str(bad), "--model", str(tiny_model_dir))
    assert res.exit_code == 1 and "utf-8" in res.output.lower()


def test_a_first_run_says_it_measures_and_which_curve_it_works_with(run, tiny_model_dir,
                                                                    monkeypatch):
    """stderr on a model's first use: a progress line with the bound, then one line naming the
    curve; a busy measurement is retried by the next run, a trusted one is cached and the run
    after says nothing."""
    from ragspec.decoding import calibrate

    monkeypatch.delenv("RAGSPEC_MODEL_CACHE", raising=False)
    busy = calibrate.Calibration((0.01,) * 5, spread=0.6, rounds=9, context=32, measured_at="t")
    idle = calibrate.Calibration((0.01,) * 5, spread=0.05, rounds=9, context=32, measured_at="t")
    results = [busy, busy, idle]
    monkeypatch.setattr(calibrate, "measure", lambda *a, **k: results.pop(0))
    args = ["generate", "--prompt", "abcabcabc", "--raw", "--max-new-tokens", "4",
            "--max-draft", "4", "--model", str(tiny_model_dir)]
    first, second, third = run(*args), run(*args), run(*args)
    assert first.exit_code == second.exit_code == third.exit_code == 0, first.output
    measuring = (f"Measuring this machine's forward cost once (at most "
                 f"{calibrate.MEASURE_SECONDS:.0f} s)...")
    assert measuring in first.stderr and "conservative curve" in first.stderr
    assert measuring in second.stderr and "Measured this machine's forward cost" in second.stderr
    assert "forward cost" not in third.stderr and not results
