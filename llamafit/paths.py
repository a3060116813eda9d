"""llamafit's own folders (the cache: headers, probes, the demo model; the data: launch history) and the
files a user names: read only if regular, written atomically and never over an input."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

from llamafit.errors import UsageError


def cache_dir() -> Path:
    """``$LLAMAFIT_CACHE``, else ``$XDG_CACHE_HOME/llamafit``, else ``~/.cache/llamafit``."""
    env = os.environ.get("LLAMAFIT_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "llamafit" if xdg else Path.home() / ".cache" / "llamafit"


def data_dir() -> Path:
    """``$LLAMAFIT_DATA``, else ``$XDG_DATA_HOME/llamafit``, else ``~/.local/share/llamafit``."""
    env = os.environ.get("LLAMAFIT_DATA")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_DATA_HOME")
    return Path(xdg) / "llamafit" if xdg else Path.home() / ".local" / "share" / "llamafit"


# -- files the user names ---------------------------------------------------------------------------


def read_regular_file(path: Path, limit: int, what: str) -> bytes:
    """At most ``limit`` bytes of a regular file. Opened without blocking, so a FIFO or a device given as
    a file is refused instead of waiting forever in ``open()``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise UsageError(f"cannot read {what} {path}: {e.strerror or e}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"{what} {path} is not a regular file", hint="give a file (not a FIFO, device or folder)")
        os.set_blocking(fd, True)
        chunks, n = [], 0
        while n < limit and (chunk := os.read(fd, min(1 << 20, limit - n))):
            chunks.append(chunk)
            n += len(chunk)
        return b"".join(chunks)
    except OSError as e:
        raise UsageError(f"cannot read {what} {path}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def check_output(path: Path, inputs: Iterable[str | Path], what: str) -> None:
    """An output file the user names must not be one of the run's inputs (a model, a preset) and, if it
    exists, must be a regular file: a device node or a FIFO is never replaced."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise UsageError(f"cannot write {what} {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{what} {path} exists and is not a regular file", hint="give a file path")
    not_an_input(path, inputs, what)


def named_files(argv: Iterable[str]) -> list[str]:
    """The words of a command line that name existing files (the model, its shards, a drafter, ...)."""
    return [w for w in argv if os.path.isfile(w)]


def not_an_input(path: Path, inputs: Iterable[str | Path], what: str) -> None:
    """``path`` is none of ``inputs`` (the same file by any name: a link, ``./``)."""
    for p in inputs:
        with contextlib.suppress(OSError):
            if os.path.samefile(path, p):
                raise UsageError(
                    f"{what} {path} is also an input of this command ({p}); it would be overwritten",
                    hint="write to another file",
                )


def write_output(path: Path, text: str, inputs: Iterable[str | Path], what: str) -> None:
    """``text`` into ``path`` atomically (a temporary file beside it, then a rename), after
    ``check_output``; a path that cannot be written is a usage error with the reason."""
    inputs = list(inputs)
    check_output(path, inputs, what)
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise UsageError(f"cannot write {what} {path}: {e.strerror or e}", hint="choose a writable path") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
