"""Where the CLI's words go: stdout carries data (JSON, the argv, reports), stderr progress, hints and errors.

Consoles, ``--quiet``, terminal-safe text, JSON (printed one way), notes, and the translation of errors
into one message and a documented exit code. Every command and view prints through here.
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import typer

from llamafit.errors import ExitCode, LlamafitError
from llamafit.shellwords import UNSAFE

if TYPE_CHECKING:
    from rich.console import Console

_QUIET = {"on": False}


def set_quiet(value: bool) -> bool:
    """The ``--quiet`` callback: set on every invocation (also back to False)."""
    _QUIET["on"] = bool(value)
    return value


def safe_plain(text: object) -> str:
    """Text from a GGUF header, the Hub or the server, harmless on a terminal: control characters
    (so escape sequences, OSC 8/52 included) are shown as ``\\xNN``, bidirectional overrides as ``\\uNNNN``."""
    return UNSAFE.sub(_escape, str(text))


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def safe(text: object) -> str:
    """``safe_plain`` for text printed as rich markup: also no markup of its own."""
    from rich.markup import escape

    return escape(safe_plain(text))


def _console(**kw: Any) -> Console:
    """Colour on terminals only (rich's detection, FORCE_COLOR); NO_COLOR turns off every escape
    sequence, bold included, not just the colours."""
    from rich.console import Console

    plain = bool(os.environ.get("NO_COLOR"))
    stream = sys.stderr if kw.get("stderr") else sys.stdout
    if not _is_terminal(stream) and not os.environ.get("COLUMNS"):
        # a pipe or a file: no wrapping and no truncation (tables of data stay whole, lines greppable);
        # COLUMNS still sets a width on purpose
        kw.setdefault("width", UNWRAPPED)
    return Console(highlight=False, color_system=None if plain else "auto", **kw)


UNWRAPPED = 10_000


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def err_console() -> Console:
    """Errors and hints: always shown."""
    return _console(stderr=True)


def progress_console() -> Console:
    """Notes, progress, the server's passthrough and predicted-vs-actual tables on stderr: silent under --quiet."""
    return _console(stderr=True, quiet=_QUIET["on"])


def out_console() -> Console:
    """The command's result on stdout."""
    return _console()


def print_line(text: str) -> None:
    """One line of data on stdout (a URL, an argv), shown under --quiet too."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def print_json(doc: dict[str, Any]) -> None:
    """One JSON document on stdout, the only way the CLI prints JSON."""
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    sys.stdout.flush()


def download_summary(pending: Sequence[Any], verb: str) -> str:
    """``verb N file(s), SIZE: repo/path, ...`` for Hub files a plan uses that the cache lacks."""
    from llamafit.units import fmt_bytes

    total = sum(f.size for _, f in pending)
    names = ", ".join(f"{st.repo}/{f.path}" for st, f in pending[:3]) + (" ..." if len(pending) > 3 else "")
    return f"{verb} {len(pending)} file(s), {fmt_bytes(total)}: {names}"


def note(text: str) -> None:
    """A progress note: one line (the terminal wraps it), so an argv stays copyable and a path greppable."""
    progress_console().print(f"[dim]llamafit:[/] {safe(text)}", soft_wrap=True)


def warn(text: str) -> None:
    progress_console().print(f"[yellow]llamafit: warning:[/] {safe(text)}", soft_wrap=True)


def print_report(report: Sequence[tuple[str, str]], *, decisions: bool) -> None:
    """A plan's report (``Prepared.report``): its notes, its decisions (when the view does not show them),
    its warnings, each the same way in every command."""
    for kind, text in report:
        if kind == "warning":
            warn(text)
        elif kind == "note" or decisions:
            note(text)


def error(message: str, hint: str | None = None) -> None:
    con = err_console()
    con.print(f"[bold red]error:[/] {safe(message)}", soft_wrap=True)
    if hint:
        con.print(f"[dim]hint:[/] {safe(hint)}", soft_wrap=True)


@contextmanager
def handled() -> Iterator[None]:
    """Translate core errors into one message and an exit code; never a raw traceback (LLAMAFIT_DEBUG=1
    shows it)."""
    try:
        yield
    except typer.Exit:
        raise
    except LlamafitError as e:
        error(e.message, e.hint)
        if os.environ.get("LLAMAFIT_DEBUG"):
            traceback.print_exc()
        raise typer.Exit(int(e.exit_code)) from None
    except KeyboardInterrupt:
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
    except Exception as e:
        if os.environ.get("LLAMAFIT_DEBUG"):
            traceback.print_exc()
        error(
            f"internal error: {type(e).__name__}: {e}",
            "this is a bug in llamafit; run again with LLAMAFIT_DEBUG=1 and report the traceback",
        )
        raise typer.Exit(int(ExitCode.INTERNAL)) from None
