"""Where each local GGUF file's long string arrays (its vocabulary and merges) end, remembered in llamafit's cache,
so that a later read of the same file jumps over them instead of walking every string: for a 150k-token BPE
vocabulary, 300k lengths read one by one (a tenth of a plan's time) and 5 MB of reads. A Hub file's cached header
is read so too.

A file is known by its device, inode, size and modification time (a cached Hub header by its repo, commit and
file); what is remembered is only a hint: a jump is taken where the bytes before the remembered end are still the
same (``reader.Extent``), and a header that does not parse with the hints is read again without them. The cache is
input like any other (``llamafit.store``): what is not what we write reads as nothing, and a cache that cannot be
written leaves the read as it was.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from llamafit import store
from llamafit.errors import BadModelFileError
from llamafit.gguf.reader import MAX_HEADER_BYTES, TAIL, ByteSource, Extent, FileSource, GGUFHeader, read_header
from llamafit.paths import cache_dir

SCHEMA = "llamafit.extents/1"
KEPT = 256  # files remembered, the least recently learned dropped first
PER_FILE = 16  # a model has two long string arrays (tokens, merges); more is not a file we read
LOCK_WAIT = 1.0  # seconds a read waits to record what it learned (a hint: skipped when another process writes)


def extents_path(directory: Path | None = None) -> Path:
    return (directory or cache_dir()) / "gguf" / "extents.json"


def read_remembered(path: str | os.PathLike[str], directory: Path | None = None) -> GGUFHeader:
    """``path``'s header, jumping over the long arrays an earlier read of the same file found (``directory``: the
    cache, ``$LLAMAFIT_CACHE`` by default); what this read found is remembered for the next."""
    with FileSource(path) as src:
        return remembered(src, ":".join(str(v) for v in src.identity), directory)


def remembered(src: ByteSource, key: str, directory: Path | None = None) -> GGUFHeader:
    """The header of ``src``, a local source (a file, a cached Hub header) whose bytes ``key`` names: as
    ``read_remembered`` reads a file."""
    file = extents_path(directory)
    known = _extents(_files(store.read_json(file)).get(key))
    try:
        h = read_header(src, known=known)
    except BadModelFileError:
        if not known:
            raise
        h = read_header(src, known=())  # a hint that no longer holds: the whole header, learned again
    if list(h.extents) != known:
        store.update_json(file, lambda doc: _with(doc, key, h.extents), wait=LOCK_WAIT)
    return h


def _files(doc: Any) -> Mapping[str, Any]:
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("files"), dict):
        return {}
    files: Mapping[str, Any] = doc["files"]
    return files


def _extents(entry: Any) -> list[Extent]:
    """The extents of one file's entry; none when any part of it is not what ``_with`` writes."""
    raw = entry.get("extents") if isinstance(entry, dict) else None
    if not isinstance(raw, list) or len(raw) > PER_FILE:
        return []
    out = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 4 and isinstance(item[3], str)):
            return []
        start, count, end, tail = item
        if not all(type(v) is int and 0 <= v <= MAX_HEADER_BYTES for v in (start, count, end)):
            return []
        try:
            data = bytes.fromhex(tail)
        except ValueError:
            return []
        if len(data) != TAIL:
            return []
        out.append(Extent(start, count, end, data))
    return out


def _with(doc: Any, key: str, extents: Sequence[Extent]) -> dict[str, Any]:
    files = {k: v for k, v in _files(doc).items() if isinstance(v, dict) and _extents(v)}
    files.pop(key, None)
    if extents:
        files[key] = {"at": round(time.time()), "extents": [[e.start, e.count, e.end, e.tail.hex()] for e in extents]}
    newest = sorted(files, key=lambda k: _at(files[k]))[-KEPT:]
    return {"schema": SCHEMA, "files": {k: files[k] for k in newest}}


def _at(entry: Mapping[str, Any]) -> int:
    at = entry.get("at")
    return at if type(at) is int else 0
