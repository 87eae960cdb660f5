"""ragspec/bench/gpu_check.py end to end on the CPU (tiny limits), so it cannot rot before a GPU run:
one JSON object, every section present and free of errors, and on the CPU (fp32) the engine
agrees with model.generate everywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import MODEL_CACHE, REPO

MODULE = "ragspec.bench.gpu_check"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    home = tmp_path_factory.mktemp("gpu-check-home")
    # OMP_WAIT_POLICY: on a busy 2-core machine torch's spinning threads made this run ~8x slower
    # (measured 7.5 min against 1.6 min at a load average of 8); on an idle one it changes little.
    env = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "RAGSPEC_HOME": str(home),
           "RAGSPEC_MODEL_CACHE": str(MODEL_CACHE), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    res = subprocess.run([sys.executable, "-m", MODULE, "--device", "cpu"], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)  # the whole stdout is one JSON object


@pytest.mark.slow
def test_every_section_runs_without_error(report):
    sections = ("environment", "identity_exact", "divergence", "sampling", "faiss", "speed")
    for name in sections:
        assert "error" not in report[name], f"{name}: {report[name].get('error')}"
    assert "error" not in report["speed"]["bundled"], report["speed"]["bundled"].get("error")


@pytest.mark.slow
def test_cpu_fp32_is_identical_to_generate_with_and_without_speculation(report):
    identity = report["identity_exact"]
    assert identity["prompts"] == identity["of_prompts"] >= 1
    assert identity["all_identical"], identity["differing"]
    divergence = report["divergence"]
    assert divergence["dtype"] == "torch.float32" and divergence["prompts"] >= 2
    assert divergence["rate_vs_generate"] == divergence["rate_vs_no_speculation"] == 0.0


@pytest.mark.slow
def test_speed_table_sampling_and_faiss_report_what_they_measured(report):
    from ragspec.bench.runner import METHODS

    table = report["speed"]["bundled"]
    assert table["prompts"] >= 1 and set(table["methods"]) == set(METHODS)
    assert all(m["median_tokens_per_s"] > 0 for m in table["methods"].values())
    sampling = report["sampling"]
    assert sampling["same_seed_same_output"] and sampling["in_vocabulary"]
    assert sampling["device"] == "cpu"
    assert "skipped" in report["faiss"] or report["faiss"]["all_same"]


def test_a_failing_section_reports_its_error_and_the_rest_still_run():
    from ragspec.bench import gpu_check

    result = gpu_check.run_section(lambda: {}["missing"])
    assert result["error"].startswith("KeyError") and "seconds" in result
    assert gpu_check.run_section(lambda: {"ok": True})["ok"] is True


def test_a_prompt_file_gives_back_the_prompts_and_refuses_another_tokenizer(tiny_tokenizer):
    """--save-prompts / --prompts: the prompts a GPU machine reads are the ones built here,
    sources included; a file built with another tokenizer is refused."""
    import copy
    import types

    from ragspec.bench import gpu_check
    from ragspec.bench.runner import Prepared, Question
    from ragspec.decoding.types import SourceRegion
    gen = types.SimpleNamespace(tokenizer=tiny_tokenizer)
    region = SourceRegion(3, 5, 0, ((0, 4), (4, 9)))
    by_set = {"data": [Prepared(Question("q1", "why?", answers=("because",)), [1, 2, 3, 4, 5],
                                (region,)),
                       Prepared(Question("q2", "how?", kind="other"), [7, 8], ())],
              "data/bench": [Prepared(Question("b1", "what?"), [9], ())]}
    saved = json.loads(json.dumps(gpu_check.prompts_to_file(by_set, gen, {"new_tokens": 8})))
    assert gpu_check.prompts_from_file(saved, gen, None, ("data",)) == by_set["data"]
    assert gpu_check.prompts_from_file(saved, gen, 1, ("data", "data/bench")) == [
        by_set["data"][0], by_set["data/bench"][0]]
    other = copy.deepcopy(tiny_tokenizer)
    other.chat_template = "{{ messages }}"
    with pytest.raises(SystemExit, match="another tokenizer"):
        gpu_check.prompts_from_file(saved, types.SimpleNamespace(tokenizer=other), None, ("data",))
