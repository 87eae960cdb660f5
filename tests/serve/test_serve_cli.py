"""The `ragspec serve` command: options, and the real command in its own process (a tiny model
folder, an index built by `ragspec ingest`), killed mid-answer and started again."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import openai
import pytest
import serve_support
from conftest import REPO, make_tiny_model, save_model_folder

from ragspec.bench.load_test import stream_in_background, wait_healthy
from ragspec.commands.serve import parse_indexes

RAGSPEC = str(Path(sys.executable).with_name("ragspec"))  # the installed command


def test_index_options_name_the_retrieval_model_ids():
    assert parse_indexes(()) == {"ragspec": None}
    assert parse_indexes(("a", "docs=/srv/docs")) == {"ragspec": "a", "ragspec:docs": "/srv/docs"}


@pytest.mark.parametrize("args", [["--index", "a", "--index", "b"], ["--index", "x="],
                                  ["--max-active", "0"]])
def test_bad_options_are_usage_errors(run, args):
    result = run("serve", *args)
    assert result.exit_code == 2


def test_a_port_in_use_is_one_clear_line(run):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run("serve", "--port", str(port))
    assert result.exit_code == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.output


def test_another_machines_address_without_an_account_is_refused(run, tmp_path):
    """The chat's binding rule: 0.0.0.0 with no account refuses to start (exit 2, naming the
    way out) before anything loads; --no-auth goes on (and here stops at the taken port)."""
    refused = run("serve", "--host", "0.0.0.0")
    assert refused.exit_code == 2
    assert "ragspec users add" in refused.output and "--no-auth" in refused.output
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        open_ = run("serve", "--host", "0.0.0.0", "--no-auth", "--port", str(port))
    assert open_.exit_code == 1 and "cannot listen on 0.0.0.0" in open_.output


def _serve(home: Path, model: Path, index: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "RAGSPEC_HOME": str(home), "OMP_WAIT_POLICY": "PASSIVE"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [RAGSPEC, "serve", "--model", str(model), "--index",
         str(index), "--port", str(port), "--min-score", "0", "--max-tokens", "40"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_healthy(url: str, process: subprocess.Popen) -> None:
    wait_healthy(url, process, 180, "(its output: a pipe read by the test on failure)")


def _index_files(index: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(index.iterdir()) if p.is_file()
            and not p.name.endswith(".lock")}


@pytest.mark.slow  # the bundled embedder indexes and answers in the server process
def test_the_command_serves_and_survives_a_kill_mid_answer(tmp_path, tiny_tokenizer):
    home, index = tmp_path / "home", tmp_path / "index"
    model = save_model_folder(make_tiny_model(len(tiny_tokenizer)), tiny_tokenizer,
                              tmp_path / "tiny")
    doc = tmp_path / "daemon.txt"
    doc.write_text(serve_support.DOC)
    env = {**os.environ, "RAGSPEC_HOME": str(home)}
    subprocess.run([RAGSPEC, "ingest", str(doc), "--index", str(index)],
                   env=env, check=True, capture_output=True, cwd=REPO)
    before = _index_files(index)
    port = serve_support.free_port()
    url = f"http://127.0.0.1:{port}"
    process = _serve(home, model, index, port)
    try:
        _wait_healthy(url, process)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)
        assert {m.id for m in client.models.list()} >= {"ragspec", "tiny"}
        first = client.chat.completions.create(
            model="ragspec", messages=[{"role": "user", "content": "metrics port?"}])
        assert first.model_extra["ragspec"]["passages"]
        # kill -9 while an answer streams
        reader, got_text = stream_in_background(client, "metrics port?", 40)
        assert got_text.wait(60)
        process.send_signal(signal.SIGKILL)
        process.wait(30)
        reader.join(30)
        assert _index_files(index) == before
        process = _serve(home, model, index, port)
        _wait_healthy(url, process)
        again = client.chat.completions.create(
            model="ragspec", messages=[{"role": "user", "content": "metrics port?"}])
        assert again.choices[0].message.content == first.choices[0].message.content
    finally:
        process.kill()
        process.wait(30)
