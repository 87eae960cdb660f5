"""Which files an ingest reads, and reading each one exactly once.

Contract of `collect(paths, recursive, follow_symlinks)`:
  * Folders are walked depth first (each folder's files by name, then its sub-folders by name),
    skipping hidden entries; files of unsupported types inside folders are listed in `skipped`.
    A path named explicitly that is missing or of an unsupported type is in `failed`.
  * Inside a folder, a symbolic link whose target lies outside that folder is not followed: it
    is listed in `links` with the reason, unless `follow_symlinks` (then followed folders are
    walked once each, so link loops end). Links that stay inside the folder are walked as the
    folder's own content. A path named explicitly is always followed: the user chose it.
  * Every file appears once in `files` (by resolved path), as (name as shown, path).

`read_once(path, max_bytes)` opens the file once, checks it is a regular file of 1 to
`max_bytes` bytes on the open descriptor (so a swap between check and read cannot fool it; a
pipe or device never blocks the ingest), and returns its bytes: the same bytes are hashed and
parsed.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ragspec.retrieval.errors import LoadError
from ragspec.retrieval.readers.limits import ENV_FOR, size_text
from ragspec.retrieval.readers.loaders import supported, unsupported_message


@dataclass
class Collected:
    files: list[tuple[str, Path]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)


def collect(paths: Iterable[str | os.PathLike], recursive: bool = True,
            follow_symlinks: bool = False) -> Collected:
    out = Collected()
    seen: set[Path] = set()

    def add(shown: str, path: Path) -> None:
        key = path.resolve()
        if key not in seen:
            seen.add(key)
            out.files.append((shown, path))

    for raw in paths:
        path = Path(raw).expanduser()
        shown = os.fspath(raw)
        if not path.exists():
            out.failed.append((shown, "no such file or directory"))
        elif path.is_dir():
            _Walk(path, recursive, follow_symlinks, out, add).run()
        elif not supported(path):
            out.failed.append((shown, unsupported_message(path)))
        else:
            add(shown, path)
    return out


class _Walk:
    """One folder given as PATH, walked as the module docstring says."""

    def __init__(self, top: Path, recursive: bool, follow: bool, out: Collected, add) -> None:
        self.top, self.recursive, self.follow, self.out, self.add = top, recursive, follow, out, add
        self.inside = top.resolve()
        self.walked: set[Path] = set()

    def run(self) -> None:
        stack = [self.top]
        while stack:
            folder = stack.pop()
            real = folder.resolve()
            if real in self.walked:
                continue  # a followed link led back to a folder already walked
            self.walked.add(real)
            subfolders = self._files_then_subfolders(folder)
            if self.recursive:
                stack.extend(reversed(subfolders))

    def _files_then_subfolders(self, folder: Path) -> list[Path]:
        subfolders = []
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            self.out.failed.append((str(folder), f"cannot list the folder ({exc.strerror or exc})"))
            return []
        for entry in entries:
            if entry.name.startswith("."):
                continue  # .git, .venv, editor swap files: never documents
            path = Path(entry.path)
            if entry.is_symlink() and not self._may_follow(path):
                continue
            if entry.is_dir():
                subfolders.append(path)
            elif supported(path):
                self.add(str(path), path)
            else:
                self.out.skipped.append(str(path))
        return subfolders

    def _may_follow(self, link: Path) -> bool:
        try:
            target = link.resolve()
        except (OSError, RuntimeError):  # RuntimeError: a link loop, on Python < 3.13
            self.out.links.append((str(link), "symbolic link that loops; not followed"))
            return False
        if target == self.inside or self.inside in target.parents:
            return True
        if self.follow:
            return True
        if target.is_dir() or supported(link):
            self.out.links.append((
                str(link),
                f"symbolic link to {target}, outside the folder being ingested; not followed "
                "(--follow-symlinks follows it)",
            ))
        return False


def read_once(path: Path, max_bytes: int) -> bytes:
    """The file's bytes, read once (see the module docstring); raises LoadError."""
    try:
        # O_NONBLOCK: opening a named pipe would otherwise wait for a writer forever.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise LoadError(f"cannot read the file ({exc.strerror or exc})") from exc
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise LoadError("not a regular file (a pipe, socket or device); nothing was read")
        if info.st_size > max_bytes:
            raise _too_big(info.st_size, max_bytes)
        try:
            data = f.read(max_bytes + 1)
        except OSError as exc:
            raise LoadError(f"cannot read the file ({exc.strerror or exc})") from exc
    if len(data) > max_bytes:  # it grew after the size check
        raise _too_big(len(data), max_bytes)
    if not data:
        raise LoadError("the file is empty (0 bytes)")
    return data


def _too_big(size: int, limit: int) -> LoadError:
    return LoadError(
        f"the file is {size_text(size)}, over the size limit of {size_text(limit)}; split it, or "
        f"raise the limit with {ENV_FOR['max_file_bytes']}"
    )
