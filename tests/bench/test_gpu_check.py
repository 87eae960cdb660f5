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
    sections = ("environment", "identity_exact", "divergence", "steps", "sampling", "faiss",
                "speed")
    for name in sections:
        assert "error" not in report[name], f"{name}: {report[name].get('error')}"
    for model in ("bundled", "random smollm2-135m"):
        assert "error" not in report["speed"][model], report["speed"][model].get("error")


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

    for model in ("bundled", "random smollm2-135m"):
        table = report["speed"][model]
        assert table["prompts"] >= 1 and set(table["methods"]) == {*METHODS, "hf_static"}
        assert all(m["median_tokens_per_s"] > 0 and m["median_ms_per_token"] > 0
                   for m in table["methods"].values())
        assert table["step"] == "modules"  # the CPU default: the fixed step only when asked
    assert report["speed"]["random smollm2-135m"]["model"].startswith("random weights at")
    sampling = report["sampling"]
    assert sampling["same_seed_same_output"] and sampling["in_vocabulary"]
    assert sampling["device"] == "cpu"
    assert "skipped" in report["faiss"] or report["faiss"]["all_same"]


@pytest.mark.slow
def test_the_steps_section_times_every_path_it_was_given_on_both_models(report):
    """The random shape runs both paths; the bundled model runs packed where the CPU has the
    native kernels, which the fixed step does not read (it says so)."""
    steps = report["steps"]
    for model, paths in (("random smollm2-135m", ("modules", "fixed_eager")),
                         ("bundled", ("modules",))):
        assert steps[model]["context"] > 0
        for path in paths:
            assert steps[model][path]["1"] > 0 and steps[model][path]["17"] > 0, steps[model]
    fixed = steps["bundled"]["fixed_eager"]
    assert fixed.get("1", 0) > 0 or fixed["skipped"] == (
        "the fixed step does not run llama with packed or quantised layers (it reads plain "
        "weights)")


def test_without_a_gpu_build_the_faiss_section_names_the_missing_package_and_the_swap():
    from ragspec.bench import gpu_check

    faiss = pytest.importorskip("faiss")
    if hasattr(faiss, "StandardGpuResources"):
        pytest.skip("this machine's faiss has GPU support")
    problem = gpu_check.faiss_gpu_problem()
    assert "CPU-only build (faiss-cpu " in problem
    assert "pip uninstall -y faiss-cpu && pip install faiss-gpu==" in problem
    assert gpu_check.section_faiss(None) == {"skipped": problem}


def test_step_times_measure_each_path_and_say_why_one_cannot_run(tiny_model, monkeypatch):
    """ragspec.bench.step_speed on the tiny model: a median for 1 and 17 rows per path; the
    compiled path through aot_eager (inductor's build is minutes on a CPU)."""
    from conftest import make_family_model

    from ragspec.bench.step_speed import step_times
    from ragspec.decoding.fixed.step import BACKEND_ENV

    monkeypatch.setenv(BACKEND_ENV, "aot_eager")
    times = step_times(tiny_model, list(range(3, 40)), repeats=1, warmup=1)
    assert times["context"] == 37
    for path in ("modules", "fixed_eager", "fixed_compiled"):
        assert times[path]["1"] > 0 and times[path]["17"] > 0, times[path]
    assert times["fixed_compiled"]["compile_seconds"] > 0
    gpt2 = step_times(make_family_model("gpt2", 100), list(range(3, 20)), repeats=1, warmup=1,
                      paths=("fixed_eager",))
    assert gpt2["fixed_eager"]["skipped"].startswith("the fixed step does not run gpt2")


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
