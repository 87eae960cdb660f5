"""`ragspec eval`: the quality measures on hand-made answers, and the evaluation end to end on the
tiny model over a fake store (the real pipeline builds the prompts; no embedder, no index)."""

from __future__ import annotations

import contextlib
import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from ragspec.bench.runner import Question, load_questions
from ragspec.cli import main
from ragspec.commands import eval as eval_cmd
from ragspec.decoding.types import RepeatConfig
from ragspec.eval import evaluate as ev
from ragspec.eval import quality
from ragspec.retrieval.faiss.store import Hit, Passage, SearchResult

pytestmark = pytest.mark.usefixtures("one_thread")  # one_thread, tiny_gen: tests/conftest.py

PASSAGES = [
    Passage(id="a-1", doc_id="a", source="/docs/gzip.txt", page=None, start=0,
            text="The default compression level is -6. The default compression level is -6."),
    Passage(id="b-1", doc_id="b", source="/docs/tar.txt", page=None, start=0,
            text="Use -k to keep the input files. Use -k to keep the input files."),
]
QUESTIONS = [
    Question("q1", "What is the default compression level?", "copy",
             ("The default compression level is -6.",)),
    Question("q2", "How do I keep input files?", "open", ("Use -k to keep the input files.",)),
    Question("q3", "How do I resume a download with wget?", "open", (), True),
]


class FakeStore:
    """Every query finds PASSAGES with cosine `best` (below the floor: refused)."""

    def __init__(self, best=0.9):
        self.best = best

    def passage_count(self):
        return len(PASSAGES)

    def retrieve(self, query, k=4, mode="dense"):
        hits = [Hit(score=self.best, passage=p) for p in PASSAGES[:k]]
        return SearchResult(hits=hits, best_score=self.best, mode=mode)




# -- measures -----------------------------------------------------------------------------------

def test_snippet_recall_counts_content_words_only():
    snippet = ["The default compression level is -6 (biased towards high compression)."]
    assert quality.snippet_recall("Level -6 is the default compression.", snippet) == \
        pytest.approx(4 / 7)  # default compression level 6 / biased towards high
    assert quality.snippet_recall("", snippet) == 0.0
    assert quality.snippet_recall("anything", ["the of and"]) is None
    # several snippets pool their words
    assert quality.snippet_recall("alpha beta", ["alpha", "beta gamma"]) == pytest.approx(2 / 3)


def test_exact_containment_ignores_case_and_whitespace_only():
    assert quality.contains_all("As documented:  the DEFAULT\nis -6. Done", ["The default is -6."])
    assert not quality.contains_all("the default is 6.", ["The default is -6."])
    assert not quality.contains_all("alpha", ["alpha", "beta"])
    assert not quality.contains_all("alpha", [])


@pytest.mark.parametrize("text, refused", [
    ("I don't know.", True), ("The passages do not contain the answer.", True),
    ("There is no information about wget here.", True), ("I'm sorry, but I cannot help.", True),
    ("gzip does not delete the input when -k is given.", False),
    ("Use -k to keep the files.", False),
])
def test_refusal_phrases(text, refused):
    assert quality.says_unknown(text) is refused


def test_measure_flags_a_loop_of_eight_tokens_written_three_times():
    loop = list(range(8)) * 3
    m = quality.measure(answers=["x"], unanswerable=False, floor_refused=False, text="x",
                        token_ids=loop, stop_reason="max_new_tokens")
    assert m["loops"] and m["repeated_share"] == pytest.approx(16 / 24)
    twice = quality.measure(answers=["x"], unanswerable=False, floor_refused=False, text="x",
                            token_ids=list(range(8)) * 2, stop_reason="repetition")
    assert not twice["loops"] and twice["repetition_stop"]


def test_floor_refusal_has_no_recall_credit_and_counts_as_refused():
    m = quality.measure(answers=["the default is -6"], unanswerable=False, floor_refused=True,
                        text="", token_ids=[], stop_reason="")
    assert m["recall"] == 0.0 and m["refused"] and not m["present"] and not m["exact"]


def test_questions_file_keeps_snippets_and_unanswerable_questions(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(
        json.dumps({"id": "a", "question": "one?", "answer": "snip"}) + "\n"
        + json.dumps({"id": "b", "question": "two?", "kind": "open", "answer": ["x", "y"]}) + "\n"
        + json.dumps({"id": "c", "question": "three?", "kind": "open", "answer": None,
                      "unanswerable": True}) + "\n")
    assert [q.id for q in load_questions(path)] == ["a", "b"]  # the benchmark's view
    questions = load_questions(path, unanswerable=True)
    assert [(q.answers, q.unanswerable) for q in questions] == [
        (("snip",), False), (("x", "y"), False), ((), True)]
    path.write_text(json.dumps({"id": "a", "question": "one?", "answer": 3}) + "\n")
    with pytest.raises(ValueError, match="line 1: \"answer\" must be a string"):
        load_questions(path)


# -- the evaluation on the tiny model -----------------------------------------------------------

def test_evaluate_answers_every_question_and_sums_the_measures(tiny_gen):
    settings = ev.settings_grid(["quote"], [1, 2], [24], [(4, 2), (0, 2)], [1.0])
    seen = []
    results = ev.evaluate(FakeStore(), [ev.Model("tiny", tiny_gen)], settings, QUESTIONS,
                          speculation="both", progress=seen.append)
    assert len(results["runs"]) == 4 and len(seen) == 4 * len(QUESTIONS)
    for run in results["runs"]:
        s, records = run["summary"], run["questions"]
        assert (s["questions"], s["answerable"], s["unanswerable"]) == (3, 2, 1)
        assert s["compared"] == 3 and s["identical"] == 3  # speculation off == on, greedy
        for r in records:
            assert r["new_tokens"] == len(r["token_ids"]) > 0
            assert r["stop_reason"] in ("eos", "max_new_tokens", "repetition")
            want = quality.measure(answers=QUESTIONS[records.index(r)].answers,
                                   unanswerable=r["unanswerable"], floor_refused=False,
                                   text=r["text"], token_ids=r["token_ids"],
                                   stop_reason=r["stop_reason"])
            assert {k: r[k] for k in want} == want
        assert s["loops"] == sum(r["loops"] for r in records)
    off = [r for run in results["runs"] if not run["setting"]["repeat"]["stop_ngram"]
           for r in run["questions"]]
    assert all(r["stop_reason"] != "repetition" for r in off)


def test_stop_rule_in_the_evaluation_cuts_a_prefix_of_the_free_answer(tiny_gen):
    free, ruled = (ev.evaluate(FakeStore(), [ev.Model("tiny", tiny_gen)],
                               [ev.Setting(k=2, max_new_tokens=48, repeat=repeat)], QUESTIONS)
                   for repeat in (RepeatConfig(), RepeatConfig(stop_ngram=3)))
    stopped = 0
    for a, b in zip(free["runs"][0]["questions"], ruled["runs"][0]["questions"], strict=True):
        assert a["token_ids"][: len(b["token_ids"])] == b["token_ids"]
        stopped += b["stop_reason"] == "repetition"
    assert stopped, "the tiny model should repeat a 3-token run on these prompts"
    assert ruled["runs"][0]["summary"]["repetition_stops"] == stopped


def test_settings_cut_from_one_longer_generation_equal_their_own_generation(tiny_gen):
    """Lengths and stop rules of one prompt share a generation ("derived"); each derived answer
    is exactly what generating that setting alone gives."""
    grid = ev.settings_grid(["quote"], [2], [12, 30, 48], [(0, 2), (3, 2), (2, 3)], [1.0])
    derived = ev.evaluate(FakeStore(), [ev.Model("tiny", tiny_gen)], grid, QUESTIONS)
    reasons = set()
    for run, setting in zip(derived["runs"], grid, strict=True):
        alone = ev.evaluate(FakeStore(), [ev.Model("tiny", tiny_gen)], [setting], QUESTIONS)
        for a, b in zip(run["questions"], alone["runs"][0]["questions"], strict=True):
            assert a["derived"] and not b["derived"]
            keys = ("token_ids", "text", "stop_reason", "new_tokens", "recall", "loops",
                    "repetition_stop", "refused")
            assert {k: a[k] for k in keys} == {k: b[k] for k in keys}, (setting.label, a["id"])
            reasons.add(a["stop_reason"])
    assert {"repetition", "max_new_tokens"} <= reasons


def test_trimmed_setting_reads_fewer_prompt_tokens_and_is_paired_with_the_first(tiny_gen):
    """--trim: the same retrieval, passages cut to their sentence nearest the question (the
    tiny model's tokenizer counts characters: 40 keeps one sentence of each); every record
    names its prompt length and first-token time, and the second run its paired recall."""
    settings = [ev.Setting(k=2, max_new_tokens=8), ev.Setting(k=2, max_new_tokens=8, trim=40)]
    results = ev.evaluate(FakeStore(), [ev.Model("tiny", tiny_gen)], settings, QUESTIONS)
    whole, trimmed = results["runs"]
    assert trimmed["setting"]["trim"] == 40 and "trim 40" in trimmed["setting"]["label"]
    for a, b in zip(whole["questions"], trimmed["questions"], strict=True):
        assert 0 < b["prompt_tokens"] < a["prompt_tokens"]
        assert a["ttft_seconds"] > 0 and b["ttft_seconds"] > 0
        assert a["snippet_shown"] == (None if a["unanswerable"] else True)
    # q1's sentence is the nearest to its question and fits: the snippet stays in the prompt
    assert trimmed["questions"][0]["snippet_shown"] is True
    s = trimmed["summary"]
    assert s["median_prompt_tokens"] < whole["summary"]["median_prompt_tokens"]
    assert whole["summary"]["snippet_shown"] == 2
    assert whole["versus_first"] is None
    assert trimmed["versus_first"] == quality.paired(whole["questions"], trimmed["questions"])
    assert trimmed["versus_first"]["questions"] == 2


def test_paired_recall_differences_match_question_by_question():
    def rec(qid, recall, unanswerable=False):
        return {"id": qid, "recall": recall, "unanswerable": unanswerable}

    base = [rec("a", 0.5), rec("b", 0.2), rec("c", 0.0), rec("u", None, True), rec("d", 0.4)]
    other = [rec("b", 0.4), rec("a", 0.25), rec("c", 0.0), rec("u", None, True), rec("e", 1.0)]
    d = quality.paired(base, other)
    assert d["questions"] == 3 and (d["higher"], d["lower"]) == (1, 1)
    assert d["mean"] == pytest.approx((0.2 - 0.25 + 0.0) / 3)
    diffs = [0.2, -0.25, 0.0]
    mean = sum(diffs) / 3
    sd = (sum((x - mean) ** 2 for x in diffs) / 2) ** 0.5
    assert d["stderr"] == pytest.approx(sd / 3 ** 0.5)
    assert quality.paired(base, [])["mean"] is None


def test_questions_below_the_relevance_floor_are_refused_without_generating(tiny_gen):
    results = ev.evaluate(FakeStore(best=0.1), [ev.Model("tiny", tiny_gen)], [ev.Setting()],
                          QUESTIONS)
    s = results["runs"][0]["summary"]
    assert s["generated"] == 0 and s["unanswerable_refused"] == 1 and s["false_refusals"] == 2
    assert all(r["token_ids"] == [] for r in results["runs"][0]["questions"])


def test_unknown_prompt_name_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown prompt 'chatty'; choose from"):
        ev.Setting(prompt="chatty")


# -- the command --------------------------------------------------------------------------------

@pytest.fixture
def cli_env(tmp_path, monkeypatch, tiny_gen):
    monkeypatch.setenv("RAGSPEC_HOME", str(tmp_path / "home"))
    loads = []

    def fake_generator(spec, quiet=False, **kwargs):
        loads.append(spec)
        return SimpleNamespace(name=spec or "tiny"), tiny_gen

    @contextlib.contextmanager
    def fake_store(index, corpus):
        yield FakeStore(), []

    monkeypatch.setattr(eval_cmd, "generator_from_options", fake_generator)
    monkeypatch.setattr(eval_cmd, "_store", fake_store)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(
        json.dumps({"id": q.id, "question": q.question, "kind": q.kind,
                    "answer": list(q.answers) or None, "unanswerable": q.unanswerable}) + "\n"
        for q in QUESTIONS))
    return tmp_path, corpus, questions, loads


def test_cli_prints_a_row_per_model_and_setting_and_writes_json(cli_env):
    tmp_path, corpus, questions, loads = cli_env
    out = tmp_path / "eval.json"
    result = CliRunner().invoke(main, [
        "eval", "--corpus", str(corpus), "--questions", str(questions), "--model", "m1",
        "--model", "m2", "-k", "1,2", "--max-new-tokens", "8", "--stop", "4x2",
        "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert loads == ["m1", "m2"]
    rows = [line for line in result.stdout.splitlines() if line.startswith(("| m1 ", "| m2 "))]
    assert len(rows) == 4 and "quote, k=2, 8 tokens, stop 4x2" in rows[1]
    data = json.loads(out.read_text())
    assert [(r["model"], r["setting"]["k"]) for r in data["runs"]] == [
        ("m1", 1), ("m1", 2), ("m2", 1), ("m2", 2)]


def test_cli_json_and_speculation_both_count_identical_answers(cli_env):
    _, corpus, questions, _ = cli_env
    result = CliRunner().invoke(main, [
        "eval", "--corpus", str(corpus), "--questions", str(questions), "--max-new-tokens", "8",
        "--speculation", "both", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["runs"][0]["summary"]
    assert summary["compared"] == 3 and summary["identical"] == 3


@pytest.mark.parametrize("args", [["--stop", "8"], ["--stop", "8x1"], ["-k", "two"],
                                  ["--prompt", "nope"], ["--repeat-penalty", "0.5"],
                                  ["--trim", "-5"]])
def test_cli_bad_usage_exits_2(cli_env, args):
    _, corpus, questions, _ = cli_env
    result = CliRunner().invoke(main, ["eval", "--corpus", str(corpus), "--questions",
                                       str(questions), *args])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output


def test_cli_bad_questions_file_exits_1(cli_env):
    tmp_path, corpus, _, _ = cli_env
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    result = CliRunner().invoke(main, ["eval", "--corpus", str(corpus), "--questions", str(bad)])
    assert result.exit_code == 1 and "line 1: not valid JSON" in result.output
