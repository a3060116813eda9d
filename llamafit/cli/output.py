"""Where the CLI's words go: stdout carries data (JSON, the argv, reports), stderr progress, hints and errors.

Consoles, ``--quiet``, terminal-safe text, JSON (printed one way), notes, and the translation of errors
into one message and a documented exit code. Every command and view prints through here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import typer

from llamafit.errors import ExitCode, LlamafitError
from llamafit.numbers import jsonable
from llamafit.shellwords import UNSAFE

if TYPE_CHECKING:
    from rich.console import Console

_STATE = {"quiet": False, "json": False, "printed": False}
ERROR_SCHEMA = "llamafit.error/1"


def set_quiet(value: bool) -> bool:
    """The ``--quiet`` callback: set on every invocation (also back to False)."""
    _STATE["quiet"] = bool(value)
    return value


def set_json(value: bool) -> bool:
    """The ``--json`` callback: a failure then prints its document on stdout too (``json_failure``)."""
    _STATE["json"], _STATE["printed"] = bool(value), False
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

    class Closable(Console):
        def on_broken_pipe(self) -> None:  # rich's hook; its own exits 1, which reads as a bug of ours
            self.quiet = True
            _drop_closed_streams()
            raise OutputClosed("the output was closed before it was written")

    # emoji off: rich would turn a model's name, a path or a flag written with ``:name:`` into an emoji
    return Closable(highlight=False, emoji=False, color_system=None if plain else "auto", **kw)


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
    return _console(stderr=True, quiet=_STATE["quiet"])


def out_console() -> Console:
    """The command's result on stdout."""
    return _console()


class OutputClosed(LlamafitError):
    """stdout went away (``| head -1``, ``| true``) before the data was written: exit as a tool that
    SIGPIPE stopped, without a traceback."""

    exit_code = ExitCode.OUTPUT_CLOSED


def _write(text: str) -> None:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        _drop_closed_streams()
        if threading.current_thread() is threading.main_thread():
            raise OutputClosed("stdout was closed before the output was written") from None
        # a server's ready line on its watcher thread: the server runs on, its URL unread


def _drop_closed_streams() -> None:
    """stdout or stderr whose reader went away writes to /dev/null from now on, so neither a later write
    nor the flush at exit raises again."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:
            with contextlib.suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
        except (OSError, ValueError):
            pass


def print_line(text: str) -> None:
    """One line of data on stdout (a URL, an argv), shown under --quiet too."""
    _write(text + "\n")


def print_json(doc: dict[str, Any]) -> None:
    """One JSON document on stdout, the only way the CLI prints JSON."""
    _STATE["printed"] = True
    _write(json.dumps(jsonable(doc), indent=2, allow_nan=False) + "\n")  # strict JSON: no Infinity


def error_doc(code: int, message: str, hint: str | None) -> dict[str, Any]:
    """The ``error`` object of a failure's JSON: the exit code, its name, what happened, what to try."""
    try:
        kind = ExitCode(code).name.lower()
    except ValueError:
        # 129, 143: stopped by SIGHUP or SIGTERM (``Terminated``); else run passes llama-server's own code on
        kind = "interrupted" if code in (128 + signal.SIGHUP, 128 + signal.SIGTERM) else "server_exit"
    return {"exit_code": code, "kind": kind, "message": message, "hint": hint}


def json_failure(code: int, message: str, hint: str | None = None, doc: dict[str, Any] | None = None) -> None:
    """Under ``--json``, the failure as one document on stdout, unless one was printed already: the
    command's own document (the plan that does not fit, the quant ladder) with an ``error`` member, else a
    ``llamafit.error/1`` document (with ``plan`` where a plan was made)."""
    if not _STATE["json"] or _STATE["printed"]:
        return
    err = error_doc(code, message, hint)
    if doc is not None and "schema" in doc and doc.get("schema") != ERROR_SCHEMA:
        print_json({**doc, "error": err})
    else:
        print_json({"schema": ERROR_SCHEMA, "error": err, **(doc or {})})


def failed(code: ExitCode, message: str, hint: str | None = None, plan: dict[str, Any] | None = None) -> int:
    """A failure a command returns rather than raises (a server that did not load): said on stderr, and
    under ``--json`` on stdout; the exit code."""
    error(message, hint)
    json_failure(int(code), message, hint, {"plan": plan} if plan is not None else None)
    return int(code)


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


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, stopping a command the way Ctrl-C does: what it started is stopped on the way out
    (``llamafit.server.children``), and it exits as a tool killed by that signal would (128 + N)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP raise ``Terminated`` in the main thread (``timeout N llamafit plan``, a closed
    terminal); ``run`` forwards them to the server while it serves (``Supervisor.run``)."""

    def raise_(signum: int, _frame: object) -> None:
        raise Terminated(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):  # not the main thread, or no such signal here
            signal.signal(sig, raise_)


def interrupted_code(e: KeyboardInterrupt) -> int:
    """130 for Ctrl-C, 128 + N for signal N."""
    return 128 + e.signum if isinstance(e, Terminated) else int(ExitCode.INTERRUPTED)


@contextmanager
def handled() -> Iterator[None]:
    """Translate core errors into one message and an exit code; never a raw traceback (LLAMAFIT_DEBUG=1
    shows it)."""
    try:
        yield
    except typer.Exit:
        raise
    except OutputClosed as e:
        raise typer.Exit(int(e.exit_code)) from None  # nobody reads stdout or needs telling
    except BrokenPipeError:  # a table printed through rich to a closed pipe
        _drop_closed_streams()
        raise typer.Exit(int(ExitCode.OUTPUT_CLOSED)) from None
    except LlamafitError as e:
        error(e.message, e.hint)
        if os.environ.get("LLAMAFIT_DEBUG"):
            traceback.print_exc()
        json_failure(int(e.exit_code), e.message, e.hint, e.doc)
        raise typer.Exit(int(e.exit_code)) from None
    except KeyboardInterrupt as e:
        code = interrupted_code(e)
        json_failure(code, "interrupted" if code == ExitCode.INTERRUPTED else f"terminated ({e})")
        raise typer.Exit(code) from None
    except Exception as e:
        if os.environ.get("LLAMAFIT_DEBUG"):
            traceback.print_exc()
        message = f"internal error: {type(e).__name__}: {e}"
        hint = "this is a bug in llamafit; run again with LLAMAFIT_DEBUG=1 and report the traceback"
        error(message, hint)
        json_failure(int(ExitCode.INTERNAL), message, hint)
        raise typer.Exit(int(ExitCode.INTERNAL)) from None
