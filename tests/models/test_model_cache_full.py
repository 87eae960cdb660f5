"""The model cache on a full disk: `ragspec generate` with a model folder it must quantise
into the cache ends with one line that names the cache folder and says the disk is full (not
"could not load model"), exit status 1, and leaves no partial folder. A real 2 MiB tmpfs where
the test may mount one, else ENOSPC injected; the safetensors writer's own error text (Rust's
io error) is read for its errno too."""

from __future__ import annotations

import errno

import pytest
from click.testing import CliRunner
from conftest import save_model_folder
from full_disk import FULL, snapshot

from ragspec.cli import main
from ragspec.fileio import WriteFailed
from ragspec.models.gguf import make_locked


def test_generate_with_a_full_model_cache_says_the_disk_is_full(tmp_path, disk, monkeypatch,
                                                                tiny_model, tiny_tokenizer):
    folder = save_model_folder(tiny_model, tiny_tokenizer, tmp_path / "tiny")
    monkeypatch.setenv("RAGSPEC_HOME", str(disk.root / "home"))
    monkeypatch.setenv("RAGSPEC_MODEL_CACHE", str(disk.root / "cache"))
    (disk.root / "cache").mkdir()
    disk.fill()
    before = snapshot(disk.root)
    result = CliRunner().invoke(main, ["generate", "--prompt", "hi", "--model", str(folder),
                                       "--weights", "int8", "--max-new-tokens", "4"])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith(f"Error: could not write {disk.root / 'cache'}") and FULL in line
    assert "could not load model" not in line
    assert snapshot(disk.root) == before
    assert not any(".partial-" in p.name for p in (disk.root / "cache").rglob("*"))


def test_a_library_error_that_names_only_its_os_code_becomes_one_line(tmp_path):
    class SafetensorError(Exception):  # what safetensors raises: not an OSError
        pass

    def make(out):
        (out / "half.bin").write_bytes(b"x")
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: '
                              'StorageFull, message: "No space left on device" })')

    with pytest.raises(WriteFailed) as failed:
        make_locked(tmp_path / "model-int8", make)
    assert failed.value.errno == errno.ENOSPC
    assert str(failed.value).startswith(f"could not write {tmp_path / 'model-int8'}: {FULL}")
    assert [p.name for p in tmp_path.iterdir()] == ["model-int8.lock"]
