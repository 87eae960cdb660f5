"""Decode a text file's bytes in whatever encoding they were written, and say which.

Contract: `decode_text(data)` returns `(text, encoding)`: `encoding` is None for UTF-8 (with or
without a byte-order mark, and plain ASCII), else the name of the encoding the bytes were read
in (e.g. "UTF-16", "Windows-1252", "Shift_JIS"). It raises LoadError only for bytes that no
encoding explains (binary data). In order:

1. a byte-order mark decides (UTF-8, UTF-16, UTF-32), and the bytes must decode in it;
2. bytes that decode as UTF-8 are UTF-8: ASCII and UTF-8 files never reach a detector, so they
   read exactly as before;
3. otherwise charset-normalizer picks the encoding, from a sample: the file's first
   SAMPLE_BYTES and SAMPLE_BYTES around the first byte that is not UTF-8, each cut at line
   ends so that no character is split (in the ASCII-compatible encodings a detector can
   choose, a newline byte is never part of another character). The whole file is then decoded
   strictly in that encoding; where that fails, one more sample around the failing byte gets a
   second chance. So time is linear in the file and the detector's share is bounded.

Among encodings that give the same text for these bytes (charset-normalizer lists them), the
most widely used is named: a German text in Windows-1252 is the same in Windows-1250, and
people know the former.
"""

from __future__ import annotations

import codecs

from ragspec.retrieval.errors import LoadError

SAMPLE_BYTES = 64 * 1024
ATTEMPTS = 2

_BOMS = (  # longest first: the UTF-32 LE mark starts with the UTF-16 LE one
    (codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"),
)
# Python codec name -> the name people know, most widely used first (see the docstring).
_NAMES = {
    "cp1252": "Windows-1252", "iso8859_1": "Latin-1", "iso8859_15": "Latin-9",
    "shift_jis": "Shift_JIS", "cp932": "Shift_JIS (Windows)", "euc_jp": "EUC-JP",
    "gb18030": "GB18030", "gb2312": "GB2312", "big5": "Big5", "euc_kr": "EUC-KR",
    "cp949": "Windows-949", "cp1251": "Windows-1251", "koi8_r": "KOI8-R", "cp1250": "Windows-1250",
    "iso8859_2": "Latin-2", "cp1253": "Windows-1253", "cp1254": "Windows-1254",
    "cp1255": "Windows-1255", "cp1256": "Windows-1256", "cp1257": "Windows-1257",
    "cp1258": "Windows-1258", "utf_16": "UTF-16", "utf_32": "UTF-32",
}
NOT_TEXT = ("not text: no text encoding explains these bytes (binary data?); "
            "only text files can be ingested under this name")


def decode_text(data: bytes) -> tuple[str, str | None]:
    """(text, encoding name or None for UTF-8); see the module docstring."""
    for bom, codec in _BOMS:
        if data.startswith(bom):
            try:
                text = data.decode(codec)
            except UnicodeDecodeError as exc:
                raise LoadError(f"not {_display(codec)} text, though it starts with that "
                                f"byte-order mark (bad bytes at offset {exc.start})") from exc
            return (text, None) if codec == "utf-8-sig" else (text, _display(codec))
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        bad = exc.start
    for _ in range(ATTEMPTS):
        codec = _detect(_sample(data, bad))
        if codec is None:
            break
        try:
            return data.decode(codec), _display(codec)
        except UnicodeDecodeError as exc:
            bad = exc.start  # the sample did not show these bytes: look there
    raise LoadError(NOT_TEXT)


def _codec(name: str) -> str:
    """Python's canonical name of a codec, with underscores ("latin-1" -> "iso8859_1")."""
    return codecs.lookup(name).name.replace("-", "_")


def _display(codec: str) -> str:
    return _NAMES.get(_codec(codec)) or _codec(codec)


def _sample(data: bytes, bad: int) -> bytes:
    """The file's start and the region around byte `bad`, cut at line ends."""
    if len(data) <= 2 * SAMPLE_BYTES:
        return data
    head = _lines(data, 0, SAMPLE_BYTES)
    if bad < SAMPLE_BYTES:
        return head
    return head + b"\n" + _lines(data, bad - SAMPLE_BYTES // 2, bad + SAMPLE_BYTES // 2)


def _lines(data: bytes, start: int, end: int) -> bytes:
    """data[start:end] widened/narrowed to whole lines (as far as line ends are found)."""
    if start > 0:
        newline = data.find(b"\n", start, end)
        start = newline + 1 if newline >= 0 else start
    if end < len(data):
        newline = data.rfind(b"\n", start, end)
        end = newline + 1 if newline >= 0 else end
    return data[max(0, start):end]


def _detect(sample: bytes) -> str | None:
    """The codec charset-normalizer finds most plausible, or None (no text encoding fits)."""
    from charset_normalizer import from_bytes

    best = from_bytes(sample).best()
    if best is None:
        return None
    same_text = {_codec(c) for c in best.could_be_from_charset}
    for name in _NAMES:  # the most widely used of the equivalent ones
        if name in same_text:
            return name
    return best.encoding
