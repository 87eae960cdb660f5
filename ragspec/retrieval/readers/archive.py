"""Read parts of a zip archive (a .docx) without letting the archive decide how much memory
and time that takes.

Contract: `open_archive(data, limits)` checks the archive's directory before parsing it (how
many parts, how big the directory) and returns a `zipfile.ZipFile`; `read_part(archive, name,
limits)` checks the part's declared sizes before inflating anything (its inflated size against
`limits.max_unzipped_bytes`, inflated/compressed against `limits.max_zip_ratio`), refuses
encryption and compression methods the standard library cannot read, then yields the inflated
bytes in blocks, counting them against the same cap. Everything that goes wrong is a LoadError
naming the part; nothing is ever inflated whole into memory. `check_parts(archive, limits)`
applies the same declared-size checks to every part at once, and caps their sum, for formats
read by a library that inflates parts itself (zipfile never returns more than a part declares,
so the declared sizes bound what the library can be made to hold).
"""

from __future__ import annotations

import io
import struct
import zipfile
import zlib
from collections.abc import Iterator

from ragspec.retrieval.errors import LoadError, type_name
from ragspec.retrieval.readers.limits import ENV_FOR, IngestLimits, MiB

_BLOCK = 64 * 1024
# Directory entries are 46 bytes plus the name (and extras); Word's names are short.
_MAX_DIRECTORY_BYTES_PER_PART = 1024
# Below this inflated size a high ratio is harmless (a small, very regular XML part).
_RATIO_FLOOR_BYTES = MiB
_END_OF_DIRECTORY = b"PK\x05\x06"
_READABLE_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)
# All parts of one archive together, in per-part limits: slides and e-books carry pictures, so
# the sum is allowed more than one part, but not as many as an archive can list.
_TOTAL_PARTS_FACTOR = 4


def open_archive(data: bytes, limits: IngestLimits, what: str = "file") -> zipfile.ZipFile:
    """The archive in `data`; `what` names it in messages ("Word file")."""
    _check_directory(data, limits, what)
    try:
        return zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError) as exc:
        raise LoadError(f"not a valid {what} (a damaged or foreign zip archive: {exc})") from exc


def _check_directory(data: bytes, limits: IngestLimits, what: str) -> None:
    # The end-of-directory record sits in the last 64 KiB (22 bytes plus a comment); zipfile
    # reads the whole directory it points to into objects, so its size is checked first.
    end = data.rfind(_END_OF_DIRECTORY, max(0, len(data) - 65_557))
    if end < 0 or end + 22 > len(data):
        return  # not a zip: zipfile says so in its own words
    parts, directory_bytes = struct.unpack_from("<HI", data, end + 10)
    if parts > limits.max_zip_members or (
        directory_bytes > limits.max_zip_members * _MAX_DIRECTORY_BYTES_PER_PART
    ):
        raise LoadError(
            f"the {what} is an archive of {parts if parts < 0xFFFF else 'over 65,000'} parts "
            f"({directory_bytes:,} bytes of directory); a document has a few dozen, so it was "
            "not opened"
        )


def read_part(archive: zipfile.ZipFile, name: str, limits: IngestLimits) -> Iterator[bytes]:
    """The inflated bytes of part `name`, in blocks (see the module docstring)."""
    info = archive.getinfo(name)
    _check_part(info, limits)
    cap = min(info.file_size, limits.max_unzipped_bytes)
    inflated = 0
    try:
        with archive.open(info) as stream:
            while block := stream.read(_BLOCK):
                inflated += len(block)
                if inflated > cap:
                    raise LoadError(f"{name} inflates past its declared size: a damaged archive")
                yield block
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
        raise LoadError(f"{name} inside the archive is damaged ({type_name(exc)}: {exc})") from exc


def check_parts(archive: zipfile.ZipFile, limits: IngestLimits) -> None:
    """Every part's declared sizes checked as `read_part` checks one; their sum capped at
    `_TOTAL_PARTS_FACTOR` times the per-part limit."""
    total = 0
    for info in archive.infolist():
        _check_part(info, limits)
        total += info.file_size
    cap = _TOTAL_PARTS_FACTOR * limits.max_unzipped_bytes
    if total > cap:
        raise LoadError(
            f"the archive's parts would inflate to {total / MiB:,.1f} MiB together, over the "
            f"limit of {cap / MiB:,.1f} MiB ({_TOTAL_PARTS_FACTOR} times "
            f"{ENV_FOR['max_unzipped_bytes']}); raise it if the file is genuine"
        )


def _check_part(info: zipfile.ZipInfo, limits: IngestLimits) -> None:
    name = info.filename
    if info.flag_bits & 0x1:
        raise LoadError(
            f"{name} inside the archive is encrypted (password protected); save an "
            "unprotected copy and ingest that"
        )
    if info.compress_type not in _READABLE_METHODS:
        raise LoadError(
            f"{name} inside the archive uses compression method {info.compress_type}, which "
            "ragspec cannot read; re-save the file with its usual settings"
        )
    if info.file_size > limits.max_unzipped_bytes:
        raise LoadError(
            f"{name} would inflate to {info.file_size / MiB:,.1f} MiB, over the limit of "
            f"{limits.max_unzipped_bytes / MiB:,.1f} MiB per part; raise it with "
            f"{ENV_FOR['max_unzipped_bytes']} if the file is genuine"
        )
    ratio = info.file_size / max(info.compress_size, 1)
    if info.file_size > _RATIO_FLOOR_BYTES and ratio > limits.max_zip_ratio:
        raise LoadError(
            f"{name} would inflate {ratio:,.0f} times ({info.compress_size:,} bytes to "
            f"{info.file_size:,}), over the limit of {limits.max_zip_ratio:g} (a zip bomb?); "
            f"raise it with {ENV_FOR['max_zip_ratio']} if the file is genuine"
        )
