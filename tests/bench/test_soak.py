"""ragspec/bench/soak.py end to end on a small scale: a real `ragspec serve` process over a tiny
model folder with two accounts, three clients for a quarter of a minute (streamed and whole
answers, two-turn conversations, hang-ups, malformed requests, requests without a key) with one
`ragspec ingest` beside them. It asserts the soak's own checks, never a count or a time the
machine decides: a slow machine makes fewer requests, not different ones."""

from __future__ import annotations

import json

import pytest
import serve_support

from ragspec.bench import soak

pytestmark = pytest.mark.slow


def test_a_short_soak_passes_every_check(tmp_path, tiny_tokenizer, monkeypatch):
    monkeypatch.setenv("RAGSPEC_HOME", str(tmp_path / "home"))
    model, corpus, questions = serve_support.tiny_server_inputs(tmp_path, tiny_tokenizer)
    out = tmp_path / "report.json"
    status = soak.main(["--minutes", "0.25", "--clients", "3", "--corpus", str(corpus),
                        "--questions", str(questions), "--max-tokens", "12", "--model",
                        str(model), "--ingests", "1", "--out", str(out)])
    report = json.loads(out.read_text())
    assert status == 0, (report["failures"], report["incomplete"], report["malformed_bad"])
    assert all(report["checks"].values())
    # seed 0 makes client 1's first action a streamed question: at least one answer, however
    # slow the machine
    assert report["answers_compared"] > 0 and report["ingests"]
    # the server ran with accounts (keys were needed: the requests without one got 401s) and
    # every conversation's two turns have a solo answer to be compared with
    assert report["users"] == 2 and report["by_kind"]["bad_key"] >= 2
    assert report["sessions"] == 4 and report["solo_answers"] == 2 + 2 * 4


def test_rss_summary_gives_the_growth_after_warm_up_and_its_slope():
    mib = 2**20
    samples = [(0.0, 100 * mib), (10.0, 200 * mib), (20.0, 200 * mib), (30.0, 230 * mib),
               (40.0, 260 * mib)]
    rss = soak.rss_summary(samples, warmup_s=10.0)
    assert rss["first_mib"] == 100 and rss["last_mib"] == 260 and rss["max_mib"] == 260
    assert rss["warmup_level_mib"] == 200 and rss["after_over_warmup"] == 1.3
    # 200, 230, 260 MiB at 20, 30, 40 s: 3 MiB a second
    assert rss["slope_mib_per_hour"] == pytest.approx(3 * 3600)
