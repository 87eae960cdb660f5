"""Ingest commits in batches and holds the index lock only to commit: a killed ingest keeps
every file it committed and a re-run finishes the rest; other writers wait for commits, not for
parsing; a writer that has to wait says so."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fakes import HashEmbedder, hold_lock, release

import ragspec.retrieval.ingest as ingest_module
from ragspec.retrieval.faiss import persist
from ragspec.retrieval.faiss.store import PassageStore
from ragspec.retrieval.ingest import IngestEvent, ingest_paths

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests" / "support")])}


@pytest.fixture(scope="module")
def embedder():
    return HashEmbedder()


def _folder(root: Path, count: int, words: int = 200) -> Path:
    folder = root / "docs"
    folder.mkdir()
    for i in range(count):
        (folder / f"f{i:02d}.txt").write_text(f"Document {i} talks about berth {i}. " * words)
    return folder


def _names(store) -> list[str]:
    return sorted(Path(d.source).name for d in store.documents())


def test_commits_every_n_files_each_one_a_readable_prefix(tmp_path, embedder):
    folder = _folder(tmp_path, 5, words=20)
    index = tmp_path / "index"
    seen = []

    def on_event(event: IngestEvent) -> None:
        if event.kind == "commit":
            seen.append((event.committed, _names(PassageStore.open(index, embedder))))

    report = ingest_paths([folder], PassageStore.open(index, embedder), progress=on_event,
                          commit_every=2)
    assert report.commits == 3 and len(report.added) == 5
    assert seen == [(2, ["f00.txt", "f01.txt"]),
                    (4, ["f00.txt", "f01.txt", "f02.txt", "f03.txt"]),
                    (5, [f"f{i:02d}.txt" for i in range(5)])]


def test_commits_after_the_time_limit_even_before_n_files(tmp_path, embedder):
    folder = _folder(tmp_path, 3, words=20)
    report = ingest_paths([folder], PassageStore.open(tmp_path / "index", embedder),
                          commit_every=1000, commit_seconds=1e-6)
    assert report.commits == 3


def test_commit_settings_are_validated(tmp_path, embedder):
    store = PassageStore.open(tmp_path / "index", embedder)
    with pytest.raises(ValueError, match="commit_every must be >= 1"):
        ingest_paths([tmp_path], store, commit_every=0)
    with pytest.raises(ValueError, match="commit_seconds must be > 0"):
        ingest_paths([tmp_path], store, commit_seconds=0)


# -- the lock is held only while committing ---------------------------------------------------

_TRY_LOCK = textwrap.dedent(
    """
    import sys
    from filelock import FileLock, Timeout
    try:
        FileLock(sys.argv[1]).acquire(timeout=float(sys.argv[2]))
    except Timeout:
        print("timeout")
    else:
        print("acquired")
    """
)


def test_another_writer_gets_the_lock_while_a_file_is_being_parsed(tmp_path, embedder):
    folder = _folder(tmp_path, 3, words=20)
    index = tmp_path / "index"
    answers = []

    def on_event(event: IngestEvent) -> None:
        if event.kind == "file" and event.files_done == 1:  # first file committed, second next
            probe = subprocess.run(
                [sys.executable, "-c", _TRY_LOCK, str(index / persist.LOCK_NAME), "2"],
                capture_output=True, text=True, timeout=60,
            )
            answers.append(probe.stdout.strip())

    report = ingest_paths([folder], PassageStore.open(index, embedder), progress=on_event,
                          commit_every=1)
    assert answers == ["acquired"] and len(report.added) == 3


def test_a_second_writer_waits_for_its_turn_and_says_so(tmp_path, embedder):
    (tmp_path / "a.txt").write_text("Berth 4 is closed on Sundays.")
    index = tmp_path / "index"
    index.mkdir()
    holder = hold_lock(index)
    events = []

    def on_event(event: IngestEvent) -> None:
        events.append(event.kind)
        if event.kind == "waiting":
            release(holder)  # the other writer finishes while this one waits

    try:
        report = ingest_paths([tmp_path / "a.txt"], PassageStore.open(index, embedder),
                              progress=on_event)
    finally:
        holder.kill()
        holder.wait()
    assert report.added == [str(tmp_path / "a.txt")]
    assert events.count("waiting") == 1 and events[-1] == "commit"


# -- kill -9 ------------------------------------------------------------------------------------

_CLI = textwrap.dedent(
    """
    import sys, time
    import ragspec.loading as common
    from fakes import HashEmbedder, hold_lock, release

    class Slow(HashEmbedder):  # an embedder that takes its time, as a real one does
        def embed_array(self, texts):
            time.sleep(0.15)
            return super().embed_array(texts)

    common.cached_embedder = lambda name: Slow()
    from ragspec.cli import main
    main(sys.argv[1:], prog_name="ragspec")
    """
)


def _ragspec(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _CLI, *args], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _committed_documents(index: Path) -> int:
    try:
        with open(index / persist.PASSAGES_NAME, encoding="utf-8") as f:
            return json.loads(f.readline())["documents"]
    except (OSError, ValueError, KeyError):
        return 0


def _kill_when(proc: subprocess.Popen, index: Path, documents: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while _committed_documents(index) < documents and proc.poll() is None:
        assert time.monotonic() < deadline, "the ingest never committed that far"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()


def test_kill_9_keeps_each_committed_file_and_a_rerun_finishes_the_rest(tmp_path, embedder):
    folder = _folder(tmp_path, 12, words=60)
    names = sorted(p.name for p in folder.iterdir())
    index = tmp_path / "index"
    args = ["ingest", str(folder), "--index", str(index), "--commit-every", "1"]
    kept = 0
    # Killed just after starting, then as soon as 2, 5 and 9 files are on disk (which can
    # fall in the middle of the next commit's writes).
    for target in (0, 2, 5, 9):
        proc = _ragspec(*args)
        if target == 0:
            time.sleep(0.2)
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
        else:
            _kill_when(proc, index, target)
        store = PassageStore.open(index, embedder)  # a valid index, whatever the moment
        stored = _names(store)
        assert stored == names[: len(stored)], "the index must hold a prefix of the files"
        assert len(stored) >= max(target, kept)
        assert store.passage_count() == sum(d.passages for d in store.documents())
        kept = len(stored)
    proc = _ragspec(*args, "--json")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    report = json.loads(out)
    assert sorted(Path(p).name for p in report["unchanged"]) == names[:kept]
    assert sorted(Path(p).name for p in report["added"]) == names[kept:]
    assert _names(PassageStore.open(index, embedder)) == names


def test_interrupt_keeps_what_was_committed_and_drops_the_rest(tmp_path, embedder, monkeypatch):
    folder = _folder(tmp_path, 4, words=20)
    index = tmp_path / "index"

    def interrupt(event: IngestEvent) -> None:
        if event.kind == "done" and event.files_done == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ingest_paths([folder], PassageStore.open(index, embedder), progress=interrupt,
                     commit_every=2)
    assert _names(PassageStore.open(index, embedder)) == ["f00.txt", "f01.txt"]
    parsed = []
    real = ingest_module.load_bytes
    monkeypatch.setattr(ingest_module, "load_bytes",
                        lambda data, name, limits=None: parsed.append(name) or real(data, name, limits))
    report = ingest_paths([folder], PassageStore.open(index, embedder))
    assert [Path(p).name for p in parsed] == ["f02.txt", "f03.txt"]  # the kept ones not redone
    assert len(report.unchanged) == 2 and len(report.added) == 2
