"""`ragspec ingest | list | remove | search` through click's CliRunner, with a temporary
RAGSPEC_HOME and the torch-free HashEmbedder standing in for the bundled model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from fakes import HashEmbedder, hold_lock, release

import ragspec.commands.index as index_commands
import ragspec.loading as common
from ragspec.cli import main

CORPUS = Path(__file__).resolve().parents[2] / "data" / "corpus"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(common, "cached_embedder", lambda name: HashEmbedder())
    return tmp_path / "home"


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_the_four_commands_are_registered():
    assert {"ingest", "list", "remove", "search"} <= set(main.commands)
    assert [c.name for c in index_commands.COMMANDS] == ["ingest", "list", "remove", "search"]


def test_ingest_json_lists_added_then_unchanged_and_exits_zero(home):
    result = run("ingest", str(CORPUS), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)  # progress went to stderr: stdout is pure JSON
    assert set(report) == {"added", "updated", "unchanged", "failed", "links_not_followed",
                           "encodings", "ocr_pages"}
    assert report["ocr_pages"] == []  # the corpus has text only: OCR read no page
    assert len(report["added"]) == len(list(CORPUS.iterdir())) and report["failed"] == []
    assert (home / "index" / "index.faiss").exists()
    again = json.loads(run("ingest", str(CORPUS), "--json").stdout)
    assert again["added"] == [] and len(again["unchanged"]) == len(report["added"])


def test_ingest_with_a_bad_file_exits_one_and_names_it(home, tmp_path):
    empty = tmp_path / "empty.md"
    empty.write_text("")
    good = tmp_path / "good.txt"
    good.write_text("Larkspur keeps 7 snapshots.")
    result = run("ingest", str(empty), str(good), str(tmp_path / "missing.pdf"))
    assert result.exit_code == 1
    assert f"FAILED     {empty}: the file is empty" in result.stdout
    assert f"FAILED     {tmp_path / 'missing.pdf'}: no such file or directory" in result.stdout
    assert "1 added, 0 updated, 0 unchanged, 2 failed" in result.stdout
    as_json = json.loads(run("ingest", str(empty), "--json").stdout)
    assert as_json["failed"] == [{"path": str(empty), "error": "the file is empty (0 bytes)"}]


def test_index_option_overrides_ragspec_home(home, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    assert run("ingest", str(CORPUS / "faq.md"), "--index", str(elsewhere)).exit_code == 0
    assert (elsewhere / "index.faiss").exists() and not (home / "index").exists()
    listed = json.loads(run("list", "--json", "--index", str(elsewhere)).stdout)
    assert [Path(d["source"]).name for d in listed] == ["faq.md"]


def test_no_recursive_ingests_only_the_top_folder(home, tmp_path):
    (tmp_path / "top" / "sub").mkdir(parents=True)
    (tmp_path / "top" / "a.txt").write_text("A.")
    (tmp_path / "top" / "sub" / "b.txt").write_text("B.")
    report = json.loads(run("ingest", str(tmp_path / "top"), "--no-recursive", "--json").stdout)
    assert report["added"] == [str(tmp_path / "top" / "a.txt")]


def test_list_shows_documents_with_counts_sizes_and_times(home):
    assert "is empty" in run("list").stdout
    run("ingest", str(CORPUS))
    docs = json.loads(run("list", "--json").stdout)
    assert {Path(d["source"]).name for d in docs} == {p.name for p in CORPUS.iterdir()}
    for d in docs:
        assert set(d) == {"doc_id", "source", "sha256", "passages", "size_bytes", "ingested_at"}
        assert d["passages"] >= 1 and d["size_bytes"] == Path(d["source"]).stat().st_size
    table = run("list").stdout
    assert "PASSAGES" in table and "operations-guide.pdf" in table
    assert f"{len(docs)} documents" in table


def test_search_json_has_score_text_source_page_and_start(home):
    run("ingest", str(CORPUS))
    result = run("search", "error", "E207", "low", "disk", "space", "-k", "3", "--json")
    hits = json.loads(result.stdout)
    assert len(hits) == 3
    assert all(set(h) == {"score", "fused", "text", "source", "page", "start"} for h in hits)
    assert hits[0]["source"].endswith("operations-guide.pdf") and hits[0]["page"] == 2
    assert "E207" in hits[0]["text"]
    plain = run("search", "E207 low disk space").stdout
    assert "\n[1] similarity " in plain and "operations-guide.pdf p.2 @" in plain


def test_search_says_which_order_its_passages_are_in(home):
    """Hybrid mode orders by the fused ranking, so the similarities printed need not descend:
    the output says so, and prints the fused score each row is ranked by."""
    run("ingest", str(CORPUS))
    hybrid = run("search", "E207", "low", "disk", "space", "--search-mode", "hybrid").stdout
    assert hybrid.splitlines()[0].startswith("Ranked by hybrid search")
    rows = [line for line in hybrid.splitlines() if line.startswith("[")]
    assert rows and all(" similarity " in r and " · fused " in r for r in rows), rows
    fused = [float(r.split(" · fused ")[1].split()[0]) for r in rows]
    assert fused == sorted(fused, reverse=True)  # the order the header names
    dense = run("search", "E207", "low", "disk", "space", "--search-mode", "dense").stdout
    assert dense.splitlines()[0] == "Ranked by embedding similarity (cosine)."
    rows = [line for line in dense.splitlines() if line.startswith("[")]
    similarity = [float(r.split(" similarity ")[1].split()[0]) for r in rows]
    assert similarity == sorted(similarity, reverse=True) and " fused " not in dense


def test_search_validates_k_as_usage_error(home):
    assert run("search", "x", "-k", "0").exit_code == 2


def test_remove_by_id_and_path_then_unknown_exits_one(home):
    run("ingest", str(CORPUS))
    docs = {Path(d["source"]).name: d for d in json.loads(run("list", "--json").stdout)}
    faq = docs["faq.md"]
    result = run("remove", faq["doc_id"], str(CORPUS / "release-notes.docx"))
    assert result.exit_code == 0
    assert f"removed  {faq['source']} ({faq['passages']} passages)" in result.stdout
    left = {Path(d["source"]).name for d in json.loads(run("list", "--json").stdout)}
    assert "faq.md" not in left and "release-notes.docx" not in left and len(left) == len(docs) - 2
    bad = run("remove", "nope", "--json")
    assert bad.exit_code == 1
    assert json.loads(bad.stdout)["failed"][0]["doc"] == "nope"


def test_damaged_index_is_a_clean_error_with_rebuild_hint(home):
    run("ingest", str(CORPUS / "faq.md"))
    faiss_file = home / "index" / "index.faiss"
    faiss_file.write_bytes(faiss_file.read_bytes()[:100])
    for args in (["list"], ["search", "x"], ["ingest", str(CORPUS / "faq.md")]):
        result = run(*args)
        assert result.exit_code == 1
        assert "Error: The index in" in result.stderr and "ragspec ingest --index" in result.stderr
        assert "Traceback" not in result.output


# -- terminal safety: control characters shown escaped, --json exact ---------------------------

EVIL = "evil\x1b[2J\nFAKE ROW\x07.txt"
# Two escape sequences in prose: few enough control characters to be text, not binary.
EVIL_TEXT = ("The pier \x1b[31mRED\x1b[0m closes when the tide is high. "
             + "Ferries run every hour on weekdays. " * 12)


def test_control_characters_in_names_and_text_are_escaped_in_every_human_output(home, tmp_path):
    path = tmp_path / EVIL
    path.write_text(EVIL_TEXT)
    outputs = [run("ingest", str(path), str(tmp_path / "gone\x1b]0;title\x07.txt"))]
    outputs.append(run("list"))
    outputs.append(run("search", "pier tide"))
    outputs.append(run("remove", str(path), "no\x1b[1msuch"))
    for result in outputs:
        assert "\x1b" not in result.output and "\x07" not in result.output
        assert "FAKE ROW" not in result.output or "\\nFAKE ROW" in result.output
    assert "\\x1b[2J\\nFAKE ROW\\x07.txt" in outputs[0].stdout  # the name, escaped
    assert "FAILED     " + str(tmp_path / "gone\\x1b]0;title\\x07.txt") in outputs[0].stdout
    assert len(outputs[1].stdout.splitlines()) == 3  # header, one document, summary
    assert "\\x1b[31mRED\\x1b[0m" in outputs[2].stdout


def test_json_keeps_names_and_text_exactly(home, tmp_path):
    path = tmp_path / EVIL
    path.write_text(EVIL_TEXT)
    assert json.loads(run("ingest", str(path), "--json").stdout)["added"] == [str(path)]
    assert json.loads(run("list", "--json").stdout)[0]["source"] == str(path.resolve())
    hit = json.loads(run("search", "pier", "--json").stdout)[0]
    assert "\x1b[31mRED\x1b[0m" in hit["text"]


# -- options of ingest ----------------------------------------------------------------------------


def test_links_out_of_the_folder_are_listed_and_followed_on_request(home, tmp_path):
    (tmp_path / "outside.txt").write_text("Outside the folder.")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "inside.txt").write_text("Inside the folder.")
    (tmp_path / "docs" / "link.txt").symlink_to(tmp_path / "outside.txt")
    result = run("ingest", str(tmp_path / "docs"))
    assert result.exit_code == 0  # a link not followed is not a failure
    assert f"skipped    {tmp_path / 'docs' / 'link.txt'}: symbolic link to " in result.stdout
    assert "1 added" in result.stdout
    followed = json.loads(run("ingest", str(tmp_path / "docs"), "--follow-symlinks",
                              "--json").stdout)
    assert followed["added"] == [str(tmp_path / "docs" / "link.txt")]
    assert followed["links_not_followed"] == []


def test_commit_options_are_validated_as_usage_errors(home, tmp_path):
    assert run("ingest", str(tmp_path), "--commit-every", "0").exit_code == 2
    assert run("ingest", str(tmp_path), "--commit-seconds", "0").exit_code == 2


def test_a_bad_limit_setting_is_one_clear_line(home, tmp_path, monkeypatch):
    monkeypatch.setenv("RAGSPEC_MAX_CHARS", "-3")
    result = run("ingest", str(tmp_path))
    assert result.exit_code == 1
    assert result.stderr.strip() == "Error: RAGSPEC_MAX_CHARS must be > 0, got '-3'"


def test_a_second_writer_prints_that_it_waits(home, tmp_path, monkeypatch):
    index = home / "index"
    index.mkdir(parents=True)
    holder = hold_lock(index)
    say_waiting = index_commands._say_waiting

    def say_then_let_the_other_writer_finish():
        say_waiting()
        release(holder)

    monkeypatch.setattr(index_commands, "_say_waiting", say_then_let_the_other_writer_finish)
    try:
        (tmp_path / "a.txt").write_text("Berth 2.")
        result = run("ingest", str(tmp_path / "a.txt"))
    finally:
        holder.kill()
        holder.wait()
    assert result.exit_code == 0
    assert "waiting for another ragspec process to finish writing the index..." in result.stderr


# -- errors: retrieval problems are one line; bugs are not hidden ---------------------------------


class _Unavailable(HashEmbedder):
    def count_tokens(self, text):
        from ragspec.retrieval.errors import EmbedderUnavailableError

        raise EmbedderUnavailableError("The bundled embedding model is missing: install it.")


class _Buggy(HashEmbedder):
    def embed_array(self, texts):
        raise RuntimeError("a bug in the embedder")


def test_a_missing_embedder_is_one_clear_line(home, tmp_path, monkeypatch):
    monkeypatch.setattr(common, "cached_embedder", lambda name: _Unavailable())
    (tmp_path / "a.txt").write_text("Berth 2.")
    result = run("ingest", str(tmp_path / "a.txt"))
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "Error: The bundled embedding model is missing: install it."
    )
    assert "Traceback" not in result.output


def test_a_bug_is_not_dressed_up_as_a_user_error(home, tmp_path, monkeypatch):
    monkeypatch.setattr(common, "cached_embedder", lambda name: _Buggy())
    (tmp_path / "a.txt").write_text("Berth 2.")
    with pytest.raises(RuntimeError, match="a bug in the embedder"):
        run("ingest", str(tmp_path / "a.txt"))


def test_search_in_an_empty_or_mistyped_index_fails_in_one_line(home, tmp_path):
    """`ragspec search --index /typo` said "the index is empty" and exited 0, so a script (or
    a newcomer) took a wrong path for "no matches"; it fails as `ask` does."""
    for args in (["search", "port"], ["search", "port", "--index", str(tmp_path / "typo")],
                 ["search", "port", "--json"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 1, (args, result.output)
        assert result.output.count("\n") == 1 and "no documents in the index" in result.output
        assert "ragspec ingest" in result.output
