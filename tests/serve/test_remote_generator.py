"""Generating on OpenAI-compatible servers (`--generator URL`, URL models in the chat's list),
against real servers on loopback: Hugging Face's `transformers serve` (runs in every test run),
llama-cpp-python's server and `ragspec serve` (each skipped, with the reason, when not
installed). Servers that report no drafts get quoted spans, never drafts; `ragspec serve`'s own
spans are used when it sends them. The server tests are slow: each server loads the bundled
model."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from ragspec.commands.ask import ask
from ragspec.commands.generate import generate
from tests.conftest import MODEL_CACHE
from tests.support import servers

DOC = ("The metrics endpoint of the daemon listens on port 7432 and serves /metrics only.\n"
       "Job logs are kept for 14 days by default, then compressed and deleted.\n")
QUESTION = "On which port does the metrics endpoint listen?"
_TOKEN = re.compile(r"\w+|[^\w\s]")


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    from ragspec.retrieval.embeddings.embedder import Embedder
    from ragspec.retrieval.faiss.store import PassageStore
    from ragspec.retrieval.ingest import ingest_paths

    home = tmp_path_factory.mktemp("home")
    doc = home / "metrics.txt"
    doc.write_text(DOC)
    assert ingest_paths([doc], PassageStore.open(home / "index", Embedder())).ok
    return home


@pytest.fixture
def env(home, monkeypatch):
    monkeypatch.setenv("RAGSPEC_HOME", str(home))
    monkeypatch.setenv("RAGSPEC_MODEL_CACHE", str(MODEL_CACHE))
    return home


@pytest.fixture(scope="module")
def transformers_url(bundled, bundled_fp32, tmp_path_factory):
    # transformers serves the fp32 conversion, which loading the model with fp32 weights writes
    with servers.transformers_serve(MODEL_CACHE / "smollm2-135m-instruct",
                                    tmp_path_factory.mktemp("logs") / "transformers.log") as url:
        yield url


@pytest.fixture(scope="module")
def llama_url(tmp_path_factory):
    from ragspec.models.load import bundled_gguf_path

    with servers.llama_cpp_server(bundled_gguf_path(),
                                  tmp_path_factory.mktemp("logs") / "llama.log") as url:
        yield url


@pytest.fixture(scope="module")
def ragspec_url(home, tmp_path_factory):
    env = {"RAGSPEC_HOME": str(home), "RAGSPEC_MODEL_CACHE": str(MODEL_CACHE)}
    with servers.ragspec_serve(home / "index", tmp_path_factory.mktemp("logs") / "serve.log",
                               env) as url:
        yield url


def _ask(*args) -> dict:
    result = CliRunner().invoke(ask, [QUESTION, "--json", "-k", "1", "--max-new-tokens", "40",
                                      "--min-score", "0", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _words(text: str) -> list[str]:
    return _TOKEN.findall(text)


def _check_quoted(out: dict) -> None:
    """Spans make up the answer; none claims a draft; each quote is in its passage."""
    answer, passages = out["answer"], out["passages"]
    assert "".join(s["text"] for s in answer["spans"]) == answer["text"] and answer["text"]
    assert not any(s["drafted"] for s in answer["spans"])
    for span in answer["spans"]:
        if span.get("quoted"):
            o = span["origin"]
            held = passages[o["source"]]["text"][o["char_start"] : o["char_end"]]
            assert _words(held) == _words(span["text"])


@pytest.mark.slow
@pytest.mark.parametrize("server", ["transformers_url", "llama_url"])
def test_a_server_without_drafts_answers_from_our_passages_with_quoted_spans(server, request,
                                                                             env):
    url = request.getfixturevalue(server)
    out = _ask("--generator", url)
    assert [p["text"] for p in out["passages"]] == [DOC.strip()]
    _check_quoted(out)
    # Token counts come from the server's usage report; llama-cpp-python's server sends none
    # when streaming, and then they stay 0 (unknown) rather than guessed.
    assert out["answer"]["stats"]["new_tokens"] > 0 or server == "llama_url"
    assert out["model"].endswith(url.split("//")[1].split("/")[0])


@pytest.mark.slow
def test_transformers_serve_writes_the_same_greedy_answer_as_ragspec(transformers_url, env):
    remote = _ask("--generator", transformers_url)
    local = _ask()
    assert remote["answer"]["text"] == local["answer"]["text"]
    copied = sum(e - s for p in local["passages"] for s, e in p["copied"])
    quoted = [s for s in remote["answer"]["spans"] if s.get("quoted")]
    # An answer that copies the passage (ragspec drafted it) shows quotes from a plain server.
    assert bool(quoted) == (copied >= 20), (copied, remote["answer"]["spans"])


@pytest.mark.slow
def test_generate_on_a_server_quotes_the_prompt(transformers_url, env):
    prompt = f"Repeat this sentence exactly: {DOC.splitlines()[0]}"
    result = CliRunner().invoke(generate, ["--prompt", prompt, "--json", "--max-new-tokens",
                                           "40", "--generator", transformers_url])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["device"] == "remote" and out["text"]
    assert "".join(s["text"] for s in out["spans"]) == out["text"]
    assert not any(s["drafted"] for s in out["spans"])


@pytest.mark.slow
def test_the_chat_offers_a_server_by_name_and_answers_through_it(transformers_url, env):
    from ragspec.loading import open_store
    from ragspec.pipeline import PipelineConfig
    from ragspec.remote import pipeline_for
    from ragspec.web.model_choice import ModelRegistry, parse_choices

    choices = parse_choices([f"team={transformers_url}"])
    assert [c.name for c in choices] == ["team"]
    bare = parse_choices([transformers_url])[0]
    assert bare.name == transformers_url.split("//")[1].split("/")[0]  # host:port, no path
    loaded, generator = ModelRegistry(choices).get("team")
    store = open_store()
    pipeline = pipeline_for(store, generator, PipelineConfig(k=1, max_new_tokens=24,
                                                             min_score=0))
    prepared = pipeline.prepare(QUESTION)
    from ragspec.decoding.types import GenerationConfig

    stream = pipeline.stream(prepared, GenerationConfig(max_new_tokens=24))
    live = list(stream)
    assert "".join(s.text for s in live) == stream.result().text
    assert not any(s.drafted for s in stream.spans)


def test_an_unreachable_server_is_one_clear_line(env):
    result = CliRunner().invoke(ask, [QUESTION, "--generator",
                                      f"http://127.0.0.1:{servers.free_port()}/v1"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "cannot list the models" in result.output


@pytest.mark.slow
def test_ragspec_serve_spans_are_its_accepted_drafts(ragspec_url, env):
    out = _ask("--generator", ragspec_url)
    local = _ask()
    assert out["answer"]["text"] == local["answer"]["text"]
    spans = out["answer"]["spans"]
    assert "".join(s["text"] for s in spans) == out["answer"]["text"]
    assert not any(s.get("quoted") for s in spans)
    drafted = [s for s in spans if s["drafted"]]
    assert drafted, "ragspec serve reports the answer's accepted drafts"
    for s in drafted:
        o = s["origin"]
        if o and o["source"] is not None:
            text = out["passages"][o["source"]]["text"]
            assert text[o["char_start"] : o["char_end"]].strip() == s["text"].strip()


@pytest.mark.parametrize("command", [ask, generate])
def test_a_generator_that_is_not_a_url_is_a_usage_error(command, tmp_path, monkeypatch):
    monkeypatch.setenv("RAGSPEC_HOME", str(tmp_path))
    args = [QUESTION] if command is ask else ["--prompt", "hi"]
    result = CliRunner().invoke(command, [*args, "--generator", "ftp://nope"])
    assert result.exit_code == 2 and "http(s) URL" in result.output
