"""llamafit's own files read back (the caches, tune's winners): input like any other, and shared with other
llamafit processes.

Read without blocking and within a size: a FIFO or a device put in a cache's place is not waited on, a huge
file is not read whole, and anything that is not what we write reads as nothing. Written whole and
atomically (a temporary file beside it, then a rename: a reader sees the old file or the new one) and
changed under an exclusive lock on a lock file beside it, so two processes that add entries at once keep
both. A lock is waited for within a bound; a cache whose lock cannot be had in time is left as it is.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from llamafit.numbers import jsonable

MAX_BYTES = 16 << 20  # no cache of ours comes near it; a larger file is not ours
LOCK_WAIT = 10.0  # seconds a change waits for another process's change of the same file


MAX_REASON = 300  # characters kept of a reason read back (what a failure said)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u200e\u200f\u202a-\u202e\u2066-\u2069\u061c]")


def text_field(value: object, limit: int = MAX_REASON) -> str | None:
    """A text read back from one of our files, as it may be shown: at most ``limit`` characters, every control
    character (escape sequences, bidirectional overrides) written as ``\\xNN``/``\\uNNNN``; None when it is not
    text. A file we wrote is input: someone may have put a terminal's escape sequences in it."""
    if not isinstance(value, str):
        return None
    cut = value[:limit] + ("..." if len(value) > limit else "")
    return _CONTROL.sub(
        lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}", cut
    )


def read_bytes(path: Path, limit: int = MAX_BYTES) -> bytes | None:
    """The file's bytes when it is a regular file of at most ``limit`` bytes, else None (also when it
    cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        os.set_blocking(fd, True)
        chunks, n = [], 0
        while n <= limit and (chunk := os.read(fd, min(1 << 20, limit + 1 - n))):
            chunks.append(chunk)
            n += len(chunk)
        return b"".join(chunks) if n <= limit else None
    except OSError:
        return None
    finally:
        os.close(fd)


def read_json(path: Path, limit: int = MAX_BYTES) -> Any:
    """The JSON document in ``path``, or None when there is none that parses."""
    raw = read_bytes(path, limit)
    if raw is None:
        return None
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        return None


def write_text(path: Path, text: str) -> None:
    """``text`` into ``path`` atomically (OSError when it cannot be written)."""
    write_bytes(path, text.encode("utf-8"))


def write_bytes(path: Path, data: bytes) -> None:
    """``data`` into ``path`` atomically (OSError when it cannot be written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json(path: Path, doc: Any) -> None:
    """``doc`` as JSON (a number that is not finite written as null), atomically."""
    write_text(path, json.dumps(jsonable(doc), indent=1, allow_nan=False))


@contextlib.contextmanager
def locked(path: Path, wait: float = LOCK_WAIT) -> Iterator[bool]:
    """An exclusive lock on ``path``'s lock file, held inside the block; yields False (and holds nothing)
    when another process holds it longer than ``wait`` seconds or the lock file cannot be made."""
    lock = path.with_name(path.name + ".lock")
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError:
        yield False
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            yield False
            return
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(0.05)
        yield True
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def update_json(path: Path, change: Callable[[Any], Any], wait: float = LOCK_WAIT) -> bool:
    """Read ``path`` (None when there is nothing valid), write ``change(doc)`` back, under the lock: False
    when the lock could not be had in time or the file could not be written (a cache stays as it was)."""
    with locked(path, wait) as had:
        if not had:
            return False
        try:
            write_json(path, change(read_json(path)))
        except OSError:
            return False
        return True
